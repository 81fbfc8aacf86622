"""Issue 53 item 14: a run folder crafted to hurt the report. A linked run.json is not followed, a run.json nested
100,000 deep is one line, a number in run.json or a layer number in a table cannot make the report's work grow
(bounded by the files' real content), a CSV with a million columns and a Parquet file that inflates to gigabytes
are named and not read, and a FIFO in the folder does not hang it. Each is bounded in time by a watchdog."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.core.inputs import InputError
from analysis.core.task import RunRecord
from tests.unit.report.test_report import VERSIONS, probe_run, report_of


@pytest.fixture(autouse=True)
def watchdog():
    """Every case must end within 60 s (a hang fails the test instead of the suite)."""
    def expired(*_):
        raise TimeoutError("the report did not finish within 60 s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_a_linked_run_json_is_not_followed(tmp_path):
    outside = probe_run(tmp_path / "outside", hostile=False)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").symlink_to(outside / "run.json")
    with pytest.raises(InputError, match="not a plain file"):
        report_of(folder)


def test_a_deeply_nested_run_json_is_one_line(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_text('{"task": "probe", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(InputError) as err:
        report_of(folder)
    assert "nested" in str(err.value) and "\n" not in str(err.value)


def test_a_fifo_in_the_folder_does_not_hang_the_report(tmp_path):
    folder = probe_run(tmp_path / "run", hostile=False)
    os.mkfifo(folder / "pipe.csv")
    text = report_of(folder)
    assert "pipe.csv" in text and "not a plain file" in text


def test_a_fifo_as_run_json_is_one_line(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    os.mkfifo(folder / "run.json")
    with pytest.raises(InputError, match="not a plain file"):
        report_of(folder)


def test_a_crafted_number_in_run_json_does_not_grow_the_report(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    pd.DataFrame({"layer": [0, 1, 2], "accuracy": [0.5, 0.6, 0.7], "agreement": [0.4, 0.8, 1.0],
                  "kl_to_final": [0.3, 0.1, 0.0], "n": 3}).to_csv(folder / "layers.csv", index=False)
    pd.DataFrame({"row": [0, 1], "text": ["a", "b"], "decision_layer": [1, 2]}).to_csv(folder / "examples.csv",
                                                                                       index=False)
    RunRecord("lens classifier", {"model": "demo", "layers": 20_000_000}, versions=VERSIONS).write(folder)
    started = time.perf_counter()
    text = report_of(folder)
    assert time.perf_counter() - started < 30 and len(text) < 20_000_000


def test_a_crafted_layer_number_in_a_table_does_not_grow_the_report(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    pd.DataFrame({"layer": [0, 200_000_000], "x": [0.1, 0.2], "y": [0.3, 0.4], "label": ["a", "b"]}).to_csv(
        folder / "coords.csv", index=False)
    pd.DataFrame({"layer": [0, 1], "probe_accuracy": [0.5, 0.6]}).to_csv(folder / "separability.csv", index=False)
    RunRecord("atlas", {"model": "demo"}, versions=VERSIONS).write(folder)
    text = report_of(folder)
    assert len(text) < 20_000_000


def test_a_csv_of_a_million_columns_is_named_not_read(tmp_path):
    folder = probe_run(tmp_path / "run", hostile=False)
    (folder / "wide.csv").write_text(",".join(f"c{i}" for i in range(1_200_000)) + "\n" + ",".join("1" * 1_200_000)
                                     + "\n")
    started = time.perf_counter()
    text = report_of(folder)
    assert time.perf_counter() - started < 30 and "wide.csv" in text


def test_a_parquet_that_inflates_is_named_not_read(tmp_path):
    folder = probe_run(tmp_path / "run", hostile=False)
    big = "x" * 300_000_000  # 300 MB of one letter: a few hundred kB compressed
    pq.write_table(pa.table({"layer": pa.array([0], pa.int64()), "text": pa.array([big])}), folder / "bomb.parquet",
                   compression="zstd")
    del big
    assert (folder / "bomb.parquet").stat().st_size < 5_000_000
    text = report_of(folder)
    assert "bomb.parquet" in text and "x" * 10_000 not in text
    assert np.isfinite(len(text))
