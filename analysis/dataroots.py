"""Which server files the dashboard may read (the CLI reads any path its user gives).

A browser user picks data files from the **data roots**: ``LAYERLENS_DATA_DIRS`` (folders separated by ``:``),
by default the bundled data (``analysis/data``), and always ``LAYERLENS_HOME/uploads`` (where uploads are saved).
Names are resolved (symlinks too) and refused outside the roots, so neither ``../`` nor a symlink in an upload
folder leads elsewhere. A Hugging Face dataset typed in the browser must be a dataset name (``glue``,
``user/name``), never a local path or folder. Uploads are saved whole or not at all (:func:`save_upload`).
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from analysis.inputs import FORMATS, InputError
from analysis.store import layerlens_home

BUNDLED = Path(__file__).resolve().parent / "data"
MAX_LISTED = 2000  # files offered in a select box
HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def uploads() -> Path:
    """Where the dashboard saves uploaded files (a data root whatever ``LAYERLENS_DATA_DIRS`` says: a job
    submitted from the browser reads its upload from there)."""
    return layerlens_home() / "uploads"


TREEBANK_SUFFIXES = (".conllu.gz", ".conllu", ".txt.gz")  # uploads read by the structure and token analyses


def save_upload(data: bytes, name: str) -> Path:
    """Save an uploaded file's ``data`` under :func:`uploads`, named by its hash and ``name``'s (safe) suffix, a
    table's (``.csv``, ...) or one of :data:`TREEBANK_SUFFIXES`, whole or not at all: written to a hidden temporary
    file in the same folder (never offered: not a data suffix) and renamed into place. A failed write (a full disk)
    removes the temporary file and is an :class:`InputError`."""
    import hashlib

    from analysis.inputs import safe_suffix

    folder = uploads()
    suffix = next((s for s in TREEBANK_SUFFIXES if name.lower().endswith(s)), None) or safe_suffix(name)
    saved = folder / f"{hashlib.sha256(data).hexdigest()[:16]}{suffix}"
    temporary = folder / f".{saved.name}.{os.getpid()}.{threading.get_ident()}.part"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(data)
        os.replace(temporary, saved)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise InputError(f"cannot save the upload {name!r} on the server: {exc.strerror or exc}") from None
    return saved


def data_roots() -> list[Path]:
    given = os.environ.get("LAYERLENS_DATA_DIRS")
    roots = [Path(p).expanduser() for p in given.split(os.pathsep) if p] if given else [BUNDLED]
    return list(dict.fromkeys(r.resolve() for r in [*roots, uploads()]))


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


def server_files(roots: list[Path] | None = None) -> list[Path]:
    """The data files (.csv, .tsv, .jsonl, .txt) under the roots that resolve inside them, sorted, at most
    :data:`MAX_LISTED`."""
    roots = data_roots() if roots is None else roots
    found = []
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if path.suffix.lower().lstrip(".") in FORMATS and path.is_file():
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
    return list(dict.fromkeys(r.resolve() for r in [*roots, layerlens_home() / "exports", layerlens_home() / "jobs"]))


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
    """``analysis/data/demo_sentiment.csv`` shown as ``data/demo_sentiment.csv``: the root's name and the path
    under it."""
    for root in data_roots() if roots is None else roots:
        if Path(path).is_relative_to(root):
            return f"{root.name}/{Path(path).relative_to(root).as_posix()}"
    return Path(path).name
