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
