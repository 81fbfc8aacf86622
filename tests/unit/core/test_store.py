"""The on-disk array cache (analysis.core.store): entries are whole or absent."""

import os

import numpy as np
import pytest

from analysis.core.store import ArrayStore


def test_an_entry_created_in_place_is_stored_whole(tmp_path):
    store = ArrayStore(tmp_path)
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    with store.create("kind", "key", data.shape) as out:
        assert isinstance(out, np.memmap)
        for i in range(2):  # filled a slice at a time
            out[i] = data[i]
        assert store.get("kind", "key") is None  # not visible before it is complete
    got = store.get("kind", "key", mmap=True)
    assert isinstance(got, np.memmap) and got.dtype == np.float32
    np.testing.assert_array_equal(got, data)
    assert os.listdir(tmp_path / "kind") == ["key.npy"]


def test_an_interrupted_entry_leaves_nothing(tmp_path):
    store = ArrayStore(tmp_path)
    with pytest.raises(KeyboardInterrupt), store.create("kind", "key", (4, 4)) as out:
        out[0] = 1
        raise KeyboardInterrupt
    assert store.get("kind", "key") is None and os.listdir(tmp_path / "kind") == []


def test_a_refusing_disk_gives_an_array_in_memory(tmp_path):
    (tmp_path / "kind").write_text("a file where the folder should be")
    store = ArrayStore(tmp_path)
    with store.create("kind", "key", (3,)) as out:
        assert not isinstance(out, np.memmap)
        out[:] = 7
    assert store.get("kind", "key") is None


# Layered vector sets (issue 35: one store of vectors): a manifest naming (layers, rows, hidden) shards.

def test_a_set_created_in_place_is_absent_until_its_manifest_is_written(tmp_path):
    from analysis.core.store import MANIFEST

    store = ArrayStore(tmp_path)
    data = np.random.default_rng(0).normal(size=(3, 5, 4)).astype(np.float32)
    with store.create_set("kind", "key", data.shape, each_row="a planted row") as out:
        assert isinstance(out, np.memmap)
        out[:] = data
        assert store.get_set("kind", "key") is None  # the shard is not renamed yet, nor the manifest written
    vs = store.get_set("kind", "key")
    assert (vs.layers, vs.rows, vs.hidden, vs.manifest["each_row"]) == ([0, 1, 2], 5, 4, "a planted row")
    assert vs.manifest["shards"] == [{"file": "shard_00000.npy", "first_row": 0, "rows": 5, "dtype": "float32"}]
    assert isinstance(vs.array(), np.memmap) and not isinstance(vs.array(mmap=False), np.memmap)
    np.testing.assert_array_equal(vs.array(), data)
    assert sorted(os.listdir(tmp_path / "kind" / "key")) == [MANIFEST, "shard_00000.npy"]
    (tmp_path / "kind" / "key" / MANIFEST).unlink()  # a crash between the shard and the manifest
    assert store.get_set("kind", "key") is None


def test_an_interrupted_set_leaves_no_shard_and_no_manifest(tmp_path):
    store = ArrayStore(tmp_path)
    with pytest.raises(KeyboardInterrupt), store.create_set("kind", "key", (2, 3, 4)) as out:
        out[0] = 1
        raise KeyboardInterrupt
    assert store.get_set("kind", "key") is None and os.listdir(tmp_path / "kind" / "key") == []


def test_a_damaged_set_is_dropped_and_a_cut_manifest_is_named(tmp_path):
    from analysis.core.inputs import InputError
    from analysis.core.store import VectorSet

    store = ArrayStore(tmp_path)
    store.put_set("kind", "key", np.ones((2, 3, 4), np.float32))
    (tmp_path / "kind" / "key" / "manifest.json").write_text('{"layers": [0, 1], "hid')
    with pytest.raises(InputError, match="not a whole manifest"):
        VectorSet.open(tmp_path / "kind" / "key")
    assert store.get_set("kind", "key") is None and not (tmp_path / "kind" / "key").exists()
    store.put_set("kind", "key", np.ones((2, 3, 4), np.float32))
    (tmp_path / "kind" / "key" / "shard_00000.npy").write_bytes(b"garbage")
    assert store.get_set("kind", "key") is None and not (tmp_path / "kind" / "key").exists()


def test_an_array_entry_from_before_sets_is_moved_into_its_set(tmp_path):
    store = ArrayStore(tmp_path)
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    store.put("kind", "key", data)  # the layout written before this version
    vs = store.get_set("kind", "key")
    np.testing.assert_array_equal(vs.array(), data)
    assert not (tmp_path / "kind" / "key.npy").exists()
    assert store.get_set("kind", "key").manifest == vs.manifest  # its manifest was written
    (tmp_path / "kind" / "bad.npy").write_bytes(b"garbage")  # a damaged old entry is removed, never read
    assert store.get_set("kind", "bad") is None and not (tmp_path / "kind" / "bad.npy").exists()


def test_a_set_of_several_shards_reads_like_the_array_it_holds(tmp_path):
    from analysis.core.staging import save_npy
    from analysis.core.store import VectorSet, commit

    data = np.random.default_rng(1).normal(size=(3, 10, 4)).astype(np.float32)
    shards = [{"file": f"s{i}.npy", "first_row": a, "rows": b - a}
              for i, (a, b) in enumerate([(0, 4), (4, 7), (7, 10)])]
    for s in shards:
        save_npy(tmp_path / s["file"], data[:, s["first_row"]:s["first_row"] + s["rows"]])
    commit(tmp_path, {"layers": [2, 5, 7], "rows": 10, "hidden": 4, "shards": shards})
    vs = VectorSet.open(tmp_path)
    np.testing.assert_array_equal(vs.array(), data)
    np.testing.assert_array_equal(np.concatenate([b for _, b in vs.layer_blocks(5)]), data[1])
    assert [first for first, _ in vs.layer_blocks(7)] == [0, 4, 7]
    rows = np.array([9, 0, 4, 3, 3, 7])
    np.testing.assert_array_equal(vs.rows_at(7, rows), data[2][rows])
    from analysis.core.inputs import InputError

    with pytest.raises(InputError, match="layer 1 was not extracted"):
        vs.rows_at(1, rows)
    (tmp_path / "s1.npy").unlink()
    assert vs.missing() == [1]
    with pytest.raises(InputError, match=r"1 of 3 shards missing"):
        VectorSet.open(tmp_path)


def test_an_old_file_in_a_read_only_folder_is_read_with_its_manifest_in_memory(tmp_path):
    from analysis.core.store import adopt

    data = np.ones((2, 3, 4), np.float16)
    np.save(tmp_path / "val_cls.npy", data)
    tmp_path.chmod(0o555)
    try:
        vs = adopt(tmp_path, tmp_path / "val_cls.npy", each_row="a validation row")
    finally:
        tmp_path.chmod(0o755)
    assert vs.manifest["shards"][0]["file"] == "val_cls.npy" and vs.manifest["each_row"] == "a validation row"
    assert vs.rows == 3 and vs.array().dtype == np.float16
    if os.geteuid() != 0:  # root writes into a read-only folder
        assert not (tmp_path / "manifest.json").exists()
