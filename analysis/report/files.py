"""A run folder's files as the report sees them: found without following links (a link could point anywhere on the
machine, and the report is made to be shared), at most :data:`MAX_FILES` of them, tables read a few rows at a time."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

MAX_FILES = 500  # files listed in a report (a fine-tuning run's checkpoint folder may hold many)
MAX_DEPTH = 3  # folders below the run folder that are looked into
TABLE_SUFFIXES = (".csv", ".tsv", ".parquet")


@dataclasses.dataclass(frozen=True)
class RunFile:
    """One file of a run folder: its path, its path relative to the folder (``/``-separated) and its size; ``link``
    when it is a symbolic link (listed, never read)."""

    path: Path
    rel: str
    size: int
    link: bool = False

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
            link = path.is_symlink()
            try:
                size = 0 if link else path.stat().st_size
            except OSError:
                continue
            found.append(RunFile(path, path.relative_to(run_dir).as_posix(), size, link))
        if cut:
            break
    found.sort(key=lambda f: (f.rel != "run.json", f.rel.count("/"), f.rel))
    return found, cut


def read_table(file: RunFile, rows: int | None = None):
    """``(frame, total rows or None)``: the first ``rows`` rows of a CSV, TSV or Parquet file (all with None)."""
    import pandas as pd

    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        with pq.ParquetFile(file.path) as parquet:
            total = parquet.metadata.num_rows
            if rows is None:
                return parquet.read().to_pandas(), total
            batch = next(parquet.iter_batches(batch_size=max(rows, 1)), None)
            frame = batch.to_pandas() if batch is not None else parquet.schema_arrow.empty_table().to_pandas()
            return frame.head(rows), total
    frame = pd.read_csv(file.path, sep="\t" if file.suffix == ".tsv" else ",", nrows=rows, encoding_errors="replace",
                        quoting=3 if file.suffix == ".tsv" else 0, low_memory=False)
    return frame, (len(frame) if rows is None else None)
