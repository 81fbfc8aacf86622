"""The comparison of two checkpoints after extraction (issue 28): bert-base-sized vectors, 5,000 rows x 13 layers.

    python -m benchmarks.bench_compare [--rows 5000] [--layers 13] [--hidden 768]

The vectors are synthetic (B = A rotated, rescaled and perturbed more at deeper layers, labels from a linear rule)
because this benchmark times what happens after extraction: extraction is the atlas's, timed in bench_atlas and
bench_precision. Prints each stage's time and the peak resident memory of the comparison.
"""

import argparse
import resource
import time

import numpy as np
from threadpoolctl import threadpool_limits

from analysis.compare.run import CompareConfig, compare_pair
from analysis.inputs import TextInputs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=5000)
    p.add_argument("--layers", type=int, default=13)
    p.add_argument("--hidden", type=int, default=768)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((args.layers, args.rows, args.hidden)).astype(np.float32)
    q, _ = np.linalg.qr(rng.standard_normal((args.hidden, args.hidden)))
    noise = np.linspace(0.05, 1.0, args.layers)[:, None, None]
    b = (a @ q.astype(np.float32) * 1.5 + noise * rng.standard_normal(a.shape)).astype(np.float32)
    labels = tuple(str(int(x)) for x in (a[-1, :, 0] > 0))
    inputs = TextInputs(tuple(f"row {i}" for i in range(args.rows)), labels=labels)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    with threadpool_limits(1, user_api="blas"):  # as analysis.compare.run.compare runs it
        _, summary, movers, coords = compare_pair(a, b, ("A", "B"), inputs, CompareConfig())
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"compare, after extraction: {args.rows:,} rows x {args.layers} layers x {args.hidden}: {seconds:.1f} s "
          f"(target < 60 s); peak RSS {after:.0f} MB (the two models' vectors alone: "
          f"{2 * a.nbytes / 2**20:.0f} MB; before the comparison {before:.0f} MB)")
    values = ", ".join(f"{row['cka']:.3f}" for row in summary)
    print(f"  CKA per layer: {values}")


if __name__ == "__main__":
    main()
