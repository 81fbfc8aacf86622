"""A run folder's files as the report sees them: found without following links (a link could point anywhere on the
machine, and the report is made to be shared), at most :data:`MAX_FILES` of them, tables read a few rows at a time."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

MAX_FILES = 500  # files listed in a report (a fine-tuning run's checkpoint folder may hold many)
MAX_DEPTH = 3  # folders below the run folder that are looked into
TABLE_SUFFIXES = (".csv", ".tsv", ".parquet")


MAX_COLUMNS = 10_000  # columns of a table read at all (a CSV of a million columns is named, not parsed)
MAX_INFLATED = 200_000_000  # bytes a Parquet table may inflate to when read (its metadata says, before reading)


@dataclasses.dataclass(frozen=True)
class RunFile:
    """One file of a run folder: its path, its path relative to the folder (``/``-separated) and its size; ``link``
    when it is a symbolic link or not a plain file (a FIFO, a device, a socket): listed, never opened."""

    path: Path
    rel: str
    size: int
    link: bool = False
    special: bool = False  # not a link but not a plain file either

    @property
    def suffix(self) -> str:
        return self.path.suffix.lower()


def run_files(run_dir: Path) -> tuple[list[RunFile], bool]:
    """The files under ``run_dir`` (sorted, ``run.json`` first; links listed but not followed) and whether the list
    was cut at :data:`MAX_FILES`."""
    run_dir = Path(run_dir)
    found: list[RunFile] = []
    cut = False
    for top, dirs, names in os.walk(run_dir, followlinks=False):
        depth = len(Path(top).relative_to(run_dir).parts)
        dirs[:] = sorted(d for d in dirs if depth < MAX_DEPTH and not d.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            path = Path(top) / name
            if len(found) >= MAX_FILES:
                cut = True
                break
            try:
                st = os.lstat(path)
            except OSError:
                continue
            link, plain = stat.S_ISLNK(st.st_mode), stat.S_ISREG(st.st_mode)
            found.append(RunFile(path, path.relative_to(run_dir).as_posix(), st.st_size if plain else 0,
                                 link or not plain, special=not link and not plain))
        if cut:
            break
    found.sort(key=lambda f: (f.rel != "run.json", f.rel.count("/"), f.rel))
    return found, cut


def read_table(file: RunFile, rows: int | None = None):
    """``(frame, total rows or None)``: the first ``rows`` rows of a CSV, TSV or Parquet file (all with None). The
    work is bounded by what the file really holds, checked before it is parsed: a ``ValueError`` (the caller's
    note) for a table of more than :data:`MAX_COLUMNS` columns or a Parquet file that inflates past
    :data:`MAX_INFLATED` bytes."""
    import pandas as pd

    if file.link:
        raise ValueError("not a plain file: not read")
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        with pq.ParquetFile(file.path) as parquet:
            meta = parquet.metadata
            inflated = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            if meta.num_columns > MAX_COLUMNS or inflated > MAX_INFLATED:
                raise ValueError(f"{meta.num_columns:,} columns, {inflated / 1e6:,.0f} MB once read: over what the "
                                 f"report reads ({MAX_COLUMNS:,} columns, {MAX_INFLATED / 1e6:,.0f} MB)")
            total = meta.num_rows
            if rows is None:
                return parquet.read().to_pandas(), total
            batch = next(parquet.iter_batches(batch_size=max(rows, 1)), None)
            frame = batch.to_pandas() if batch is not None else parquet.schema_arrow.empty_table().to_pandas()
            return frame.head(rows), total
    with open(file.path, "rb") as f:  # the header line, at most 4 MB of it: its columns counted before parsing
        header = f.readline(4 << 20)
    columns = header.count(b"\t" if file.suffix == ".tsv" else b",") + 1
    if columns > MAX_COLUMNS or len(header) >= 4 << 20:
        raise ValueError(f"{'over ' if len(header) >= 4 << 20 else ''}{columns:,} columns: over what the report "
                         f"reads ({MAX_COLUMNS:,})")
    frame = pd.read_csv(file.path, sep="\t" if file.suffix == ".tsv" else ",", nrows=rows, encoding_errors="replace",
                        quoting=3 if file.suffix == ".tsv" else 0, low_memory=False)
    return frame, (len(frame) if rows is None else None)
