"""Read and validate texts (and text pairs) from what a user pastes or uploads.

Formats: ``.txt`` (one text per line, blank lines skipped), ``.csv``, ``.tsv`` (read with quoting off: the
shared datasets contain bare quotes), ``.jsonl`` (one JSON object per line). Every problem raises
:class:`InputError` with a message for the user; nothing in a file is ever executed.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

FORMATS = ("txt", "csv", "tsv", "jsonl")


class InputError(ValueError):
    """The input cannot be used; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class TextInputs:
    """Texts to analyse, optionally paired (``pairs[i]`` goes with ``texts[i]``), and what was left out."""

    texts: tuple[str, ...]
    pairs: tuple[str, ...] | None = None
    skipped_empty: int = 0  # rows whose text was empty
    dropped_over_limit: int = 0  # rows beyond ``limit``

    def __post_init__(self):
        if self.pairs is not None and len(self.pairs) != len(self.texts):
            raise ValueError("texts and pairs differ in length")

    def __len__(self) -> int:
        return len(self.texts)

    def notes(self) -> list[str]:
        """What a user should be told about rows that were left out."""
        out = []
        if self.skipped_empty:
            out.append(f"{self.skipped_empty} empty row(s) skipped")
        if self.dropped_over_limit:
            out.append(f"only the first {len(self.texts)} rows used; {self.dropped_over_limit} more left out "
                       "(row limit)")
        return out


def decode(data: bytes, name: str = "input") -> str:
    """UTF-8 text from bytes, with a clear error for binary or other encodings."""
    if b"\x00" in data[:8192]:
        raise InputError(f"{name} looks like a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name} is not UTF-8 text (bad byte at position {exc.start}); save it as UTF-8") from None


def format_of(name: str) -> str:
    suffix = Path(name).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise InputError(f"cannot read '{name}': use one of .{', .'.join(FORMATS)}")
    return suffix


def _rows(text: str, fmt: str, name: str) -> tuple[list[dict], list[str]]:
    """Records and column names of a tabular text."""
    if fmt == "jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{name}, line {n}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise InputError(f"{name}, line {n}: expected a JSON object per line")
            rows.append(row)
        columns = list(dict.fromkeys(k for row in rows for k in row))
        return rows, columns
    delimiter = "\t" if fmt == "tsv" else ","
    quoting = csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(text), delimiter=delimiter, quoting=quoting)
    try:
        table = [r for r in reader if r]
    except csv.Error as exc:
        raise InputError(f"{name}: not a valid {fmt.upper()} file ({exc})") from None
    if not table:
        return [], []
    header = [h.strip() for h in table[0]]
    return [dict(zip(header, r, strict=False)) for r in table[1:]], header


def columns_of(data: bytes, name: str) -> list[str]:
    """Column names of a tabular file (empty for .txt), so a page can offer them."""
    fmt = format_of(name)
    if fmt == "txt":
        return []
    return _rows(decode(data, name), fmt, name)[1]


def _clean(value) -> str:
    return "" if value is None else " ".join(str(value).split())


def parse(data: bytes | str, name: str = "input.txt", column: str = "text", pair_column: str | None = None,
          limit: int | None = None) -> TextInputs:
    """Texts from file contents. ``name`` gives the format by its suffix; ``limit`` caps the number of rows."""
    fmt = format_of(name)
    text = data if isinstance(data, str) else decode(data, name)
    if not text.strip():
        raise InputError(f"{name} is empty")
    if fmt == "txt":
        if pair_column:
            raise InputError("text pairs need a .csv, .tsv or .jsonl file with two columns")
        values = [line.strip() for line in text.splitlines()]
        texts, pairs = [v for v in values if v], None
        skipped = 0  # blank lines in a .txt file are separators, not rows
    else:
        rows, columns = _rows(text, fmt, name)
        for wanted in filter(None, (column, pair_column)):
            if wanted not in columns:
                found = ", ".join(columns[:12]) or "none"
                raise InputError(f"{name} has no column '{wanted}' (columns found: {found})")
        kept = [(_clean(r.get(column)), _clean(r.get(pair_column)) if pair_column else "") for r in rows]
        usable = [(t, p) for t, p in kept if t and (p or not pair_column)]
        skipped = len(kept) - len(usable)
        texts = [t for t, _ in usable]
        pairs = [p for _, p in usable] if pair_column else None
    if not texts:
        raise InputError(f"{name} has no usable rows: every text is empty")
    dropped = 0
    if limit is not None and len(texts) > limit:
        dropped = len(texts) - limit
        texts = texts[:limit]
        pairs = pairs[:limit] if pairs is not None else None
    return TextInputs(tuple(texts), tuple(pairs) if pairs is not None else None, skipped, dropped)


def read_file(path: Path | str, column: str = "text", pair_column: str | None = None,
              limit: int | None = None) -> TextInputs:
    """:func:`parse` for a file on disk."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no such file: {path}")
    return parse(path.read_bytes(), path.name, column, pair_column, limit)


def from_text_area(text: str, limit: int | None = None) -> TextInputs:
    """Texts typed into a text area: one per line."""
    if not text.strip():
        raise InputError("no text given: type or paste at least one sentence")
    return parse(text, "typed.txt", limit=limit)
