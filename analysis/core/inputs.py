"""Read and validate texts (and text pairs) from what a user pastes or uploads.

Formats: ``.txt`` (one text per line, blank lines skipped), ``.csv``, ``.tsv`` (read with quoting off: the
shared datasets contain bare quotes), ``.jsonl`` (one JSON object per line), each plain or gzipped (``.txt.gz``).
Every file is streamed (:mod:`analysis.core.textfiles`) and a reader with a row limit stops there: a file is never held
whole, and a compressed one yields at most ``LAYERLENS_MAX_DECOMPRESSED_MB``. Every problem raises
:class:`InputError` with a message for the user; nothing in a file is ever executed.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import os
import random
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import islice, repeat
from pathlib import Path

from analysis.core.textfiles import InputError, Lines, is_empty, open_blocks

FORMATS = ("txt", "csv", "tsv", "jsonl")
CONLLU_SUFFIXES = (".conllu", ".conllu.gz")  # CoNLL-U treebanks (analysis.core.treebank reads them)
DEMO_LABELLED = Path(__file__).resolve().parents[1] / "data" / "demo_sentiment.csv"  # the bundled labelled set
# the bundled set on which layers differ: Conneau et al. 2018's bigram shift on UD English-EWT sentences (CC BY-SA
# 4.0), written by scripts/make_demo_wordorder.py
DEMO_WORDORDER = Path(__file__).resolve().parents[1] / "data" / "demo_wordorder.csv"


@dataclasses.dataclass(frozen=True)
class TextInputs:
    """Texts to analyse, optionally paired (``pairs[i]`` goes with ``texts[i]``), and what was left out."""

    texts: tuple[str, ...]
    pairs: tuple[str, ...] | None = None
    skipped_empty: int = 0  # rows whose text (or pair, or label, when asked for) was empty
    dropped_over_limit: int = 0  # 1 when rows follow ``limit`` (a reader stops there: the rest is not counted)
    labels: tuple[str, ...] | None = None  # class labels as text ("1" and 1 are the same label)
    row_ids: tuple[int, ...] | None = None  # each text's 0-based data row in the source (default: 0..n-1)
    # where they were read from, for run.json: the source in words (a file's path, an upload's name, "typed texts")
    # and its columns read (text, pair, label; None: not read)
    source: str = dataclasses.field(default="", compare=False)
    columns: tuple[str | None, str | None, str | None] = dataclasses.field(default=("text", None, None), compare=False)

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
            out.append(f"only the first {len(self.texts):,} rows used; the file goes on past them, left out and "
                       "not read (row limit)")
        return out


def class_ids(labels, names: list[str]) -> list[int]:
    """Each row's class index among a classifier's class ``names``: its label by name, or a class id written as a
    number (data labelled ``0``/``1`` for a model whose classes are ``negative``/``positive``). An unknown label is an
    :class:`InputError` naming the classes. THE reading of labels against a classifier (the classifier lens, head
    importance)."""
    index = {str(name): i for i, name in enumerate(names)}
    out = []
    for label in labels:
        if str(label) in index:
            out.append(index[str(label)])
        elif str(label).isdigit() and int(label) < len(names):
            out.append(int(label))
        else:
            raise InputError(f"label '{label}' is not one of the classifier's classes ({', '.join(map(str, names))}) "
                             f"nor a class id 0..{len(names) - 1}")
    return out


def safe_suffix(name: str) -> str:
    """The file type of an uploaded ``name`` as a suffix (``.csv``, ``.txt.gz``), for storing it under a name of our
    own: a user's file name (``../../x.csv``) never becomes part of a path."""
    base = Path(name.replace("\\", "/")).name
    return "." + format_of(base) + (".gz" if base.lower().endswith(".gz") else "")


def format_of(name: str) -> str:
    """``txt``, ``csv``, ``tsv`` or ``jsonl`` from ``name``'s suffix (before a ``.gz``)."""
    suffix = Path(name[:-3] if name.lower().endswith(".gz") else name).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise InputError(f"cannot read '{name}': use one of .{', .'.join(FORMATS)} (or one of them gzipped, such as "
                         ".txt.gz)")
    return suffix


class _Texts:
    """The rows of a .txt file: one text per line (``str.splitlines``: \\v, \\f, \\x1c-\\x1e, \\x85, \\u2028 and
    \\u2029 end a text too), blank lines skipped a block at a time (millions of them cost seconds, not minutes)."""

    def __init__(self, source: Path | bytes | str, name: str):
        self._blocks = open_blocks(source, name)
        self.rows = self._rows()

    def _rows(self) -> Iterator[tuple[dict, None]]:
        for block in self._blocks:
            for text in filter(None, map(str.strip, block.splitlines())):
                yield {"text": text}, None

    def goes_on(self) -> bool:
        try:
            return next(self.rows, None) is not None
        except InputError:  # a file that cannot be read further (the cap) goes on
            return True

    def close(self) -> None:
        self.rows.close()
        self._blocks.close()


def _jsonl_rows(lines: Lines, name: str) -> Iterator[tuple[dict, int]]:
    for line in lines:
        if not line.strip():
            continue
        n = lines.number
        try:
            row = json.loads(line, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:
            raise InputError(f"{name}, line {n}: not valid JSON ({exc.msg})") from None
        except _RepeatedKey as exc:
            raise InputError(f"{name}, line {n}, column {exc.args[0]}: the object names this key twice") from None
        if not isinstance(row, dict):
            raise InputError(f"{name}, line {n}: expected a JSON object per line")
        yield row, n


def _csv_rows(lines: Lines, fmt: str, name: str) -> Iterator:
    """The header (None for a file without one), then each record with its first line. A column named twice and a
    CSV quote that is never closed are errors naming the line and column."""
    delimiter = "\t" if fmt == "tsv" else ","
    quoting = csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL
    reader = csv.reader(lines, delimiter=delimiter, quoting=quoting)
    header, start = None, 1
    try:
        lines.record = []
        for r in reader:
            if fmt == "csv" and lines.at_end:
                _check_quotes_closed(lines.record, start, name)  # an open quote reads every later line as one field
            if not r:
                pass
            elif header is None:
                header = [h.strip() for h in r]
                for i, h in enumerate(header):
                    if h and h in header[:i]:  # unnamed columns (a spreadsheet's trailing commas) are unused
                        raise InputError(f"{name}, line {reader.line_num}, column {i + 1}: the header repeats the "
                                         f"name of column {header.index(h) + 1} (each column needs its own name)")
                yield header
            elif len(r) != len(header):  # a field too many shifts the others: text would become label
                inside = ("quote texts that hold a comma" if fmt == "csv" else
                          "TSV is read with quoting off, so a text cannot hold a tab")
                raise InputError(f"{name}, line {reader.line_num}: {len(r)} fields, but the header has {len(header)} "
                                 f"({inside})")
            else:
                yield dict(zip(header, r, strict=True)), start
            lines.record = []
            start = reader.line_num + 1
    except csv.Error as exc:
        raise InputError(f"{name}: not a valid {fmt.upper()} file ({exc})") from None
    if header is None:
        yield None


def _table(source: Path | bytes | str, fmt: str, name: str) -> tuple[list[str] | None, Iterator, Lines | _Texts]:
    """Column names (None for JSON lines: each object has its own keys), the records with their first line (None
    for .txt) and what they are read from (``goes_on`` after a limit, ``close``)."""
    if fmt == "txt":
        texts = _Texts(source, name)
        return ["text"], texts.rows, texts
    lines = Lines(source, name, csv_lines=fmt in ("csv", "tsv"))
    if fmt == "jsonl":
        return None, _jsonl_rows(lines, name), lines
    records = _csv_rows(lines, fmt, name)
    return next(records) or [], records, lines


class _RepeatedKey(Exception):
    pass


def _unique_keys(pairs: list[tuple]) -> dict:
    keys = [k for k, _ in pairs]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            raise _RepeatedKey(key)
    return dict(pairs)


def _check_quotes_closed(record: list[str], start: int, name: str) -> None:
    """An :class:`InputError` at the quote that opens a field of the CSV record (its ``record`` lines, from line
    ``start``, the file's last) and is never closed; the csv module (non-strict) would read the rest of the file
    into it."""
    opened, state = None, "start"  # start of a field, in a plain field, in a quoted field, after a quote in one
    for n, line in enumerate(record, start=start):
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


def columns_of(data: Path | bytes, name: str) -> list[str]:
    """Column names of a tabular file (empty for .txt), so a page can offer them: a CSV or TSV file's header, the
    keys of every JSON line (read through, holding none)."""
    fmt = format_of(name)
    if fmt == "txt":
        return []
    columns, records, lines = _table(data, fmt, name)
    try:
        if columns is None:
            keys: dict = {}
            for row, _ in records:
                keys.update(dict.fromkeys(row))
            columns = list(keys)
        return columns
    finally:
        lines.close()


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


def guess_text_column(data: Path | bytes, name: str, exclude: tuple[str, ...] = ()) -> str | None:
    """The column most likely to hold the texts: the first whose name is a usual one (:data:`TEXT_HINTS`),
    else the one with the most letters per row over the first 200 rows (so ``id,sentence,source`` gives
    ``sentence`` and never the ids). None for a .txt file."""
    fmt = format_of(name)
    if fmt == "txt":
        return None
    columns = columns_of(data, name)
    _, records, lines = _table(data, fmt, name)
    try:
        rows = [row for row, _ in islice(records, 200)]
    finally:
        lines.close()
    candidates = [c for c in columns if c not in exclude] or columns
    for hint in TEXT_HINTS:
        for column in candidates:
            if column.lower() == hint:
                return column
    letters = {c: sum(ch.isalpha() for r in rows[:200] for ch in str(r.get(c) or "")) for c in candidates}
    return max(candidates, key=lambda c: (letters[c], -candidates.index(c))) if candidates else None


def parse(data: Path | bytes | str, name: str = "input.txt", column: str = "text", pair_column: str | None = None,
          limit: int | None = None, label_column: str | None = None) -> TextInputs:
    """Texts from a file (``Path``), an upload's bytes or typed text, streamed: ``name`` gives the format by its
    suffix (``.gz``: gzipped); ``limit`` caps the number of rows, and reading stops there.

    With ``label_column``, each row's label is kept too; rows with an empty text, pair or label are skipped
    (and counted in ``skipped_empty``)."""
    fmt = format_of(name)
    if is_empty(data, name):
        raise InputError(f"{name} is empty")
    if fmt == "txt" and (pair_column or label_column):
        raise InputError("text pairs and labels need a .csv, .tsv or .jsonl file with named columns")
    columns, records, lines = _table(data, fmt, name)
    try:
        inputs = _collect(records, columns, name, "text" if fmt == "txt" else column, pair_column, label_column, limit,
                          numbered=fmt in ("csv", "tsv"), goes_on=lines.goes_on)
    finally:
        lines.close()
    return dataclasses.replace(inputs, source=str(data)) if isinstance(data, Path) else inputs  # a file: its path


def from_records(rows: Iterable[dict], columns: list[str], name: str, column: str = "text",
                 pair_column: str | None = None, label_column: str | None = None, limit: int | None = None,
                 lines: Iterable[int] | None = None, numbered: bool = False) -> TextInputs:
    """Texts (pairs, labels) from records; ``name`` is the source and ``lines`` each record's line in it, for
    messages (``numbered``: columns are named by their position too, as in a CSV file)."""
    records = iter(zip(rows, repeat(None) if lines is None else lines, strict=False))  # lines: as many as rows
    return _collect(records, columns, name, column, pair_column, label_column, limit, numbered,
                    lambda: next(records, None) is not None)


def _collect(records: Iterator[tuple[dict, int | None]], columns: list[str] | None, name: str, column: str,
             pair_column: str | None, label_column: str | None, limit: int | None, numbered: bool,
             goes_on: Callable[[], bool]) -> TextInputs:
    """The usable rows of ``records``, up to ``limit`` (then ``goes_on`` says whether more follow; nothing further
    is read). ``columns`` None: the records' own keys (JSON lines), checked once they are read."""
    wanted = [c for c in (column, pair_column, label_column) if c]

    def check(found: list[str]) -> None:
        for want in wanted:
            if want not in found:
                raise InputError(f"{name} has no column '{want}' (columns found: {', '.join(found[:12]) or 'none'})")

    def at(i: int, line: int | None, col: str) -> str:
        row = f"line {line}" if line is not None else f"row {i + 1}"
        return f"{name}, {row}, column " + (f"{columns.index(col) + 1} ({col})" if numbered else str(col))

    if columns is not None:
        check(columns)
    keys: dict = {}
    usable, read, more = [], 0, False
    for i, (r, line) in enumerate(records):
        if columns is None:
            keys.update(dict.fromkeys(r))
        read += 1
        row = (i, _text(r.get(column), partial(at, i, line, column)),
               _text(r.get(pair_column), partial(at, i, line, pair_column)) if pair_column else "",
               _label(r.get(label_column), partial(at, i, line, label_column)) if label_column else "")
        if row[1] and (row[2] or not pair_column) and (row[3] or not label_column):
            usable.append(row)
            if limit is not None and len(usable) >= limit:
                more = goes_on()
                break
    if columns is None:
        check(list(keys))
    if not usable:
        raise InputError(f"{name} has no usable rows: every text{', pair' if pair_column else ''}"
                         f"{' or label' if label_column else ''} is empty")
    ids, texts, pairs, labels = (tuple(col) for col in zip(*usable, strict=True))
    return TextInputs(texts, pairs if pair_column else None, read - len(usable), int(more),
                      labels if label_column else None, ids, name, (column, pair_column, label_column))


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
    """:func:`parse` for a file on disk (``.gz``: gzipped), streamed from it."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no such file: {path}")
    return parse(path, path.name, column, pair_column, limit, label_column)


def from_text_area(text: str, limit: int | None = None) -> TextInputs:
    """Texts typed into a text area: one per line."""
    if not text.strip():
        raise InputError("no text given: type or paste at least one sentence")
    return dataclasses.replace(parse(text, "typed.txt", limit=limit), source="typed texts")


def max_rows() -> int:
    """The atlas' row limit (``LAYERLENS_ATLAS_MAX_ROWS``, default 20,000)."""
    return int(os.environ.get("LAYERLENS_ATLAS_MAX_ROWS", 20_000))


def read_split(source: str, text_column: str = "text", pair_column: str | None = None,
               label_column: str | None = "label") -> TextInputs:
    """A data split from ``demo`` (the bundled sentiment set), ``hf:NAME[/CONFIG]:SPLIT`` (a Hugging Face
    dataset) or a .csv/.tsv/.jsonl path."""
    if source == "demo":
        return read_file(DEMO_LABELLED, "text", pair_column and "aspect", label_column=label_column and "label")
    if source.startswith("hf:"):
        name, _, split = source[3:].partition(":")
        dataset, _, subset = name.partition("/")
        return from_hub_dataset(dataset, subset or None, split or "train", text_column, pair_column, label_column)
    return read_file(source, text_column, pair_column, label_column=label_column)
