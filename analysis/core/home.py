"""``LAYERLENS_HOME`` (default ``~/.layerlens``) and every folder LayerLens keeps under it, each named once here:

- ``cache/``: what is recomputed when missing: the store's entries keyed by what produced them
  (:mod:`analysis.core.store`; the layered vector sets of sentence vectors, word vectors and token vectors,
  ``cache/token_vectors/<key>/``, :mod:`analysis.tokens.vectors`) and
  ``cache/embedding_atlas/`` (the Embedding Atlas servers' logs and their own cache, :mod:`ui.embedding_atlas`);
- ``jobs/``: the job database and each job's folder (:mod:`jobs.store`);
- ``uploads/``: files uploaded through the browser (:mod:`analysis.core.dataroots`);
- ``lenses/``: tuned lenses a user keeps (:func:`analysis.probe.lens.search_roots`);
- ``exports/``: duplicated models exported from the pages.
"""

from __future__ import annotations

import os
from pathlib import Path


def layerlens_home() -> Path:
    return Path(os.environ.get("LAYERLENS_HOME", "~/.layerlens")).expanduser()


def cache_dir() -> Path:
    return layerlens_home() / "cache"


def jobs_dir() -> Path:
    return layerlens_home() / "jobs"


def uploads_dir() -> Path:
    return layerlens_home() / "uploads"


def lenses_dir() -> Path:
    return layerlens_home() / "lenses"


def exports_dir() -> Path:
    return layerlens_home() / "exports"
