"""The comparison of two checkpoints after extraction (issue 28): bert-base-sized vectors, 5,000 rows x 13 layers.

    flock /tmp/layerlens-bench.lock python -m benchmarks.bench_compare [--rows 5000] [--layers 13] [--hidden 768]

The vectors are synthetic (B = A rotated, rescaled and perturbed more at deeper layers, labels from a linear rule)
because this benchmark times what happens after extraction: extraction is the atlas's, timed in bench_atlas and
bench_precision. They are written to .npy files and read back memory-mapped, as the comparison reads them from the
atlas's cache, so the memory the comparison itself takes is measured apart from the vectors: the peak of the
process's anonymous memory (RssAnon, sampled every 5 ms) above what it held before. Prints the time of each stage
(one pass over the layers per stage, each on its own), the whole comparison's time and memory, the machine's load.
"""

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from analysis.compare.movers import movement, neighbour_overlap
from analysis.compare.run import CompareConfig, aligned_maps, compare_pair
from analysis.core.cka import cross_cka, paired_cka
from analysis.core.inputs import TextInputs
from analysis.core.separability import out_of_fold


def anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class PeakAnon:
    """The peak of RssAnon while the block runs, sampled every 5 ms."""

    def __enter__(self):
        self.peak, self.done = anon_mb(), False
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while not self.done:
            self.peak = max(self.peak, anon_mb())
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.done = True
        self.thread.join()
        self.peak = max(self.peak, anon_mb())


def vectors(rows: int, layers: int, hidden: int, folder: Path):
    """A and B written to ``folder`` and opened memory-mapped; labels from a linear rule on A's last layer."""
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((hidden, hidden)))
    q = q.astype(np.float32)
    a = np.lib.format.open_memmap(folder / "a.npy", "w+", np.float32, (layers, rows, hidden))
    b = np.lib.format.open_memmap(folder / "b.npy", "w+", np.float32, (layers, rows, hidden))
    for layer, noise in enumerate(np.linspace(0.05, 1.0, layers)):  # one layer at a time
        a[layer] = rng.standard_normal((rows, hidden))
        b[layer] = a[layer] @ q * 1.5 + noise * rng.standard_normal((rows, hidden)).astype(np.float32)
    labels = tuple(str(int(x)) for x in (a[-1, :, 0] > 0))
    a.flush()
    b.flush()
    del a, b
    return np.load(folder / "a.npy", mmap_mode="r"), np.load(folder / "b.npy", mmap_mode="r"), labels


def stages(a, b, labels, layers: list[int]) -> dict[str, float]:
    """Each stage of compare_pair over every layer on its own (under one BLAS thread, as compare_pair runs)."""
    y = np.asarray(labels)
    timed = {}

    def clock(name, fn):
        start = time.perf_counter()
        fn()
        timed[name] = time.perf_counter() - start

    with threadpool_limits(1, user_api="blas"):
        clock("cross CKA (every pair of layers)", lambda: cross_cka(a, b))
        clock("paired CKA + 200-resample bootstrap", lambda: paired_cka(a, b, layers))
        clock("Procrustes movement", lambda: [movement(np.array(a[i]), np.array(b[i])) for i in layers])
        clock("10-NN overlap", lambda: [neighbour_overlap(np.array(a[i]), np.array(b[i])) for i in layers])
        clock("probes, A and B (5 folds)", lambda: [out_of_fold(np.array(x[i]), y) for i in layers for x in (a, b)])
        clock("aligned maps", lambda: aligned_maps(a, b, layers))
    return timed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=5000)
    p.add_argument("--layers", type=int, default=13)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--stages", action="store_true", help="also time each stage on its own")
    args = p.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        a, b, labels = vectors(args.rows, args.layers, args.hidden, Path(tmp))
        inputs = TextInputs(tuple(f"row {i}" for i in range(args.rows)), labels=labels)
        layer_mb = args.rows * args.hidden * 4 / 2**20
        if args.stages:
            for name, seconds in stages(a, b, labels, list(range(args.layers))).items():
                print(f"  {name:<40} {seconds:6.1f} s")
        before = anon_mb()
        start = time.perf_counter()
        with PeakAnon() as peak, threadpool_limits(1, user_api="blas"):  # as analysis.compare.run.compare runs it
            _, summary, movers, coords = compare_pair(a, b, ("A", "B"), inputs, CompareConfig(reconstruction=False))
        seconds = time.perf_counter() - start
    print(f"compare, after extraction: {args.rows:,} rows x {args.layers} layers x {args.hidden}: {seconds:.1f} s "
          f"(target < 60 s); peak working memory {peak.peak - before:.0f} MB above the {before:.0f} MB held before "
          f"(anonymous memory; the vectors are memory-mapped: one layer of one model is {layer_mb:.1f} MB, both "
          f"models' vectors {2 * args.layers * layer_mb:.0f} MB)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    values = ", ".join(f"{row['cka']:.3f}" for row in summary)
    print(f"  CKA per layer: {values}")


if __name__ == "__main__":
    main()
