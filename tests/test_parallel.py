"""Data-parallel runs (analysis.parallel) against one process: real `accelerate launch` runs, two processes on
CPU with gloo, the same files row for row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.parallel import ONE, Ranks, launch_command

ROOT = Path(__file__).resolve().parents[1]
SST2 = Path(__file__).resolve().parent / "data" / "sst2_dev_200.tsv"


def run_cli(args: list[str], processes: int, home: Path) -> subprocess.CompletedProcess:
    entry = ["-m", "analysis", *map(str, args)]
    cmd = launch_command(processes, *entry) if processes > 1 else [sys.executable, *entry]
    env = {**os.environ, "LAYERLENS_HOME": str(home), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_steps_give_every_process_the_same_number_of_steps():
    plan = list("abcde")
    shares = [list(Ranks(index=r, count=2).steps(plan)) for r in range(2)]
    assert shares == [["a", "c", "e"], ["b", "d", None]]
    assert list(ONE.steps(plan)) == plan
    assert ONE.gather("x") == ["x"] and ONE.broadcast(3) == 3


def test_probe_in_two_processes_writes_the_files_of_one(tmp_path):
    # 200 texts in batches of 7: 29 batches, so the second process has one step with nothing to do
    args = ["probe", "--model", "demo", "--input", SST2, "--mode", "masked", "--batch-size", "7"]
    for n in (1, 2):
        done = run_cli([*args, "--out", tmp_path / f"out{n}"], n, tmp_path / f"home{n}")
    assert "probing (2 processes)" in done.stderr
    one, two = tmp_path / "out1", tmp_path / "out2"
    for name in ("layers.csv", "decoded.csv"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    a, b = pd.read_parquet(one / "tokens.parquet"), pd.read_parquet(two / "tokens.parquet")
    assert len(a) > 10_000
    pd.testing.assert_frame_equal(a, b)
    assert [json.loads((d / "run.json").read_text())["processes"] for d in (one, two)] == [1, 2]


def test_atlas_in_two_processes_writes_the_files_of_one(tmp_path):
    args = ["atlas", "--model", "demo", "--data", SST2, "--pooling", "mean", "--layers", "all", "--batch-size", "16"]
    for n in (1, 2):  # separate homes: the second run must extract, not read the first one's cache
        run_cli([*args, "--out", tmp_path / f"out{n}"], n, tmp_path / f"home{n}")
    one, two = tmp_path / "out1", tmp_path / "out2"
    for name in ("coords.csv", "separability.csv", "cka.csv"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    info = [json.loads((d / "run.json").read_text()) for d in (one, two)]
    assert [i["processes"] for i in info] == [1, 2] and not any(i["cache_hit"] for i in info)
    assert info[1]["model_spec"]["device"] == "cpu"


@pytest.mark.parametrize("processes", [2])
def test_a_bad_input_is_said_once(tmp_path, processes):
    cmd = launch_command(processes, "-m", "analysis", "probe", "--model", "demo", "--input",
                         str(tmp_path / "missing.txt"), "--out", str(tmp_path / "out"))
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0
    assert done.stderr.count("missing.txt") == 1, done.stderr[-2000:]
