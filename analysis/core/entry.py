"""A folder entry of the store: a finished run's files kept whole under ``LAYERLENS_HOME/cache`` (a series'
checkpoint, :mod:`analysis.tasks.series`), and the content digests that key such entries.

A folder entry is written in a staging folder beside its place, then its manifest ``entry.json`` (what the owner
records, and every file's relative ``path``, ``bytes`` and ``sha256``) is written last, the commit point, and the
folder is renamed into place. Reading it checks every file the manifest names: a plain file reached through plain
folders (never a link), of its size and its digest, and nothing else in the folder. An entry that is cut, edited,
missing a file or holding a link is not there (:meth:`FolderEntry.damage` says why): its owner computes it again,
with one warning, and the new entry replaces it. :meth:`FolderEntry.copy_to` copies the plain files the manifest
names and never follows a link: a link planted in the cache cannot bring an outside file into an output.

A key built from a path names a file, not what it holds: :func:`file_digest` and :func:`source_digest` give the
content of an input file and of a model folder (or the hub commit it resolves to), so an entry found is one
computed from the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

MANIFEST = "entry.json"
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def file_digest(path: Path | str) -> str:
    """SHA-256 of the file at ``path`` (what it holds, wherever it lies); remembered by (path, size, mtime) within a
    process as a model folder's files are (:func:`models.loading.directory_digest`), so a file read twice in one run is
    hashed once."""
    from models.loading import file_sha256_cached

    path = Path(path).resolve()
    st = path.stat()
    return file_sha256_cached(str(path), st.st_size, st.st_mtime_ns)


def source_digest(model: str, revision: str | None = None) -> str:
    """What identifies the weights ``model`` names before they are loaded: a local folder's (or the demo's)
    SHA-256 over its model files (:func:`models.loading.directory_digest`, the loaded model's own fingerprint); a
    hub model's commit when its revision is in the local cache, else its name and revision (a model not downloaded
    yet is keyed by what was asked for)."""
    from models.loading import directory_digest
    from models.spec import ModelSpec

    source = ModelSpec(model, revision=revision).source
    path = Path(source).expanduser()
    if path.is_dir():
        return "sha256:" + directory_digest(path)
    with contextlib.suppress(Exception):
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(source, "config.json", revision=revision)
        if isinstance(found, str):
            return f"{source}@{Path(found).parent.name}"  # .../snapshots/<commit>/config.json
    return f"{source}@{revision or 'main'}"


def _plain(path: Path, root: Path) -> bool:
    """``path`` is a plain file reached from ``root`` through plain folders (no link on the way)."""
    with contextlib.suppress(OSError):
        current = root
        for part in path.relative_to(root).parts[:-1]:
            current = current / part
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return False
        return stat.S_ISREG(os.lstat(path).st_mode)
    return False


def open_plain(path: Path):
    """``path`` opened for reading, never through a final link and never blocking (a FIFO is refused, not waited
    on); an ``OSError`` where it is not a plain file. The one such open of the core (a cache entry's files, a run's
    run.json)."""
    fd = os.open(path, os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise OSError(f"{path}: not a plain file")
    return f


class FolderEntry:
    """A folder of plain files committed by a manifest (the module's docstring)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    @property
    def manifest_path(self) -> Path:
        return self.directory / MANIFEST

    def damage(self) -> str | None:
        """Why the entry is not whole (None when it is): no manifest (absent, or never finished), a link, a file
        missing, cut, grown or edited, a file the manifest does not name."""
        root = self.directory
        try:
            if not stat.S_ISDIR(os.lstat(root).st_mode):
                return "not a folder"
            with open_plain(self.manifest_path) as f:
                manifest = json.loads(f.read(1 << 20))
            files = manifest["files"]
            named = {str(Path(entry["path"])) for entry in files}
        except FileNotFoundError:
            return "no manifest (absent, or never finished)"
        except (OSError, ValueError, KeyError, TypeError):
            return "its manifest is damaged or a link"
        for entry in files:
            relative = Path(str(entry.get("path", "")))
            if relative.is_absolute() or ".." in relative.parts or not relative.parts:
                return f"its manifest names {relative}, outside the entry"
            path = root / relative
            if not path.exists() and not path.is_symlink():
                return f"{relative} is missing"
            if not _plain(path, root):
                return f"{relative} is a link or not a plain file"
            if os.lstat(path).st_size != entry.get("bytes"):
                return f"{relative} is cut or grown ({os.lstat(path).st_size:,} of {entry.get('bytes')} bytes)"
            if _digest_plain(path) != entry.get("sha256"):
                return f"{relative} was edited (its SHA-256 differs from the one written)"
        for path in root.rglob("*"):
            relative = str(path.relative_to(root))
            if relative != MANIFEST and relative not in named and not (path.is_dir() and not path.is_symlink()):
                return f"{relative} is not one of its files"
        return None

    def files(self) -> list[Path]:
        with open_plain(self.manifest_path) as f:
            return [Path(entry["path"]) for entry in json.loads(f.read(1 << 20))["files"]]

    def copy_to(self, target: Path) -> None:
        """The entry's files (those its manifest names, plain files only, no link followed) into ``target``."""
        for relative in self.files():
            source = self.directory / relative
            if not _plain(source, self.directory):
                raise OSError(f"{source}: not a plain file")
            destination = Path(target) / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            with open_plain(source) as f, open(destination, "wb") as out:
                shutil.copyfileobj(f, out)

    @contextlib.contextmanager
    def writing(self, facts: dict):
        """Yields a staging folder to fill; once the block ends, its plain files are committed by the manifest and
        the folder replaces the entry (a damaged one included). Where the entry cannot be replaced (another
        process, a read-only cache), the staging folder is left for this run to read: the work is never lost."""
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        staging = self.directory.with_name(f"{self.directory.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        staging.mkdir()
        try:
            yield staging
            files = sorted(p for p in staging.rglob("*") if p.is_file() or p.is_symlink())
            if any(not _plain(p, staging) for p in files):  # a task wrote a link: never committed
                raise OSError(f"{staging}: the run wrote a link")
            manifest = {"facts": facts, "files": [{"path": str(p.relative_to(staging)), "bytes": p.stat().st_size,
                                                   "sha256": _digest_plain(p)} for p in files]}
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        try:
            if os.path.lexists(self.directory):
                if self.directory.is_symlink() or not self.directory.is_dir():
                    self.directory.unlink()
                else:
                    shutil.rmtree(self.directory)
            os.rename(staging, self.directory)
        except OSError as exc:
            log.warning("could not keep %s in the cache (%s); this run reads it from %s", self.directory, exc,
                        staging)
            self.directory = staging


def _digest_plain(path: Path) -> str:
    digest = hashlib.sha256()
    with open_plain(path) as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()
