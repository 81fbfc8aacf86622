"""How long a status command takes: ``python -m analysis jobs list`` against the naive way, which imports torch
and transformers first (what every command did before the CLI's heavy imports moved into the commands).

    python -m benchmarks.bench_cli [--runs 5]
"""

import argparse
import statistics
import subprocess
import sys
import time


def wall(argv: list[str], runs: int) -> float:
    """Median wall-clock seconds of ``runs`` fresh interpreters."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    naive = wall([sys.executable, "-c", "import torch, transformers, runpy, sys; sys.argv = ['analysis', 'jobs', "
                  "'list']; runpy.run_module('analysis', run_name='__main__')"], args.runs)
    ours = wall([sys.executable, "-m", "analysis", "jobs", "list"], args.runs)
    print(f"jobs list  naive (torch + transformers first) {naive:.2f} s | engine {ours:.2f} s | "
          f"ratio {naive / ours:.1f}x (median of {args.runs})")


if __name__ == "__main__":
    main()
