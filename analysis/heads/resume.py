"""The files a stopped heads run goes on from, checked before use (issue 43, item 10): :class:`ResumeFile` (what
every such file shares) and :class:`Checkpoint` (the statistics' and the parser's sums, one ``.npz``); the
importance scores (:class:`analysis.heads.importance.Scores`, JSON) are the other kind.

A resume file is an untrusted input, though the run wrote it: it can be cut by a kill or a full disk, damaged on
disk, left by another version, or replaced by hand. So, before anything in it is used:

- it is opened without following a link (``O_NOFOLLOW``), and must be a plain file;
- its size must be within what a file of this run can hold (the caller's ``max_bytes``), checked before reading;
- an ``.npz`` member's header (shape and dtype) must be the accumulator's own before its data is read (a header
  claiming a huge array would otherwise be allocated first), and the zip member's size must match;
- the values must be finite and within their ranges (sums and counts are never negative), and the count of
  batches done an integer within the run's plan.

A file that fails any check is removed with one warning, and the run starts afresh: a resumed run gives the
numbers of a run never stopped, or none of its numbers come from the file. A full disk costs the resume, never
the run.
"""

from __future__ import annotations

import logging
import os
import stat
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np
import torch

from analysis.core.inputs import InputError
from analysis.core.staging import write_atomic

CHECKPOINT_SECONDS = 30.0
COUNTER_ENTRIES = 1 << 20  # a counter's entries in a checkpoint (the parser's offsets: relations x offsets)
T = TypeVar("T")
log = logging.getLogger(__name__)


class Unusable(ValueError):
    """A resume file that fails a check (the message says which)."""


def require(condition: bool, why: str) -> None:
    if not condition:
        raise Unusable(why)


class ResumeFile:
    """The file a stopped run goes on from (``path``; None: nothing kept): read through :meth:`read` (checked; an
    unusable file removed), rewritten whole as the run goes, removed once the run completes."""

    def __init__(self, path: Path | None):
        self.path = path

    def read(self, parse: Callable[[BinaryIO], T], max_bytes: int) -> T | None:
        """``parse(file)`` of the resume file opened without following a link, when it is a plain file of at most
        ``max_bytes``; None when there is none, or when it fails a check or ``parse`` raises (it is removed)."""
        if self.path is None:
            return None
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a link; or unreadable
            self.discard("a link, never followed" if os.path.islink(self.path) else f"unreadable: {exc}")
            return None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            try:
                require(stat.S_ISREG(info.st_mode), "not a plain file")
                require(info.st_size <= max_bytes, f"{info.st_size:,} bytes, more than the {max_bytes:,} a file of "
                        "this run can hold")
                return parse(f)
            except Exception as exc:  # noqa: BLE001 - whatever reading an untrusted file raises, it is not used
                self.discard(str(exc) or type(exc).__name__)
                return None

    def discard(self, why: str) -> None:
        log.warning("removed the resume file %s (%s); starting afresh", self.path, why[:200])
        try:
            os.unlink(self.path)  # a link itself, never its target
        except OSError:
            pass

    def write(self, write: Callable[[Path], None]) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, write)  # a rename: a link in its place is replaced, its target untouched
        except (OSError, InputError) as exc:
            log.warning("could not save the checkpoint %s (%s)", self.path, exc)

    def remove(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _expected(parts: dict) -> dict[str, tuple[tuple, np.dtype] | None]:
    """member name -> (shape, dtype) of each accumulator's state, or None for a counter's entries (1-D int64)."""
    found: dict[str, tuple[tuple, np.dtype] | None] = {"batches": ((), None)}
    for name, part in parts.items():
        for attr in part.STATE:
            value, key = getattr(part, attr), f"{name}.{attr}"
            if isinstance(value, torch.Tensor):
                found[key] = (tuple(value.shape), np.dtype(str(value.dtype).removeprefix("torch.")))
            elif isinstance(value, np.ndarray):
                found[key] = (value.shape, value.dtype)
            elif isinstance(value, list):
                for x in ("slot", "key", "count"):
                    found[f"{key}.{x}"] = None
            else:
                found[key] = ((), None)  # an integer count
    return found


def _read_member(z: zipfile.ZipFile, name: str, want: tuple[tuple, np.dtype] | None) -> np.ndarray:
    """One ``.npy`` member, its header checked against ``want`` before its data is read."""
    info = z.getinfo(name + ".npy")
    with z.open(info) as m:
        version = np.lib.format.read_magic(m)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0(m) if version == (1, 0) else
                                 np.lib.format.read_array_header_2_0(m))
        header = m.tell() if m.seekable() else None
    require(not dtype.hasobject, f"{name}: objects")
    if want is None:
        require(len(shape) == 1 and dtype == np.int64 and shape[0] <= COUNTER_ENTRIES, f"{name}: shape {shape}")
    else:
        shape_wanted, dtype_wanted = want
        require(tuple(shape) == shape_wanted, f"{name}: shape {tuple(shape)}, the run's is {shape_wanted}")
        require(dtype.kind in "iu" if dtype_wanted is None else dtype == dtype_wanted, f"{name}: dtype {dtype}")
    size = int(np.prod(shape)) * dtype.itemsize
    require(header is None or info.file_size == header + size, f"{name}: {info.file_size:,} bytes")
    with z.open(info) as m:
        return np.lib.format.read_array(m, allow_pickle=False)


class Checkpoint(ResumeFile):
    """The sums of a run after its first ``batches`` batches (each accumulator's ``STATE``: arrays, tensors, counts,
    a list of Counters), in one ``.npz`` file (no pickle) written whole or not at all."""

    def __init__(self, path: Path | None, parts: dict):
        super().__init__(path)
        self.parts, self.saved = parts, time.monotonic()

    def load(self, plan: int) -> int:
        """The batches already done, at most ``plan`` (0 when there is no usable file); the accumulators filled
        from it. Every member is checked before any accumulator is touched."""
        expected = _expected(self.parts)
        max_bytes = (1 << 16) + sum(
            3 * 8 * COUNTER_ENTRIES if want is None else 1024 + int(np.prod(want[0])) * 8 for want in expected.values())

        def parse(f: BinaryIO) -> tuple[int, dict]:
            with zipfile.ZipFile(f) as z:
                names = {n.removesuffix(".npy") for n in z.namelist()}
                require(names == set(expected), "members " + ", ".join(sorted(names ^ set(expected))[:4]))
                found = {key: _read_member(z, key, want) for key, want in expected.items()}
            batches = found["batches"]
            require(1 <= int(batches) <= plan, f"{int(batches)} batches done of a plan of {plan}")
            for key, value in found.items():
                if value.dtype.kind == "f":
                    require(bool(np.isfinite(value).all()), f"{key}: not finite")
                require(bool((value >= 0).all()) or key.endswith(".key"), f"{key}: negative")
            for name, part in self.parts.items():
                for attr in part.STATE:
                    if isinstance(getattr(part, attr), list):
                        key = f"{name}.{attr}"
                        slots, counts = found[f"{key}.slot"], found[f"{key}.count"]
                        require(len(slots) == len(found[f"{key}.key"]) == len(counts), f"{key}: lengths")
                        require(bool((slots < len(getattr(part, attr))).all()), f"{key}: slot out of range")
            return int(batches), found

        read = self.read(parse, max_bytes)
        if read is None:
            return 0
        batches, found = read
        for name, part in self.parts.items():
            for attr in part.STATE:
                value, key = getattr(part, attr), f"{name}.{attr}"
                if isinstance(value, torch.Tensor):
                    value.copy_(torch.from_numpy(found[key]))
                elif isinstance(value, np.ndarray):
                    value[...] = found[key]
                elif isinstance(value, list):  # Counters, one per relation: their keys in insertion order
                    for counter in value:
                        counter.clear()
                    for r, k, c in zip(*(found[f"{key}.{x}"].tolist() for x in ("slot", "key", "count")),
                                       strict=True):
                        value[r][k] = c
                else:
                    setattr(part, attr, int(found[key]))
        return batches

    def save(self, batches: int, force: bool = False) -> None:
        if self.path is None or not (force or time.monotonic() - self.saved >= CHECKPOINT_SECONDS):
            return
        arrays = {"batches": np.array(batches)}
        for name, part in self.parts.items():
            for attr in part.STATE:
                value, key = getattr(part, attr), f"{name}.{attr}"
                if isinstance(value, torch.Tensor):
                    arrays[key] = value.numpy()
                elif isinstance(value, list):
                    items = [(r, k, c) for r, counter in enumerate(value) for k, c in counter.items()]
                    for i, x in enumerate(("slot", "key", "count")):
                        arrays[f"{key}.{x}"] = np.array([item[i] for item in items], dtype=np.int64)
                else:
                    arrays[key] = np.asarray(value)
        self.write(lambda tmp: _savez(tmp, arrays))
        self.saved = time.monotonic()


def _savez(path: Path, arrays: dict) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)
