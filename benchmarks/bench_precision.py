"""The probe in ``certified`` precision (certified bf16 vocabulary product) against ``float32``, and both against this
machine's own matrix peak, in one run.

    python -m benchmarks.bench_precision [--model demo] [--texts 872]
    python -m benchmarks.bench_precision --model random:../shared/data/tokenizers/bert-base-uncased --texts 200

Prints: the fp32 and bf16 GEMM throughput of the head's shape (rows x hidden by hidden x vocab) measured now; each
mode's probe time (median of 3, the model loaded once), the ratio, the share of rows recomputed in float32, the
head product's GFLOP/s as a fraction of the bf16 peak; and whether the tables are identical (counts, predictions,
ranks, top-k) with the probabilities' largest log difference against the stated bound.
"""

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from analysis.inputs import TextInputs, read_file
from analysis.precision import bf16_units
from analysis.reconstruction import ProbeConfig, probe
from models.loading import ModelSpec, load_model

DATA = Path(os.environ.get("LAYERLENS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def gemm_peak(rows: int, hidden: int, vocab: int, dtype: torch.dtype, repeats: int = 3) -> float:
    """GFLOP/s of a (rows x hidden) @ (hidden x vocab) product in ``dtype``, best of ``repeats``."""
    a, b = torch.randn(rows, hidden).to(dtype), torch.randn(vocab, hidden).to(dtype)
    a @ b.T
    best = min(_timed(lambda: a @ b.T) for _ in range(repeats))
    return 2 * rows * hidden * vocab / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="demo")
    p.add_argument("--texts", type=int, default=872)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    loaded = load_model(ModelSpec(args.model, device="cpu", dtype="float32"))
    data = read_file(DATA / "sst2" / "dev.tsv", column="text")
    inputs = TextInputs(tuple(data.texts[:args.texts]))
    hidden, vocab = loaded.anatomy.hidden_size, loaded.anatomy.vocab_size
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads; bf16 units: {bf16_units('cpu')}")
    fp32, bf16 = gemm_peak(4096, hidden, vocab, torch.float32), gemm_peak(4096, hidden, vocab, torch.bfloat16)
    print(f"head-shape GEMM (4096 x {hidden} by {hidden} x {vocab}): float32 {fp32:.0f} GFLOP/s, bfloat16 "
          f"{bf16:.0f} GFLOP/s ({bf16 / fp32:.2f}x)")
    results, times = {}, {}
    for mode in ("float32", "certified"):
        runs = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            results[mode] = probe(loaded, inputs, ProbeConfig(precision=mode))
            runs.append(time.perf_counter() - start)
        times[mode] = statistics.median(runs)
    plain, exact = results["float32"], results["certified"]
    rows = len(exact.tokens)
    head_flops = 2 * rows * hidden * vocab
    info = exact.precision
    print(f"probe, {args.model}, {len(inputs)} SST-2 dev texts, {rows:,} scored rows (all layers):")
    ratio = times["float32"] / times["certified"]
    print(f"  float32 {times['float32']:.2f} s; certified {times['certified']:.2f} s: {ratio:.2f}x"
          f" ({info['head_product']}; {info.get('recomputed', 0):,} of {info.get('rows', rows):,} rows recomputed "
          f"in float32, {info.get('recomputed_share', 0):.1%})")
    print(f"  head product alone at the bf16 peak would take {head_flops / bf16 / 1e9:.2f} s, at the fp32 peak "
          f"{head_flops / fp32 / 1e9:.2f} s")
    same = all(exact.tokens[c].tolist() == plain.tokens[c].tolist()
               for c in ("predicted_token", "correct", "rank", "input_token")) and exact.layers[
        ["tokens", "correct"]].equals(plain.layers[["tokens", "correct"]]) and exact.decoded.equals(plain.decoded)
    gap = float(np.abs(np.log(exact.tokens["prob"]) - np.log(plain.tokens["prob"])).max())
    print(f"  tables identical: {same}; probabilities: largest |log p - log p_float32| {gap:.2e}, stated bound "
          f"{info.get('max_log_prob_bound', 0):.2e}")


if __name__ == "__main__":
    main()
