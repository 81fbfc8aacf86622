"""Serving a model to a page: the shared cache vs loading it from disk every time (the naive way).

    python -m benchmarks.bench_cache [--model demo] [--repeats 5]
"""

import argparse
import platform
import statistics
import time

import torch

from models.cache import ModelCache
from models.loading import ModelSpec, load_model


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="demo")
    p.add_argument("--device", default="auto")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    spec = ModelSpec(args.model, device=args.device)
    load_model(spec)  # warm the OS file cache and imports, so the naive way is measured at its best
    naive = timed(lambda: load_model(spec), args.repeats)
    cache = ModelCache()
    cache.get(spec)
    cached = timed(lambda: cache.get(spec), max(args.repeats, 100))
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"model {args.model} on {spec.resolved().device}")
    print(f"load from disk (naive):  {naive * 1e3:9.2f} ms per page run")
    print(f"shared cache hit:        {cached * 1e3:9.4f} ms per page run")
    print(f"ratio: {naive / cached:,.0f}x")


if __name__ == "__main__":
    main()
