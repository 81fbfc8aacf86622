"""The series' long table and its per-checkpoint cache.

``series.csv`` has one row per (checkpoint, layer, metric): ``checkpoint`` (its label), ``step``, ``layer``,
``metric``, ``value``, ``interval`` (the 95% interval as text, ``[low, high]``, blank where the analysis gives
none) and the same interval as numbers, ``interval_low`` and ``interval_high``.

Each checkpoint's analysis is kept whole in the cache (``LAYERLENS_HOME/cache/series/<key>/``), keyed by the
analysis, its options and the checkpoint's weights (:func:`weights_id`: the files' names, sizes and modification
times for a local folder; the name and revision on the hub), so a series that stopped resumes where it stopped and
a series that grew computes only its new checkpoints."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd

from analysis.core.home import cache_dir
from analysis.core.store import key_of
from analysis.series.checkpoints import Checkpoint

COLUMNS = ["checkpoint", "step", "layer", "metric", "value", "interval", "interval_low", "interval_high"]
DONE = "done.json"  # written last into a checkpoint's cache folder: its analysis is complete


def weights_id(point: Checkpoint) -> str:
    """What identifies ``point``'s weights without reading them."""
    from models.spec import ModelSpec

    path = Path(ModelSpec(point.model, revision=point.revision).source).expanduser()  # "demo": its folder
    if path.is_dir():
        files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir() if p.is_file())
        return key_of(path=str(path.resolve()), files=files)
    return f"{point.model}@{point.revision or 'main'}"


def cached(analysis: str, options: dict, point: Checkpoint) -> Path:
    """The cache folder of ``analysis`` with ``options`` at ``point`` (complete when it holds :data:`DONE`)."""
    key = key_of(kind="series", analysis=analysis, options=options, weights=weights_id(point),
                 head_from=point.head_from)
    return cache_dir() / "series" / key


def interval_text(low, high) -> str:
    if low is None or high is None or (isinstance(low, float) and math.isnan(low)) \
            or (isinstance(high, float) and math.isnan(high)):
        return ""
    return f"[{low:.6g}, {high:.6g}]"


def rows(point: Checkpoint, frame: pd.DataFrame, metric: str, value: str, low: str | None = None,
         high: str | None = None) -> list[dict]:
    """Long rows of one metric from a per-layer table (a ``layer`` column and the named value/interval columns)."""
    out = []
    for _, r in frame.iterrows():
        lo = float(r[low]) if low and pd.notna(r[low]) else math.nan
        hi = float(r[high]) if high and pd.notna(r[high]) else math.nan
        out.append({"checkpoint": point.label, "step": point.step, "layer": int(r["layer"]), "metric": metric,
                    "value": float(r[value]) if pd.notna(r[value]) else math.nan, "interval": interval_text(lo, hi),
                    "interval_low": lo, "interval_high": hi})
    return out


def long_table(parts: list[list[dict]]) -> pd.DataFrame:
    return pd.DataFrame([row for part in parts for row in part], columns=COLUMNS)


def copy_into(source: Path, target: Path) -> None:
    """A checkpoint's cached files into the output folder (its per-checkpoint views)."""
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != DONE:
            shutil.copy2(path, target / path.name)
