"""The series' long table and its per-checkpoint cache.

``series.csv`` has one row per (checkpoint, layer, metric): ``checkpoint`` (its label), ``step``, ``layer``,
``metric``, ``value``, ``interval`` (the 95% interval as text, ``[low, high]``, blank where the analysis gives
none) and the same interval as numbers, ``interval_low`` and ``interval_high``.

Each checkpoint's analysis is kept whole in the cache (``LAYERLENS_HOME/cache/series/<key>/``, a folder entry of
the store: :class:`analysis.core.entry.FolderEntry`), keyed by the analysis, its options, the **content** of its
input files and the checkpoint's weights (:func:`analysis.core.entry.source_digest`: a local folder's SHA-256 over
its model files, a hub model's commit), so a series that stopped resumes where it stopped, a series that grew
computes only its new checkpoints, and the same command on another file (or the same file edited) computes again.
An entry that is cut, edited, missing a file or holding a link is computed again with one warning."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from analysis.core.entry import FolderEntry, file_digest, source_digest
from analysis.core.home import cache_dir
from analysis.core.store import key_of
from analysis.series.checkpoints import Checkpoint

COLUMNS = ["checkpoint", "step", "layer", "metric", "value", "interval", "interval_low", "interval_high"]


def weights_id(point: Checkpoint) -> dict:
    """What identifies ``point``'s weights, and the MLM head's it is read through, without loading them."""
    return {"weights": source_digest(point.model, point.revision),
            "head": source_digest(point.head_from) if point.head_from else None}


def cached(analysis: str, options: dict, inputs: list[Path | None], point: Checkpoint) -> FolderEntry:
    """The cache entry of ``analysis`` with ``options`` on the files ``inputs`` (their content) at ``point``."""
    key = key_of(kind="series", analysis=analysis, options=options, weights=weights_id(point),
                 inputs=[file_digest(p) if p is not None else None for p in inputs])
    return FolderEntry(cache_dir() / "series" / key)


def interval_text(low, high) -> str:
    if low is None or high is None or (isinstance(low, float) and math.isnan(low)) \
            or (isinstance(high, float) and math.isnan(high)):
        return ""
    return f"[{low:.6g}, {high:.6g}]"


def long_table(parts: list[list[dict]]) -> pd.DataFrame:
    return pd.DataFrame([row for part in parts for row in part], columns=COLUMNS)
