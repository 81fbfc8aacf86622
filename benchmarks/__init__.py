"""Benchmarks: each ``bench_*.py`` compares LayerLens with the naive way in one run (figures in
docs/benchmarks.md)."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LAYERLENS_SHARED_DATA", ROOT.parent / "shared" / "data"))


def data_file(shared: str, fixture: str) -> Path:
    """``shared`` under the shared datasets beside the checkout when present, else the small ``tests/data``
    cut ``fixture`` (a clone without ../shared still runs every benchmark)."""
    path = SHARED / shared
    return path if path.is_file() else ROOT / "tests" / "data" / fixture
