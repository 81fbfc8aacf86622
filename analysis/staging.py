"""Outputs that are whole or absent: a command writes into a staging folder beside its output folder and renames
it into place when everything is written.

- Until then the previous result stays as it was; an interrupted run (an exception, Ctrl-C, SIGTERM) removes its
  staging folder and leaves the previous result untouched. A staging folder left by a process that was killed
  outright (SIGKILL, power loss) is named after its process id and removed by the next run for the same output
  once that process is gone.
- An existing output folder is replaced only when LayerLens wrote it (it holds a ``run.json``, ``info.json``,
  ``duplication.json`` or ``metrics.json``) or it is empty: ``--out .`` or a folder of your own is refused, never
  overwritten.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from analysis.inputs import InputError

MARKERS = ("run.json", "info.json", "duplication.json", "metrics.json")  # files only a LayerLens output has
STAGING = ".staging-"


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
