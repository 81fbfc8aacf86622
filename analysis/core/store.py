"""THE store of vectors on disk: entries under ``LAYERLENS_HOME/cache`` keyed by what produced them, of two shapes.

- An **array**: ``root/kind/key.npy`` (:meth:`ArrayStore.get`, :meth:`ArrayStore.put`, :meth:`ArrayStore.create`).
- A **layered vector set** (:class:`VectorSet`): a folder holding ``manifest.json`` (``layers``: hidden-state
  indices, Hugging Face's numbering; ``rows``; ``hidden``; ``shards``: each shard's ``file``, ``first_row`` and
  ``rows``; and what the set's owner adds: its row metadata, its source) and the shards it names, each a
  ``(layers, rows, hidden)`` ``.npy`` file read memory-mapped, a layer at a time. Sentence vectors
  (``cache/representations/<key>/``), word vectors (``cache/word_vectors/<key>/``), token vectors
  (``cache/token_vectors/<key>/``, :mod:`analysis.tokens.vectors`, many shards filled one by one and resumed) and a
  fine-tuning job's per-epoch vectors (``epochs/<e>/``, shard ``val_cls.npy``, row metadata ``val_ids.json``)
  are all such sets; what is derived from a set (maps, indexes, atlas tables) lives under its folder.
- A **derived entry** (:class:`Derived`, :meth:`VectorSet.derived`): a file computed from a set, ``<set>/<part>/<name>``
  (a token map under ``maps/``, a neighbour index or a layer's moments under ``index/``), with its manifest
  ``<stem>.json`` beside it (what it holds and how it was made, its ``file`` and ``bytes``), written after the file and
  its companions: the commit point, as a set's manifest is.

A key is the SHA-256 of a JSON description (model fingerprint, data hash, options), so equal inputs find
the same entry and anything that changes the numbers changes the key. Every file is written to a temporary file
that is renamed into place (:func:`analysis.core.staging.write_atomic`), and a set's manifest is written after its
shards (the commit point), so a crash or a second process never leaves a half-written entry: a set without a
manifest is absent; an unreadable entry is dropped and recomputed. An array entry written before sets existed
(``root/kind/key.npy`` of a kind now kept as sets) is moved into its set's folder when first read
(:meth:`ArrayStore.get_set`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np

from analysis.core.home import cache_dir
from analysis.core.inputs import InputError

log = logging.getLogger(__name__)


def verify_set(directory: Path | str) -> str | None:
    """What is wrong with the set in ``directory`` (its manifest, a shard's size, shape or checksum); None when
    every shard is whole and holds the bytes written (``layerlens cache verify``)."""
    try:
        vs = VectorSet.open(directory)
    except InputError as exc:
        return str(exc)
    for i, s in enumerate(vs.manifest["shards"]):
        if why := vs.check_sum(i):
            return f"{Path(directory) / s['file']}: {why}"
    return None


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

    def create(self, kind: str, key: str, shape: tuple[int, ...], dtype=np.float32):
        """A new entry written in place: yields a writable array (memory-mapped on a temporary file beside the
        entry, its blocks reserved first: :func:`analysis.core.staging.open_npy`) to fill, then flushes it and renames
        it into place; on an exception the temporary file is removed and nothing is stored. A writer fills an
        array larger than memory a slice at a time. Where the disk refuses (full, read-only), the array is an
        ordinary one in memory and is not stored, when it fits in half the available memory; otherwise the
        disk's error is raised (a full disk: one line naming the folder and the size)."""
        return filled(self.path(kind, key), shape, dtype)

    def set_dir(self, kind: str, key: str) -> Path:
        return self.root / kind / key

    def get_set(self, kind: str, key: str) -> VectorSet | None:
        """The layered vector set stored under ``key`` (None when absent, unfinished or damaged; a damaged one is
        removed, an unfinished one left to its writer). An array entry of the same key written before sets existed
        is moved into the set's folder."""
        directory = self.set_dir(kind, key)
        legacy = self.path(kind, key)
        if legacy.is_file() and not (directory / MANIFEST).is_file():
            return adopt(directory, legacy)
        if not (directory / MANIFEST).is_file():  # absent, or still being written (its manifest comes last)
            return None
        try:
            return VectorSet.open(directory)
        except InputError as exc:
            if directory.is_dir():
                log.warning("dropping unreadable cache entry %s (%s)", directory, exc)
                import shutil

                shutil.rmtree(directory, ignore_errors=True)
            return None

    def put_set(self, kind: str, key: str, array: np.ndarray, **meta) -> None:
        """``array`` ``(layers, rows, hidden)`` stored as a one-shard set (``meta``: its row metadata, source);
        a full or read-only disk costs a recomputation, never the result."""
        from analysis.core.staging import NoSpace

        try:
            write_set(self.set_dir(kind, key), array, **meta)
        except (OSError, NoSpace) as exc:
            log.warning("could not cache %s (%s)", self.set_dir(kind, key), exc)

    @contextlib.contextmanager
    def create_set(self, kind: str, key: str, shape: tuple[int, int, int], dtype=np.float32,
                   **meta) -> Iterator[np.ndarray]:
        """A new one-shard set written in place, as :meth:`create` writes an array (memory-mapped, the disk's
        refusal kept in memory when it fits), its manifest written once the shard is whole."""
        directory = self.set_dir(kind, key)
        with filled(directory / SHARD.format(0), shape, dtype) as out:
            yield out
        if isinstance(out, np.memmap):
            commit(directory, set_manifest(shape, dtype, **meta))


MANIFEST = "manifest.json"
SHARD = "shard_{:05d}.npy"


@contextlib.contextmanager
def filled(path: Path, shape: tuple[int, ...], dtype=np.float32) -> Iterator[np.ndarray]:
    """:meth:`ArrayStore.create`'s writer, for any ``.npy`` path (an array entry, a set's shard)."""
    from analysis.core.staging import NoSpace, open_npy, temporary

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


def set_manifest(shape: tuple[int, int, int], dtype=np.float32, layers: list[int] | None = None,
                 shard_file: str = SHARD.format(0), **meta) -> dict:
    """The manifest of a one-shard set of ``shape`` ``(layers, rows, hidden)`` (``layers``: the hidden states
    it holds, default all of them from 0)."""
    n_layers, rows, hidden = (int(x) for x in shape)
    return {**meta, "layers": list(range(n_layers)) if layers is None else [int(x) for x in layers],
            "rows": rows, "hidden": hidden,
            "shards": [{"file": shard_file, "first_row": 0, "rows": rows, "dtype": str(np.dtype(dtype))}]}


SHARD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a plain file name: no folder, no "..", no link path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def commit(directory: Path, manifest: dict) -> None:
    """Write a set's manifest (whole or absent), the commit point: after every shard it names is whole. Each
    shard's ``size`` and ``sha256`` are recorded (checked on open, and when the shard is read whole)."""
    from analysis.core.staging import write_atomic

    for s in manifest["shards"]:
        path = Path(directory) / s["file"]
        s.pop("size", None)  # always last: the same manifest is written byte for byte
        s.pop("sha256", None)
        if path.is_file():  # a set filled shard by shard (token vectors) commits its manifest before its shards
            s["size"], s["sha256"] = path.stat().st_size, file_sha256(path)
    write_atomic(Path(directory) / MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=1)))


def write_set(directory: Path, array: np.ndarray, shard_file: str = SHARD.format(0), **meta) -> VectorSet:
    """``array`` ``(layers, rows, hidden)`` (kept in its dtype) written as a one-shard set in ``directory``."""
    from analysis.core.staging import save_npy, write_atomic

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / shard_file, lambda p: save_npy(p, array))
    manifest = set_manifest(array.shape, array.dtype, shard_file=shard_file, **meta)
    commit(directory, manifest)
    return VectorSet(directory, manifest)


def adopt(directory: Path, npy: Path, **meta) -> VectorSet | None:
    """A set from one ``(layers, rows, hidden)`` ``.npy`` file written before sets existed: an array entry of the
    store (moved into ``directory``) or a job's ``epochs/<e>/val_cls.npy`` (left where it is: ``npy`` inside
    ``directory``). Its manifest is written (held in memory where the folder is read-only). None when the file is
    damaged (an array entry of the store is then removed)."""
    from analysis.core.staging import npy_damage

    directory, npy = Path(directory), Path(npy)
    if why := npy_damage(npy):
        log.warning("dropping unreadable cache entry %s (%s)", npy, why)
        if npy.parent != directory:
            npy.unlink(missing_ok=True)
        return None
    found = np.load(npy, mmap_mode="r")
    if found.ndim != 3:
        return None
    if npy.parent != directory:
        directory.mkdir(parents=True, exist_ok=True)
        os.replace(npy, directory / SHARD.format(0))
        npy = directory / SHARD.format(0)
    manifest = set_manifest(found.shape, found.dtype, shard_file=npy.name, **meta)
    try:
        commit(directory, manifest)
    except (OSError, InputError) as exc:  # a read-only or full folder: the manifest lives in memory
        log.info("could not write %s (%s)", directory / MANIFEST, exc)
    return VectorSet(directory, manifest)


class Derived:
    """An entry derived from a vector set (the module's docstring): absent, cut, damaged or without its manifest, it
    is not there (:meth:`read` is None) and its owner makes it again; :meth:`write` writes it whole or not at all."""

    def __init__(self, directory: Path, part: str, name: str):
        self.path = Path(directory) / part / name

    @property
    def manifest(self) -> Path:
        return self.path.with_suffix(".json")

    def read(self, shape: tuple[int, ...] | None = None, companions: dict | None = None) -> dict | None:
        """The manifest of the whole entry, or None. ``shape``: the ``.npy`` file's rows and columns;
        ``companions``: further ``.npy`` files of the entry and their shapes (a map's fitted rows)."""
        from analysis.core.staging import npy_damage

        try:
            meta = json.loads(self.manifest.read_text())
            size = self.path.stat().st_size
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("bytes", size) != size:  # "bytes": every entry since issue 45
            return None
        checks = {**({self.path: shape} if self.path.suffix == ".npy" else {}), **(companions or {})}
        return None if any(npy_damage(path, want) for path, want in checks.items()) else meta

    def write(self, fill, meta, companions: dict | None = None) -> dict:
        """``fill(tmp)`` writes the file, each of ``companions`` (path -> its fill) after it, then the manifest:
        ``meta`` (a dict, or a function giving it once the file is written: its timings) with the file's name and
        size. Returns the manifest."""
        from analysis.core.staging import write_atomic

        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, fill)
        for path, write in (companions or {}).items():
            write_atomic(path, write)
        meta = {**(meta() if callable(meta) else meta), "file": self.path.name, "bytes": self.path.stat().st_size}
        write_atomic(self.manifest, lambda p: p.write_text(json.dumps(meta, indent=1)))
        return meta

    def update(self, **facts) -> None:
        """Add ``facts`` to the manifest (a measurement made later: an index's recall)."""
        from analysis.core.staging import write_atomic

        meta = {**json.loads(self.manifest.read_text()), **facts}
        write_atomic(self.manifest, lambda p: p.write_text(json.dumps(meta, indent=1)))


@dataclasses.dataclass
class VectorSet:
    """A layered vector set (the module's docstring), read memory-mapped: :meth:`layer_blocks` yields each
    shard's ``(rows, hidden)`` block of one hidden state without reading the others."""

    directory: Path
    manifest: dict

    REQUIRED: ClassVar[tuple[str, ...]] = ("layers", "hidden", "rows", "shards")
    RERUN: ClassVar[str] = "it is computed again when next asked for"
    RESUME: ClassVar[str] = "it is computed again when next asked for"
    ROW: ClassVar[str] = "row"  # what a row is, and what the set is, in messages
    NOUN: ClassVar[str] = "set"

    @classmethod
    def read_manifest(cls, path: Path) -> dict:
        try:
            manifest = json.loads(Path(path).read_text())
            for key in cls.REQUIRED:
                manifest[key]  # noqa: B018 - the parts every reader needs
            for s in manifest["shards"]:
                s["file"], s["rows"], s["first_row"]  # noqa: B018
            total = int(manifest["rows"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise InputError(f"{path}: not a whole manifest (cut or damaged JSON); {cls.RERUN}") from None
        end = 0
        for i, s in enumerate(manifest["shards"]):
            if not (isinstance(s["file"], str) and SHARD_NAME.fullmatch(s["file"])):
                raise InputError(f"{path}: shard {i} is not a file name inside the set's folder; {cls.RERUN}")
            if not (isinstance(s["first_row"], int) and isinstance(s["rows"], int) and s["rows"] >= 0):
                raise InputError(f"{path}: shard {i}'s rows are not counts; {cls.RERUN}")
            if s["first_row"] != end:
                raise InputError(f"{path}: shard {i} starts at row {s['first_row']:,} where the shards before it end "
                                 f"at row {end:,}; {cls.RERUN}")
            end += s["rows"]
        if end != total:
            raise InputError(f"{path}: the shards hold {end:,} rows where the set has {total:,}; {cls.RERUN}")
        return manifest

    @classmethod
    def open(cls, directory: Path | str) -> VectorSet:
        """The set in ``directory``, its manifest and every shard checked: an :class:`InputError` naming the
        first part that is missing or damaged."""
        directory = Path(directory)
        if not (directory / MANIFEST).is_file():
            raise InputError(f"{directory}: not a vector set (no {MANIFEST})")
        vs = cls(directory, cls.read_manifest(directory / MANIFEST))
        vs.check_parts()
        shards = vs.manifest["shards"]
        absent = [i for i, s in enumerate(shards) if not (directory / s["file"]).is_file()]
        if absent:
            raise InputError(f"{directory}: the extraction is incomplete ({len(absent)} of {len(shards)} shards "
                             f"missing); {cls.RESUME}")
        for i in range(len(shards)):
            if why := vs.shard_damage(i):
                raise InputError(f"{directory / shards[i]['file']}: {why}; {cls.RERUN}")
        return vs

    def check_parts(self) -> None:
        """What a kind of set checks beyond its shards on :meth:`open` (its row metadata)."""

    def check_layer(self, layer: int) -> None:
        """What a kind of set refuses of a layer before it is read (token vectors: non-finite values)."""

    @property
    def layers(self) -> list[int]:
        return list(self.manifest["layers"])

    @property
    def rows(self) -> int:
        return int(self.manifest["rows"])

    @property
    def hidden(self) -> int:
        return int(self.manifest["hidden"])

    def shard_damage(self, i: int) -> str | None:
        """Why shard ``i``'s file is not whole (absent, cut, another shape); None when it is."""
        from analysis.core.staging import npy_damage

        s = self.manifest["shards"][i]
        path = self.directory / s["file"]
        if why := npy_damage(path, (len(self.layers), int(s["rows"]), self.hidden)):
            return why
        if "size" in s and (size := path.stat().st_size) != s["size"]:  # manifests before issue 43 have none
            return f"{size:,} bytes where {int(s['size']):,} were written"
        return None

    def check_sum(self, i: int) -> str | None:
        """Why shard ``i``'s bytes are not those written (its SHA-256 differs); None when they are, or when its
        manifest records no checksum (written before issue 43)."""
        s = self.manifest["shards"][i]
        if "sha256" in s and file_sha256(self.directory / s["file"]) != s["sha256"]:
            return "its checksum differs from the one written (the file was changed or damaged)"
        return None

    def missing(self) -> list[int]:
        """The shards to (re)compute: absent, cut or damaged."""
        return [i for i in range(len(self.manifest["shards"])) if self.shard_damage(i)]

    def layer_slot(self, layer: int) -> int:
        if layer not in self.layers:
            raise InputError(f"layer {layer} was not extracted; this extraction has hidden states "
                             f"{', '.join(map(str, self.layers))}")
        return self.layers.index(layer)

    def shard(self, i: int, mmap: bool = True) -> np.ndarray:
        """Shard ``i``: memory-mapped, or read whole (then its checksum is checked)."""
        if not mmap and (why := self.check_sum(i)):
            raise InputError(f"{self.directory / self.manifest['shards'][i]['file']}: {why}; {self.RERUN}")
        return np.load(self.directory / self.manifest["shards"][i]["file"], mmap_mode="r" if mmap else None,
                       allow_pickle=False)

    def array(self, mmap: bool = True) -> np.ndarray:
        """Every layer, ``(layers, rows, hidden)``: a one-shard set's file (memory-mapped with ``mmap``), the
        shards of a larger one joined in memory."""
        n = len(self.manifest["shards"])
        return self.shard(0, mmap) if n == 1 else np.concatenate([self.shard(i, mmap) for i in range(n)], axis=1)

    def layer_blocks(self, layer: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(first_row, block)`` per shard: hidden state ``layer``'s ``(rows, hidden)`` block, memory-mapped."""
        slot = self.layer_slot(layer)
        self.check_layer(layer)
        for i, s in enumerate(self.manifest["shards"]):
            yield int(s["first_row"]), self.shard(i)[slot]

    def rows_at(self, layer: int, rows: np.ndarray) -> np.ndarray:
        """float32 ``(len(rows), hidden)``: the vectors of ``rows`` (any order) at hidden state ``layer``."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.rows):
            raise InputError(f"{self.ROW} out of range: this {self.NOUN} has rows 0..{self.rows - 1}")
        slot = self.layer_slot(layer)
        self.check_layer(layer)
        firsts = np.array([s["first_row"] for s in self.manifest["shards"]] + [self.rows])
        where = np.searchsorted(firsts, rows, side="right") - 1
        out = np.empty((len(rows), self.hidden), np.float32)
        for i in np.unique(where):
            sel = np.flatnonzero(where == i)
            local = rows[sel] - firsts[i]
            order = np.argsort(local)
            out[sel[order]] = self.shard(int(i))[slot][local[order]]
        return out

    def disk_bytes(self) -> int:
        return sum((self.directory / s["file"]).stat().st_size for s in self.manifest["shards"])

    def derived(self, part: str, name: str) -> Derived:
        """The entry ``name`` derived from this set, under its folder's ``part`` (``maps``, ``index``)."""
        return Derived(self.directory, part, name)
