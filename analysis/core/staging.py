"""Outputs that are whole or absent: a command writes into a staging folder beside its output folder and renames
it into place when everything is written.

- Until then the previous result stays as it was; an interrupted run (an exception, Ctrl-C, SIGTERM) removes its
  staging folder and leaves the previous result untouched. A staging folder left by a process that was killed
  outright (SIGKILL, power loss) is named after its process id and removed by the next run for the same output
  once that process is gone.
- An existing output folder is replaced only when LayerLens wrote it (it holds a ``run.json``, ``info.json``,
  ``duplication.json`` or ``metrics.json``) or it is empty: ``--out .`` or a folder of your own is refused, never
  overwritten.

Single files are whole or absent the same way (:func:`write_atomic`: a temporary file named after its process,
renamed into place; the temporaries of dead processes are removed by the next write in the same folder), and a
file written through a memory map has its blocks reserved on disk before it is mapped (:func:`open_npy`): a full
disk is then an :class:`NoSpace` error naming the folder and the size, where a write into an unreserved page of a
sparse file would kill the process with SIGBUS (issue 34 item 1).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from analysis.core.inputs import InputError

MARKERS = ("run.json", "info.json", "duplication.json", "metrics.json")  # files only a LayerLens output has
STAGING = ".staging-"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
ZEROS = 8 * 2**20  # the block written at a time where the file system cannot reserve (posix_fallocate unsupported)


class NoSpace(InputError):
    """The disk (or the user's quota) cannot hold a file LayerLens is writing."""


def no_space(directory: Path, needed: int | None = None, what: str | None = None) -> NoSpace:
    """The one-line error of a full disk under ``directory``: the megabytes the file (or ``what``, checked before
    it is written: :func:`check_room`) needed and those free."""
    message = f"not enough free disk for {what} under {directory}" if what else \
        f"no space left on device under {directory}"
    if needed:
        message += f"; {math.ceil(needed / 2**20):,} MB needed"
    with contextlib.suppress(OSError):
        message += f", {shutil.disk_usage(directory).free / 2**20:,.0f} MB free"
    return NoSpace(message + " (free some space, or point LAYERLENS_HOME at a larger disk, and run again)")


def check_room(directory: Path, needed: int, what: str) -> None:
    """A :class:`NoSpace` of one line, before any of it is written, when the disk under ``directory`` (or its
    nearest existing parent) has fewer than ``needed`` bytes free for ``what``."""
    at = Path(directory)
    while not at.exists() and at != at.parent:
        at = at.parent
    try:
        free = shutil.disk_usage(at).free
    except OSError:
        return
    if needed > free:
        raise no_space(at, needed, what)


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` is a full disk or quota (its errno, or the system's text in the message of a library that
    wraps it: pyarrow, faiss)."""
    return isinstance(exc, Exception) and (getattr(exc, "errno", None) in NO_SPACE or any(
        text in str(exc) for text in ("No space left on device", "Disk quota exceeded")))


def pid_alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return True


def clean_stale(out: Path) -> list[Path]:
    """Remove the staging folders of ``out`` whose process has ended; returns them."""
    removed = []
    for stage in out.parent.glob(f".{out.name}{STAGING}*"):
        pid = stage.name.rsplit(STAGING, 1)[1].split("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stage, ignore_errors=True)
            removed.append(stage)
    return removed


def check_replaceable(out: Path) -> None:
    """An :class:`InputError` unless ``out`` is absent, empty, or an output LayerLens wrote."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not any((out / m).is_file() for m in MARKERS):
        raise InputError(f"--out {out} holds files LayerLens did not write: choose a new or empty folder (an "
                         "output folder is replaced as a whole)")


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A fresh staging folder beside ``out``; on success it becomes ``out`` (replacing a previous result), on
    any failure it is removed and ``out`` is as it was."""
    out = Path(out).expanduser().absolute()
    check_replaceable(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(out)
        stage = out.parent / f".{out.name}{STAGING}{os.getpid()}-{secrets.token_hex(3)}"
        stage.mkdir()
    except (NotADirectoryError, FileExistsError):
        raise InputError(f"--out {out}: a part of the path is a file, not a folder") from None
    except PermissionError:
        raise InputError(f"--out {out}: no permission to write in {out.parent}") from None
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    old = out.parent / f".{out.name}{STAGING}{os.getpid()}-old-{secrets.token_hex(3)}"
    if out.exists():
        out.rename(old)  # the previous result is moved aside only now, and removed after the new one is in place
    stage.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _file_mode() -> int:
    """0666 less the process's umask (read from /proc where it can be, without changing it; else the usual 022)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o644


FILE_MODE = _file_mode()


def temporary(path: Path) -> Path:
    """A new empty temporary file beside ``path``, named ``.NAME.PID.XXXX.tmp`` (:func:`clean_stale_files`)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    os.close(fd)
    return Path(tmp)


def clean_stale_files(directory: Path) -> int:
    """Remove the temporary files (:func:`temporary`) of writers that are no longer running, e.g. a killed
    extraction's half shard; returns how many."""
    removed = 0
    for tmp in Path(directory).glob(".*.tmp"):
        pid = tmp.name.split(".")[-3] if tmp.name.count(".") >= 4 else ""
        if pid.isdigit() and not pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed += 1
    return removed


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` fills a temporary file beside ``path``, which is then renamed into place: ``path`` is whole
    or absent. On any failure the temporary file is removed; a full disk is :class:`NoSpace`."""
    path = Path(path)
    clean_stale_files(path.parent)
    tmp = None
    try:
        tmp = temporary(path)
        write(tmp)
        os.chmod(tmp, FILE_MODE)  # mkstemp's 0600 would stay on the file: it gets the mode open() would give
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if is_no_space(exc):
            raise no_space(path.parent) from None
        raise


def reserve(fd: int, size: int) -> None:
    """Allocate the first ``size`` bytes of the file ``fd`` on disk (an ``OSError`` with ``ENOSPC`` when they do
    not fit): ``os.posix_fallocate``, or where the platform or file system has none, zeros written over the part
    beyond the file's end."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except AttributeError:  # pragma: no cover - no posix_fallocate (macOS)
        pass
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
    at = os.fstat(fd).st_size
    zeros = bytes(min(ZEROS, max(size - at, 0)))
    while at < size:
        at += os.pwrite(fd, zeros[:size - at], at)
    if os.fstat(fd).st_size < size:  # pragma: no cover - a write that claimed success
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def save_npy(path: Path, array) -> None:
    """``array`` as a ``.npy`` file at exactly ``path`` (``np.save`` given a name adds ".npy" to a temporary one);
    pickles refused. For :func:`write_atomic`'s writer: ``write_atomic(path, lambda tmp: save_npy(tmp, a))``."""
    import numpy as np

    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)


def open_npy(path: Path, dtype, shape: tuple[int, ...]):
    """A new ``.npy`` file at ``path`` (replacing what is there) holding a ``shape`` array of ``dtype``, returned
    memory-mapped for writing (``numpy.memmap``, mode ``r+``) once every byte of it is reserved on disk
    (:func:`reserve`). Every file LayerLens writes through a memory map is made here: a write through a mapping
    into a block the file system cannot allocate is a SIGBUS that kills the process (the Streamlit server for
    every session), so the space is claimed first, and a full disk is a :class:`NoSpace` error, the file
    removed."""
    import numpy as np

    path = Path(path)
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    size = None
    try:
        with open(path, "wb") as f:
            try:
                np.lib.format.write_array_header_1_0(f, header)
            except ValueError:  # a header over 64 KiB
                f.seek(0)
                np.lib.format.write_array_header_2_0(f, header)
            size = f.tell() + dtype.itemsize * math.prod(shape)
            reserve(f.fileno(), size)
        return np.lib.format.open_memmap(path, mode="r+")
    except BaseException as exc:
        path.unlink(missing_ok=True)
        if is_no_space(exc):
            raise no_space(path.parent, size) from None
        raise


def npy_damage(path: Path, shape: tuple[int, ...] | None = None) -> str | None:
    """Why the ``.npy`` file at ``path`` cannot be read whole (None when it can): absent, not an ``.npy`` file,
    cut (shorter than its header says: a memory map of it fails with "mmap length is greater than file size"), or
    of another shape than ``shape``. Reads the header only."""
    import numpy as np

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))  # a link is never followed
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "not a plain file (a link, or unreadable)"
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return "not a plain file"
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            found, _fortran, dtype = read(f)
            expected = f.tell() + dtype.itemsize * math.prod(found)
            size = os.fstat(f.fileno()).st_size
    except (OSError, ValueError, EOFError):  # the message quotes none of the file's bytes
        return "not a whole .npy file"
    if size < expected:
        return f"cut ({size:,} of {expected:,} bytes)"
    if shape is not None and tuple(found) != tuple(shape):
        return f"an array of shape {tuple(found)} where {tuple(shape)} was written"
    return None
