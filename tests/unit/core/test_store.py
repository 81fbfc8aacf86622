"""The on-disk array cache (analysis.core.store): entries are whole or absent."""

import json
import os

import numpy as np
import pytest

from analysis.core.inputs import InputError
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
    (shard,) = vs.manifest["shards"]
    assert {k: shard[k] for k in ("file", "first_row", "rows", "dtype")} == {
        "file": "shard_00000.npy", "first_row": 0, "rows": 5, "dtype": "float32"}
    assert shard["size"] == (vs.directory / "shard_00000.npy").stat().st_size and len(shard["sha256"]) == 64
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


# --- issue 43, item 11: a manifest names shards inside its own folder only, with their sizes and checksums --------

def manifest_of(directory):
    return json.loads((directory / "manifest.json").read_text())


def rewrite(directory, change):
    manifest = manifest_of(directory)
    change(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["../outside.npy", "/etc/passwd", "sub/shard.npy", "..", ".", "", "a\\b.npy"])
def test_a_shard_outside_its_folder_is_refused_without_quoting_it(tmp_path, name):
    from analysis.core.store import VectorSet

    store = ArrayStore(tmp_path)
    store.put_set("kind", "key", np.ones((2, 3, 4), np.float32))
    directory = tmp_path / "kind" / "key"
    (tmp_path / "kind" / "outside.npy").write_bytes((directory / "shard_00000.npy").read_bytes())
    rewrite(directory, lambda m: m["shards"][0].update(file=name))
    with pytest.raises(InputError, match="not a file name inside") as err:
        VectorSet.open(directory)
    assert "root:" not in str(err.value)
    assert store.get_set("kind", "key") is None  # dropped


def test_a_linked_shard_is_refused(tmp_path):
    from analysis.core.store import VectorSet

    store = ArrayStore(tmp_path)
    store.put_set("kind", "key", np.ones((2, 3, 4), np.float32))
    directory = tmp_path / "kind" / "key"
    shard = directory / "shard_00000.npy"
    target = tmp_path / "elsewhere.npy"
    shard.rename(target)
    shard.symlink_to(target)
    with pytest.raises(InputError, match="not a plain file"):
        VectorSet.open(directory)


def test_messages_quote_no_file_content(tmp_path):
    from analysis.core.store import VectorSet

    store = ArrayStore(tmp_path)
    store.put_set("kind", "key", np.ones((2, 3, 4), np.float32))
    directory = tmp_path / "kind" / "key"
    (directory / "shard_00000.npy").write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(InputError) as err:
        VectorSet.open(directory)
    assert "root" not in str(err.value).replace(str(tmp_path), "")


def test_shards_carry_their_size_and_checksum(tmp_path):
    import hashlib

    from analysis.core.store import VectorSet, verify_set

    store = ArrayStore(tmp_path)
    array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    store.put_set("kind", "key", array)
    directory = tmp_path / "kind" / "key"
    shard = directory / "shard_00000.npy"
    (entry,) = manifest_of(directory)["shards"]
    assert entry["size"] == shard.stat().st_size
    assert entry["sha256"] == hashlib.sha256(shard.read_bytes()).hexdigest()
    assert verify_set(directory) is None
    # same size, one value changed: the size check passes, the checksum does not (read whole, or verified)
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    vs = VectorSet.open(directory)
    with pytest.raises(InputError, match="checksum"):
        vs.array(mmap=False)
    assert "checksum" in verify_set(directory)
    # another size: refused on open
    shard.write_bytes(bytes(data) + b"\0" * 8)
    with pytest.raises(InputError, match="bytes"):
        VectorSet.open(directory)


@pytest.mark.parametrize("change", ["first_row", "rows", "total"])
def test_rows_the_shards_do_not_hold_are_refused(tmp_path, change):
    from analysis.core.store import VectorSet

    directory = tmp_path / "set"
    directory.mkdir()
    for i in range(2):
        np.save(directory / f"shard_{i:05d}.npy", np.ones((2, 3, 4), np.float32))
    manifest = {"layers": [0, 1], "hidden": 4, "rows": 6,
                "shards": [{"file": "shard_00000.npy", "first_row": 0, "rows": 3},
                           {"file": "shard_00001.npy", "first_row": 3, "rows": 3}]}
    if change == "first_row":
        manifest["shards"][1]["first_row"] = 2
    elif change == "rows":
        manifest["shards"][1]["rows"] = 4
    else:
        manifest["rows"] = 9
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError) as err:
        VectorSet.open(directory)
    assert "\n" not in str(err.value) and ("row" in str(err.value) or "shape" in str(err.value))


def test_cache_verify_names_a_damaged_set(tmp_path, monkeypatch, capsys):
    from cli.main import main

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    store = ArrayStore()
    store.put_set("kind", "good", np.ones((2, 3, 4), np.float32))
    store.put_set("kind", "bad", np.ones((2, 3, 4), np.float32))
    shard = store.set_dir("kind", "bad") / "shard_00000.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    assert main(["cache", "verify"]) == 1
    out = capsys.readouterr()
    assert "1 of 2 vector sets" in out.out and "bad" in out.err and "checksum" in out.err and "good" not in out.err
    assert main(["cache", "verify", "--remove"]) == 0
    assert not store.set_dir("kind", "bad").exists() and store.get_set("kind", "good") is not None
