"""Read and validate texts (and text pairs) from what a user pastes or uploads.

Formats: ``.txt`` (one text per line, blank lines skipped), ``.csv``, ``.tsv`` (read with quoting off: the
shared datasets contain bare quotes), ``.jsonl`` (one JSON object per line). Every problem raises
:class:`InputError` with a message for the user; nothing in a file is ever executed.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import random
from collections.abc import Callable
from functools import partial
from pathlib import Path

FORMATS = ("txt", "csv", "tsv", "jsonl")
DEMO_LABELLED = Path(__file__).resolve().parent / "data" / "demo_sentiment.csv"  # the bundled labelled set
# the bundled set on which layers differ: Conneau et al. 2018's bigram shift on UD English-EWT sentences (CC BY-SA
# 4.0), written by scripts/make_demo_wordorder.py
DEMO_WORDORDER = Path(__file__).resolve().parent / "data" / "demo_wordorder.csv"


class InputError(ValueError):
    """The input cannot be used; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class TextInputs:
    """Texts to analyse, optionally paired (``pairs[i]`` goes with ``texts[i]``), and what was left out."""

    texts: tuple[str, ...]
    pairs: tuple[str, ...] | None = None
    skipped_empty: int = 0  # rows whose text (or pair, or label, when asked for) was empty
    dropped_over_limit: int = 0  # rows beyond ``limit``
    labels: tuple[str, ...] | None = None  # class labels as text ("1" and 1 are the same label)
    row_ids: tuple[int, ...] | None = None  # each text's 0-based data row in the source (default: 0..n-1)

    def __post_init__(self):
        for name in ("pairs", "labels", "row_ids"):
            other = getattr(self, name)
            if other is not None and len(other) != len(self.texts):
                raise ValueError(f"texts and {name} differ in length")

    @property
    def ids(self) -> tuple[int, ...]:
        return self.row_ids if self.row_ids is not None else tuple(range(len(self.texts)))

    def subset(self, positions: list[int]) -> TextInputs:
        """The rows at ``positions`` (in that order), keeping their source row ids."""
        def pick(values):
            return None if values is None else tuple(values[i] for i in positions)
        return dataclasses.replace(self, texts=pick(self.texts), pairs=pick(self.pairs), labels=pick(self.labels),
                                   row_ids=pick(self.ids))

    def sample(self, n: int, seed: int = 0) -> TextInputs:
        """A random sample of ``n`` rows (all rows if there are fewer), in source order."""
        if n >= len(self.texts):
            return self
        return self.subset(sorted(random.Random(seed).sample(range(len(self.texts)), n)))

    def content_hash(self) -> str:
        """SHA-256 of the texts, pairs and labels: equal for equal data, whatever file it came from."""
        digest = hashlib.sha256()
        for part in (self.texts, self.pairs or (), self.labels or ()):
            digest.update(json.dumps(part, ensure_ascii=False).encode())
            digest.update(b"\x00")
        return digest.hexdigest()

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


def safe_suffix(name: str) -> str:
    """The file type of an uploaded ``name`` as a suffix (``.csv``), for storing it under a name of our own:
    a user's file name (``../../x.csv``) never becomes part of a path."""
    return "." + format_of(Path(name.replace("\\", "/")).name)


def format_of(name: str) -> str:
    suffix = Path(name).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise InputError(f"cannot read '{name}': use one of .{', .'.join(FORMATS)}")
    return suffix


def _rows(text: str, fmt: str, name: str) -> tuple[list[dict], list[str], list[int]]:
    """Records, column names and each record's first line in a tabular text. A column named twice, a key
    repeated in a JSON object and a CSV quote that is never closed are errors naming the line and column."""
    if fmt == "jsonl":
        rows, lines = [], []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line, object_pairs_hook=_unique_keys)
            except json.JSONDecodeError as exc:
                raise InputError(f"{name}, line {n}: not valid JSON ({exc.msg})") from None
            except _RepeatedKey as exc:
                raise InputError(f"{name}, line {n}, column {exc.args[0]}: the object names this key twice") from None
            if not isinstance(row, dict):
                raise InputError(f"{name}, line {n}: expected a JSON object per line")
            rows.append(row)
            lines.append(n)
        columns = list(dict.fromkeys(k for row in rows for k in row))
        return rows, columns, lines
    delimiter = "\t" if fmt == "tsv" else ","
    quoting = csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL
    physical = list(io.StringIO(text, newline=""))  # the lines the csv module counts (\n, \r\n or \r)
    reader = csv.reader(physical, delimiter=delimiter, quoting=quoting)
    header, rows, lines = None, [], []
    try:
        start = 1
        for r in reader:
            if fmt == "csv" and reader.line_num == len(physical):
                _check_quotes_closed(physical, start, name)  # an open quote reads every later line as one field
            if not r:
                pass
            elif header is None:
                header = [h.strip() for h in r]
                for i, h in enumerate(header):
                    if h and h in header[:i]:  # unnamed columns (a spreadsheet's trailing commas) are unused
                        raise InputError(f"{name}, line {reader.line_num}, column {i + 1}: the header repeats the "
                                         f"name of column {header.index(h) + 1} (each column needs its own name)")
            elif len(r) != len(header):  # a field too many shifts the others: text would become label
                inside = ("quote texts that hold a comma" if fmt == "csv" else
                          "TSV is read with quoting off, so a text cannot hold a tab")
                raise InputError(f"{name}, line {reader.line_num}: {len(r)} fields, but the header has {len(header)} "
                                 f"({inside})")
            else:
                rows.append(dict(zip(header, r, strict=True)))
                lines.append(start)
            start = reader.line_num + 1
    except csv.Error as exc:
        raise InputError(f"{name}: not a valid {fmt.upper()} file ({exc})") from None
    return rows, header or [], lines


class _RepeatedKey(Exception):
    pass


def _unique_keys(pairs: list[tuple]) -> dict:
    keys = [k for k, _ in pairs]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            raise _RepeatedKey(key)
    return dict(pairs)


def _check_quotes_closed(lines: list[str], start: int, name: str) -> None:
    """An :class:`InputError` at the quote that opens a field of the CSV record beginning at line ``start`` (the
    file's last) and is never closed; the csv module (non-strict) would read the rest of the file into it."""
    opened, state = None, "start"  # start of a field, in a plain field, in a quoted field, after a quote in one
    for n, line in enumerate(lines[start - 1:], start=start):
        for col, ch in enumerate(line, start=1):
            if state == "start" and ch == '"':
                opened, state = (n, col), "quoted"
            elif state == "quoted":
                state = "after quote" if ch == '"' else "quoted"
            elif ch == "," or ch in "\r\n":
                state = "start"
            elif state == "after quote" and ch == '"':
                state = "quoted"  # a doubled quote inside quotes
            else:
                state = "plain"
    if state == "quoted":
        raise InputError(f"{name}, line {opened[0]}, column {opened[1]}: a quote opened here is never closed "
                         "(a text that starts with a quote must end with one; double quotes inside it)")


def columns_of(data: bytes, name: str) -> list[str]:
    """Column names of a tabular file (empty for .txt), so a page can offer them."""
    fmt = format_of(name)
    if fmt == "txt":
        return []
    return _rows(decode(data, name), fmt, name)[1]


def _clean(value) -> str:
    return "" if value is None else " ".join(str(value).split())


KINDS = {dict: "a JSON object", list: "a JSON array"}


def _text(value, where: Callable[[], str]) -> str:
    """A text cell as text (numbers become their digits); an object or array is an error, never its repr."""
    if isinstance(value, dict | list):
        raise InputError(f"{where()}: {KINDS[type(value)]}, not a text")
    return _clean(value)


def _label(value, where: Callable[[], str] = lambda: "a label") -> str:
    """A label as text: JSON numbers and numeric strings agree (1, 1.0 and "1" are all "1"). A label is a text or
    a finite number: an object, an array, NaN or infinity (JSON ``NaN``, ``1e999``) is an error."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict | list):
        raise InputError(f"{where()}: {KINDS[type(value)]}, not a label (a label is a text or a number)")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{where()}: not a finite number (NaN or infinity); a label is a text or a number")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = _clean(value)
    try:
        number = float(text)
    except ValueError:
        return text
    return str(int(number)) if math.isfinite(number) and number.is_integer() else text


TEXT_HINTS = ("text", "sentence", "sentence1", "review", "content", "tweet", "question", "premise", "document")
LABEL_HINTS = ("label", "labels", "class", "polarity", "sentiment", "category")


def guess_text_column(data: bytes, name: str, exclude: tuple[str, ...] = ()) -> str | None:
    """The column most likely to hold the texts: the first whose name is a usual one (:data:`TEXT_HINTS`),
    else the one with the most letters per row over the first 200 rows (so ``id,sentence,source`` gives
    ``sentence`` and never the ids). None for a .txt file."""
    if format_of(name) == "txt":
        return None
    rows, columns, _ = _rows(decode(data, name), format_of(name), name)
    candidates = [c for c in columns if c not in exclude] or columns
    for hint in TEXT_HINTS:
        for column in candidates:
            if column.lower() == hint:
                return column
    letters = {c: sum(ch.isalpha() for r in rows[:200] for ch in str(r.get(c) or "")) for c in candidates}
    return max(candidates, key=lambda c: (letters[c], -candidates.index(c))) if candidates else None


def parse(data: bytes | str, name: str = "input.txt", column: str = "text", pair_column: str | None = None,
          limit: int | None = None, label_column: str | None = None) -> TextInputs:
    """Texts from file contents. ``name`` gives the format by its suffix; ``limit`` caps the number of rows.

    With ``label_column``, each row's label is kept too; rows with an empty text, pair or label are skipped
    (and counted in ``skipped_empty``)."""
    fmt = format_of(name)
    text = data if isinstance(data, str) else decode(data, name)
    if not text.strip():
        raise InputError(f"{name} is empty")
    if fmt == "txt":
        if pair_column or label_column:
            raise InputError("text pairs and labels need a .csv, .tsv or .jsonl file with named columns")
        rows = [{"text": line.strip()} for line in text.splitlines() if line.strip()]  # blank lines separate
        return from_records(rows, ["text"], name, "text", limit=limit)
    rows, columns, lines = _rows(text, fmt, name)
    return from_records(rows, columns, name, column, pair_column, label_column, limit, lines,
                        numbered=fmt != "jsonl")


def from_records(rows: list[dict], columns: list[str], name: str, column: str = "text", pair_column: str | None = None,
                 label_column: str | None = None, limit: int | None = None, lines: list[int] | None = None,
                 numbered: bool = False) -> TextInputs:
    """Texts (pairs, labels) from records; ``name`` is the source and ``lines`` each record's line in it, for
    messages (``numbered``: columns are named by their position too, as in a CSV file)."""
    for wanted in filter(None, (column, pair_column, label_column)):
        if wanted not in columns:
            found = ", ".join(columns[:12]) or "none"
            raise InputError(f"{name} has no column '{wanted}' (columns found: {found})")

    def at(i: int, col: str) -> str:
        row = f"line {lines[i]}" if lines is not None else f"row {i + 1}"
        return f"{name}, {row}, column " + (f"{columns.index(col) + 1} ({col})" if numbered else str(col))

    kept = [(i, _text(r.get(column), partial(at, i, column)),
             _text(r.get(pair_column), partial(at, i, pair_column)) if pair_column else "",
             _label(r.get(label_column), partial(at, i, label_column)) if label_column else "")
            for i, r in enumerate(rows)]
    usable = [row for row in kept if row[1] and (row[2] or not pair_column) and (row[3] or not label_column)]
    if not usable:
        raise InputError(f"{name} has no usable rows: every text{', pair' if pair_column else ''}"
                         f"{' or label' if label_column else ''} is empty")
    dropped = max(0, len(usable) - limit) if limit is not None else 0
    if dropped:
        usable = usable[:limit]
    ids, texts, pairs, labels = (tuple(col) for col in zip(*usable, strict=True))
    return TextInputs(texts, pairs if pair_column else None, len(kept) - len(usable) - dropped, dropped,
                      labels if label_column else None, ids)


def from_hub_dataset(name: str, config: str | None = None, split: str = "train", column: str = "text",
                     pair_column: str | None = None, label_column: str | None = None,
                     limit: int | None = None) -> TextInputs:
    """Rows of a Hugging Face ``datasets`` dataset (e.g. ``glue``, ``sst2``, ``validation``). Class-label
    columns become their names (``positive``), not their numbers."""
    import datasets

    if not (name or "").strip():
        raise InputError("no dataset name given: e.g. glue (with config sst2), or hf:glue/sst2:train as a data source")
    where = f"{name}{'/' + config if config else ''} ({split})"
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except (ConnectionError, OSError) as exc:
        raise InputError(f"cannot load dataset {where}: {exc}. Without a network connection only datasets "
                         "already in the local Hugging Face cache load; upload a file instead") from None
    except Exception as exc:  # datasets raises many kinds for a name it cannot resolve
        raise InputError(f"cannot load dataset {where}: {type(exc).__name__}: "
                         f"{(str(exc).splitlines() or [''])[0]}") from None
    rows = ds.to_list()
    feature = ds.features.get(label_column) if label_column else None
    if isinstance(feature, datasets.ClassLabel):
        for row in rows:
            if row[label_column] is not None and row[label_column] >= 0:  # -1 marks a hidden test label
                row[label_column] = feature.int2str(row[label_column])
            else:
                row[label_column] = None
    return from_records(rows, list(ds.column_names), where, column, pair_column, label_column, limit)


PROBE_ROW_LIMIT = 2000  # texts a probe takes by default: the pages' limit, and the CLI's unless --max-rows


def check_row_limit(inputs: TextInputs, limit: int, what: str, sample: bool = False) -> TextInputs:
    """``inputs``, or an :class:`InputError` when it has more rows than ``limit`` (saying how to raise it, and with
    ``sample`` that a random sample is the other way)."""
    if len(inputs) > limit:
        raise InputError(f"{len(inputs):,} rows are more than the {what} limit of {limit:,}: "
                         + ("take a random sample (--sample N) or " if sample else "")
                         + f"raise it with --max-rows {len(inputs)} (memory and time grow with the rows)")
    return inputs


def read_file(path: Path | str, column: str = "text", pair_column: str | None = None,
              limit: int | None = None, label_column: str | None = None) -> TextInputs:
    """:func:`parse` for a file on disk."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no such file: {path}")
    return parse(path.read_bytes(), path.name, column, pair_column, limit, label_column)


def from_text_area(text: str, limit: int | None = None) -> TextInputs:
    """Texts typed into a text area: one per line."""
    if not text.strip():
        raise InputError("no text given: type or paste at least one sentence")
    return parse(text, "typed.txt", limit=limit)
