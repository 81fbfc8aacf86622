"""benchmarks/gpu_check.py is run by hand on a lent GPU, with minutes to spare: a script that fails there wastes
them. Its whole flow runs here on the CPU at a tiny size (the figures are not asserted, only that every row is
measured and the probe's tables agree with the naive loop's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import SHARED

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "sst2" / "train.tsv").is_file(), reason="needs ../shared/data (SST-2, UD)")
def test_the_gpu_check_runs_every_row_on_the_cpu():
    out = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--data", str(SHARED),
                          "--model", "random:demo", "--texts", "60", "--finetune-texts", "32", "--sentences", "10",
                          "--lens-steps", "1", "--batch-size", "16"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout.split("\nrun ")[1]
    for row in ("probe: naive loop", "probe: float32 tables", "probe: certified", "probe: approximate bf16",
                "atlas [CLS] extraction", "heads stats", "tuned-lens training", "fine-tuning", "model cache"):
        assert row in table, row
    assert "identical to naive: True" in table and "host syncs per batch" in table
