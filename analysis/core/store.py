"""Arrays cached on disk under ``LAYERLENS_HOME`` (default ``~/.layerlens``), keyed by what produced them.

A key is the SHA-256 of a JSON description (model fingerprint, data hash, options), so equal inputs find
the same file and anything that changes the numbers changes the key. Writes go to a temporary file that is
renamed into place, so a crash or a second process never leaves a half-written entry; an unreadable entry
is dropped and recomputed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from analysis.core.home import cache_dir

log = logging.getLogger(__name__)


def key_of(**parts) -> str:
    """A stable key for ``parts`` (anything JSON can write)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:40]


class ArrayStore:
    """``get``/``put`` of numpy arrays in ``root/kind/key.npy``."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else cache_dir()

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / f"{key}.npy"

    def get(self, kind: str, key: str, mmap: bool = False) -> np.ndarray | None:
        """The array stored under ``key`` (None when absent or unreadable); ``mmap``: memory-mapped read-only,
        so a caller reading one slice at a time (a layer of word vectors) holds only that slice in memory."""
        path = self.path(kind, key)
        if not path.is_file():
            return None
        try:
            return np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
        except (OSError, ValueError) as exc:
            log.warning("dropping unreadable cache entry %s (%s)", path, exc)
            path.unlink(missing_ok=True)
            return None

    def put(self, kind: str, key: str, array: np.ndarray) -> None:
        from analysis.core.staging import NoSpace, save_npy, write_atomic

        path = self.path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, lambda tmp: save_npy(tmp, array))
        except (OSError, NoSpace) as exc:  # a full or read-only disk costs a recomputation, never the result
            log.warning("could not cache %s (%s)", path, exc)

    @contextlib.contextmanager
    def create(self, kind: str, key: str, shape: tuple[int, ...], dtype=np.float32) -> Iterator[np.ndarray]:
        """A new entry written in place: yields a writable array (memory-mapped on a temporary file beside the
        entry, its blocks reserved first: :func:`analysis.core.staging.open_npy`) to fill, then flushes it and renames
        it into place; on an exception the temporary file is removed and nothing is stored. A writer fills an
        array larger than memory a slice at a time. Where the disk refuses (full, read-only), the array is an
        ordinary one in memory and is not stored, when it fits in half the available memory; otherwise the
        disk's error is raised (a full disk: one line naming the folder and the size)."""
        from analysis.core.staging import NoSpace, open_npy, temporary

        path = self.path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = temporary(path)
            array = open_npy(tmp, dtype, shape)
        except (OSError, NoSpace) as exc:
            from models.cache import free_bytes

            if np.dtype(dtype).itemsize * math.prod(shape) > free_bytes("cpu") // 2:
                raise
            log.warning("could not cache %s (%s); keeping it in memory", path, exc)
            yield np.empty(shape, dtype)
            return
        try:
            yield array
            array.flush()
            del array
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
