"""Probe throughput in one process against N processes under accelerate (``analysis.core.parallel``), same machine,
same texts, one run; the outputs are checked to be identical.

    python -m benchmarks.bench_parallel [--processes 2] [--texts 2000] [--model demo]

On a CPU machine the cores are shared: one process gets every core as threads, N processes get cores/N threads
each (``analysis.core.parallel.share_cores``), so the figure is about correctness and overhead. On a machine with
GPUs, run it with ``--processes`` set to the number of GPUs (one model copy on each).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from analysis.core.parallel import launch_command
from benchmarks import ROOT, data_file


def texts(n: int) -> list[str]:
    source = data_file("sst2/dev.tsv", "sst2_dev_200.tsv")
    rows = pd.read_csv(source, sep="\t", quoting=3)["sentence" if "sentence" in open(source).readline() else "text"]
    rows = rows.astype(str).tolist()
    return (rows * (n // len(rows) + 1))[:n]


def run(processes: int, args, inputs: Path, out: Path) -> tuple[float, float]:
    """(wall seconds of the whole command, seconds of the probe itself from run.json)."""
    entry = ["-m", "analysis", "probe", "--model", args.model, "--input", str(inputs), "--batch-size",
             str(args.batch_size), "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
    cmd = launch_command(processes, *entry) if processes > 1 else [sys.executable, *entry]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=ROOT)
    return time.perf_counter() - start, json.loads((out / "run.json").read_text())["seconds"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--texts", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--model", default="demo")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        inputs = tmp / "texts.txt"
        inputs.write_text("\n".join(texts(args.texts)) + "\n")
        one = run(1, args, inputs, tmp / "one")
        many = run(args.processes, args, inputs, tmp / "many")
        same = all((tmp / "one" / f).read_bytes() == (tmp / "many" / f).read_bytes()
                   for f in ("layers.csv", "decoded.csv"))
        same &= pd.read_parquet(tmp / "one" / "tokens.parquet").equals(pd.read_parquet(tmp / "many" / "tokens.parquet"))
    n = args.texts
    print(f"probe {n} texts, {args.model}, batch {args.batch_size}, {os.cpu_count()} cores")
    print(f"  1 process:   {one[1]:.1f} s probing ({n / one[1]:.0f} texts/s), {one[0]:.1f} s whole command")
    print(f"  {args.processes} processes: {many[1]:.1f} s probing ({n / many[1]:.0f} texts/s), {many[0]:.1f} s whole "
          f"command")
    print(f"  ratio (probing) {one[1] / many[1]:.2f}x, whole command {one[0] / many[0]:.2f}x; "
          f"outputs identical: {same}")


if __name__ == "__main__":
    main()
