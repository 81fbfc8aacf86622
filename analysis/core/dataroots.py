"""Which server files the dashboard may read (the CLI reads any path its user gives).

A browser user picks data files from the **data roots**: always the bundled data (``analysis/data``: the demo
sets and the treebank sample the pages start from), the folders ``LAYERLENS_DATA_DIRS`` adds (separated by ``:``),
and always ``LAYERLENS_HOME/uploads`` (where uploads are saved). Each picker offers only the files its page reads
(:data:`TEXT_SUFFIXES`, :data:`LABELLED_SUFFIXES`, :data:`TREEBANK_SUFFIXES`). Names are resolved (symlinks too)
and refused outside the roots, so neither ``../`` nor a symlink in an upload folder leads elsewhere. A Hugging Face
dataset typed in the browser must be a dataset name (``glue``, ``user/name``), never a local path or folder.
Uploads are saved whole or not at all (:func:`save_upload`), within a cap on the folder's size
(``LAYERLENS_UPLOADS_MAX_MB``), and can be listed and deleted (:func:`list_uploads`, :func:`delete_upload`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path

from analysis.core.home import exports_dir, jobs_dir, uploads_dir
from analysis.core.inputs import CONLLU_SUFFIXES, FORMATS, InputError
from analysis.core.textfiles import setting

BUNDLED = Path(__file__).resolve().parents[1] / "data"
MAX_LISTED = 2000  # files offered in a select box
HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
# what each picker offers: the files its page can read (analysis.core.inputs.read_file: any of them gzipped too)
TEXT_SUFFIXES = tuple(f".{f}{gz}" for f in FORMATS for gz in ("", ".gz"))  # texts: .txt one per line, or a column
LABELLED_SUFFIXES = tuple(s for s in TEXT_SUFFIXES if not s.startswith(".txt"))  # labels need named columns
TREEBANK_SUFFIXES = CONLLU_SUFFIXES
# The uploads folder's size: 1 GiB holds 20 uploads at the pages' 50 MB cap (.streamlit/config.toml), and keeps a
# browser from filling the server's disk one upload at a time.
UPLOADS_MAX_MB = 1024
MB = 1 << 20


def uploads() -> Path:
    """Where the dashboard saves uploaded files (a data root whatever ``LAYERLENS_DATA_DIRS`` says: a job
    submitted from the browser reads its upload from there)."""
    return uploads_dir()


def uploads_cap() -> int:
    """Bytes the uploads folder may hold: ``LAYERLENS_UPLOADS_MAX_MB`` (default :data:`UPLOADS_MAX_MB`)."""
    return setting("LAYERLENS_UPLOADS_MAX_MB", UPLOADS_MAX_MB) * MB


@dataclasses.dataclass(frozen=True)
class Upload:
    name: str
    size: int  # bytes
    modified: float  # seconds since the epoch
    path: Path


def _files(folder: Path) -> list[os.DirEntry]:
    """The regular files directly in ``folder`` (symlinks and folders are neither counted nor listed)."""
    try:
        with os.scandir(folder) as entries:
            return [e for e in entries if e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def uploads_used() -> int:
    """Bytes the files of the uploads folder take, hidden ones (a save being written, or left by a killed one)
    included."""
    return sum(e.stat(follow_symlinks=False).st_size for e in _files(uploads()))


def list_uploads() -> list[Upload]:
    """The saved uploads (not the hidden temporary files), newest first."""
    found = [Upload(e.name, st.st_size, st.st_mtime, Path(e.path)) for e in _files(uploads())
             if not e.name.startswith(".") for st in (e.stat(follow_symlinks=False),)]
    return sorted(found, key=lambda u: (-u.modified, u.name))


def delete_upload(name: str) -> None:
    """Delete the saved upload ``name``: a file of the uploads folder itself, never a path, a symlink, a hidden file
    or anything outside it (an :class:`InputError`)."""
    folder = uploads()
    if name in {u.name for u in list_uploads()}:
        (folder / name).unlink(missing_ok=True)
        return
    raise InputError(f"'{name}' is not an upload (a file of the uploads folder {folder})")


@contextmanager
def _locked(folder: Path):
    """The uploads folder's lock (a file lock: every thread and process that saves takes it)."""
    import fcntl

    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def megabytes(n: int) -> str:
    return f"{n / MB:,.2f} MB"


UPLOAD_SUFFIXES = (".conllu.gz", ".conllu")  # besides the text formats (analysis.core.inputs.safe_suffix)


def save_upload(data: bytes, name: str) -> Path:
    """Save an uploaded file's ``data`` under :func:`uploads`, named by its hash and ``name``'s (safe) suffix, a
    text format's (``.csv``, ``.txt.gz``, ...) or a treebank's, whole or not at all: written to a hidden temporary
    file in the same folder (never offered: not a data suffix) and renamed into place, under the folder's lock. The
    same content again is the file already there. An upload that would take the folder over :func:`uploads_cap`
    is refused, saying the cap, the use and how to make room; a failed write (a full disk) removes the temporary
    file. Both are :class:`InputError` s. Temporary files found under the lock were left by a killed save (a save
    holds the lock while it writes) and are removed."""
    import hashlib

    from analysis.core.inputs import safe_suffix

    folder = uploads()
    suffix = next((s for s in UPLOAD_SUFFIXES if name.lower().endswith(s)), None) or safe_suffix(name)
    saved = folder / f"{hashlib.sha256(data).hexdigest()[:16]}{suffix}"
    temporary = folder / f".{saved.name}.{os.getpid()}.{threading.get_ident()}.part"
    cap = uploads_cap()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder):
            for entry in _files(folder):
                if entry.name.startswith(".") and entry.name.endswith(".part"):
                    os.unlink(entry.path)
            if saved.is_file() and not saved.is_symlink() and saved.stat().st_size == len(data):
                return saved
            used = uploads_used()
            if used + len(data) > cap:
                count = len(list_uploads())
                raise InputError(f"cannot save the upload {name!r} ({megabytes(len(data))}): the uploads folder holds "
                                 f"{megabytes(used)} in {count} file{'' if count == 1 else 's'}, and its cap of "
                                 f"{cap // MB:,} MB (LAYERLENS_UPLOADS_MAX_MB) leaves no room: delete uploads "
                                 "under 'Uploaded files' on this page, or ask whoever runs the dashboard to raise "
                                 "the cap")
            temporary.write_bytes(data)
            os.replace(temporary, saved)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise InputError(f"cannot save the upload {name!r} on the server: {exc.strerror or exc}") from None
    return saved


def data_roots() -> list[Path]:
    """The bundled data, the folders ``LAYERLENS_DATA_DIRS`` adds, the uploads folder (resolved, each once)."""
    given = os.environ.get("LAYERLENS_DATA_DIRS") or ""
    roots = [Path(p).expanduser() for p in given.split(os.pathsep) if p]
    return list(dict.fromkeys(r.resolve() for r in [BUNDLED, *roots, uploads()]))


def within_roots(path: Path | str, roots: list[Path] | None = None) -> Path:
    """``path`` resolved (symlinks followed), or an :class:`InputError` when it is not a file under a data root.
    The message names the roots, never the file's content."""
    roots = data_roots() if roots is None else roots
    resolved = Path(path).expanduser().resolve()
    if not any(resolved.is_relative_to(root) for root in roots):
        raise InputError(f"'{path}' is not under the dashboard's data folders ({', '.join(map(str, roots))}); "
                         "set LAYERLENS_DATA_DIRS on the server to offer more")
    if not resolved.is_file():
        raise InputError(f"'{path}' is not a file")
    return resolved


def server_files(suffixes: tuple[str, ...] = TEXT_SUFFIXES, roots: list[Path] | None = None) -> list[Path]:
    """The files under the roots whose names end in one of ``suffixes`` (the types the page reads: texts by default)
    and that resolve inside the roots, root by root (the bundled data first), sorted, at most :data:`MAX_LISTED`.
    A LayerLens run's own files (a folder with a ``run.json``, and below it: ``layers.csv``, ``predictions.csv``) are
    results, not data, and are not listed."""
    roots = data_roots() if roots is None else roots
    found, runs = [], {}

    def in_a_run(folder: Path, root: Path) -> bool:
        if folder not in runs:
            runs[folder] = (folder / "run.json").is_file() or (folder != root and folder.parent != folder
                                                                and in_a_run(folder.parent, root))
        return runs[folder]

    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if path.name.lower().endswith(suffixes) and path.is_file() and not in_a_run(path.parent, root):
                try:
                    found.append(within_roots(path, roots))
                except InputError:
                    continue  # a symlink leading out of the roots
                if len(found) >= MAX_LISTED:
                    return found
    return list(dict.fromkeys(found))


def hub_dataset_name(name: str) -> str:
    """``name`` when it is a Hugging Face dataset name (``glue``, ``stanfordnlp/imdb``); an :class:`InputError` when
    it is empty or could be a local path (the browser may not read server folders this way)."""
    name = name.strip()
    if not HUB_NAME.match(name) or ".." in name or Path(name).expanduser().exists():
        raise InputError(f"'{name}' is not a Hugging Face dataset name (a name such as glue or user/dataset; "
                         "paths and folders are not read from the browser)")
    return name


def browser_source(source: str) -> str:
    """A data source chosen in the browser (a job's split, a lens's texts): ``demo``, ``hf:NAME[/CONFIG]:SPLIT``
    with a dataset *name*, or a file under the data roots (returned resolved). Anything else is an
    :class:`InputError`."""
    if source == "demo":
        return source
    if source.startswith("hf:"):
        hub_dataset_name(source[3:].partition(":")[0].partition("/")[0])
        return source
    return str(within_roots(source))


def model_roots() -> list[Path]:
    """The folders a model typed in the browser may come from: ``LAYERLENS_MODEL_DIRS`` (``:``-separated), by
    default the demo model's folder and the Hugging Face cache; always the dashboard's own outputs
    (``LAYERLENS_HOME/exports``, duplication exports, and ``LAYERLENS_HOME/jobs``, fine-tuned checkpoints)."""
    given = os.environ.get("LAYERLENS_MODEL_DIRS")
    if given:
        roots = [Path(p).expanduser() for p in given.split(os.pathsep) if p]
    else:
        from huggingface_hub.constants import HF_HUB_CACHE

        from models.spec import DEMO_DIR

        roots = [DEMO_DIR, Path(HF_HUB_CACHE).expanduser()]
    return list(dict.fromkeys(r.resolve() for r in [*roots, exports_dir(), jobs_dir()]))


def browser_model(name: str) -> str:
    """``name`` when the browser may load it: ``demo``, a hub id (``org/name`` or ``name``, not an existing
    path), a folder under :func:`model_roots` (symlinks resolved), or ``random:`` one of those; an
    :class:`InputError` otherwise, the same whether the folder is outside the roots or does not exist, so the
    message never tells what the server holds. The CLI loads what its user names."""
    from models.spec import DEMO_NAME, RANDOM_PREFIX

    text = name.strip().removeprefix(RANDOM_PREFIX)
    path = Path(text).expanduser()
    if text == DEMO_NAME or (HUB_NAME.match(text) and ".." not in text and not path.exists()):
        return name
    resolved, roots = path.resolve(), model_roots()
    if not (resolved.is_dir() and any(resolved.is_relative_to(root) for root in roots)):
        raise InputError(f"'{name}' is not a model folder under the dashboard's model folders "
                         f"({', '.join(map(str, roots))}) nor a hub id; set LAYERLENS_MODEL_DIRS on the server to "
                         "offer more")
    return name


def server_file_picker_label(path: Path, roots: list[Path] | None = None) -> str:
    """``analysis/data/demo_sentiment.csv`` shown as ``bundled/demo_sentiment.csv``: the root's name (``bundled``
    for the bundled data) and the path under it."""
    for root in data_roots() if roots is None else roots:
        if Path(path).is_relative_to(root):
            return f"{'bundled' if root == BUNDLED.resolve() else root.name}/{Path(path).relative_to(root).as_posix()}"
    return Path(path).name
