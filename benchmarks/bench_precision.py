"""The probe in ``certified`` precision (certified bf16 vocabulary product) and in the approximate mode (a bfloat16
model) against ``float32``, and each against this machine's own matrix peak, in one run; ``--atlas`` adds the
atlas's extraction in float32 and bfloat16 with their per-layer CKA.

    python -m benchmarks.bench_precision [--model demo] [--texts 872]
    python -m benchmarks.bench_precision --model random:../shared/data/tokenizers/bert-base-uncased --texts 200 --atlas

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

from analysis.core.inputs import TextInputs, read_file
from analysis.core.precision import bf16_units
from analysis.probe.reconstruction import ProbeConfig, probe
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
    p.add_argument("--atlas", action="store_true", help="also time the atlas's extraction in float32 and bfloat16")
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
    low = load_model(ModelSpec(args.model, device="cpu", dtype="bfloat16"))
    for mode, model in (("float32", loaded), ("certified", loaded), ("approximate", low)):
        runs = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            results[mode] = probe(model, inputs, ProbeConfig(precision="float32" if mode == "approximate" else mode),
                                  check_agreement=False)
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
    approx = results["approximate"]
    agree = (approx.tokens["predicted_token"] == plain.tokens["predicted_token"]).mean()
    acc_gap = (approx.layers["accuracy"] - plain.layers["accuracy"]).abs().max()
    print(f"  approximate (bfloat16 encoder and head) {times['approximate']:.2f} s: "
          f"{times['float32'] / times['approximate']:.2f}x; predictions identical to float32 on {agree:.2%} of "
          f"rows; layer accuracy within {acc_gap:.4f}; largest |p - p_float32| "
          f"{(approx.tokens['prob'] - plain.tokens['prob']).abs().max():.2e}")
    if args.atlas:
        atlas_extraction(loaded, low, inputs, args.repeats)


def atlas_extraction(loaded, low, inputs, repeats: int) -> None:
    """The atlas's vector extraction (encoder only, [CLS] of every layer) in float32 and in bfloat16, with each
    layer's linear CKA between the two and the encoder's GEMM throughput against the peak of a layer's shape."""
    from analysis.core.cka import linear_cka
    from analysis.core.vectors import extract

    times, vectors = {}, {}
    for name, model in (("float32", loaded), ("bfloat16", low)):
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            vectors[name] = extract(model, inputs, "cls")
            runs.append(time.perf_counter() - start)
        times[name] = statistics.median(runs)
    cka = [linear_cka(vectors["float32"][i:i + 1], vectors["bfloat16"][i:i + 1])[0, 0]
           for i in range(len(vectors["float32"]))]
    hidden = loaded.anatomy.hidden_size
    fp32, bf16 = gemm_peak(4096, hidden, 4 * hidden, torch.float32), gemm_peak(4096, hidden, 4 * hidden,
                                                                                torch.bfloat16)
    tokens = sum(len(loaded.tokenizer(t)["input_ids"]) for t in inputs.texts)
    params = sum(p.numel() for n, p in loaded.model.named_parameters() if "embeddings" not in n and "cls." not in n
                 and "lm_head" not in n and "predictions" not in n)
    flops = 2 * params * tokens
    print(f"atlas extraction ({len(inputs)} texts, {tokens:,} tokens; feed-forward GEMM peak now: float32 "
          f"{fp32:.0f}, bfloat16 {bf16:.0f} GFLOP/s):")
    print(f"  float32 {times['float32']:.2f} s ({flops / times['float32'] / 1e9:.0f} GFLOP/s, "
          f"{flops / times['float32'] / 1e9 / fp32:.0%} of the fp32 peak); bfloat16 {times['bfloat16']:.2f} s "
          f"({flops / times['bfloat16'] / 1e9:.0f} GFLOP/s, {flops / times['bfloat16'] / 1e9 / bf16:.0%} of the "
          f"bf16 peak): {times['float32'] / times['bfloat16']:.2f}x")
    print(f"  linear CKA per layer, bfloat16 vs float32: min {np.nanmin(cka):.5f} "
          f"({', '.join(f'{c:.4f}' for c in cka)})")


if __name__ == "__main__":
    main()
