"""CSV files and downloads that a spreadsheet opens as data, never as formulas (OWASP's advice on CSV injection).

A text cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a leading ``'``, which
spreadsheets show as text and do not evaluate. Numbers (``-1``, ``+0.5``, also as text labels) and single
characters (a ``-`` token) cannot be formulas and are written as they are. Parquet and JSON outputs keep the exact
text; so do the in-memory results.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def neutralise(value):
    """``value`` with a leading ``'`` when it is text a spreadsheet would read as a formula."""
    if isinstance(value, str) and len(value) > 1 and value.startswith(FORMULA_START) and not _is_number(value):
        return "'" + value
    return value


def safe(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose text cells (and text index) are :func:`neutralise`\\ d."""
    import pandas as pd

    out = frame.copy()
    for column in out.columns:
        if out[column].dtype == object or pd.api.types.is_string_dtype(out[column]):
            out[column] = out[column].map(neutralise)
    if out.index.dtype == object:
        out.index = out.index.map(neutralise)
    return out


def to_csv(frame: pd.DataFrame, path: Path | None = None, index: bool = False) -> str | None:
    """``frame.to_csv`` after :func:`safe`: written to ``path``, or returned as text (for a download)."""
    return safe(frame).to_csv(path, index=index)
