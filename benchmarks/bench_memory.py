"""Batches that adapt to the free memory, in one run: peak memory and time with and without the cap.

    python -m benchmarks.bench_memory [--texts 48] [--tokens 500] [--batch-size 48] [--pretend-free-gb 2]

A bert-base-sized model (bert-base-uncased's config and tokenizer from ``../shared/data``, random weights: no
download) extracts every layer's mean vector (the atlas's extraction) for long texts, with one batch of all
of them requested. Each setting runs in its own process so peak RSS is its own:

- naive: fixed batches of ``--batch-size`` (the free memory pretended endless, so no cap), what a loop that
  trusts the batch size does;
- adaptive: the engine's batches capped by the activation estimate against ``--pretend-free-gb`` of free
  memory (``free_bytes`` replaced, as on a small machine).

Prints each setting's peak RSS, seconds and batch sizes, the ratios, and checks the vectors agree.
"""

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT.parent / "shared" / "data" / "tokenizers" / "bert-base-uncased"


def child(args) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

    import analysis.atlas.atlas as projection
    import analysis.core.activations as activations
    from analysis.core.inputs import TextInputs
    from models.loading import ModelSpec, load_model

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(TOKENIZER)).save_pretrained(tmp)
        AutoTokenizer.from_pretrained(TOKENIZER).save_pretrained(tmp)
        loaded = load_model(ModelSpec(tmp, device="cpu"))
    words = "the film is a charming and often affecting journey but the acting is dull".split()
    texts = TextInputs(tuple(" ".join(words[(i + j) % len(words)] for j in range(args.tokens - 2))
                             for i in range(args.texts)))
    sizes = []
    free_gb = args.pretend_free_gb if args.mode == "adaptive" else 1e6  # naive: a cap that never binds
    activations.free_bytes = lambda device: int(free_gb * 2**30)
    original = projection.bucket_indices
    projection.bucket_indices = lambda *a, **k: (sizes.append(len(b)) or b for b in original(*a, **k))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    vectors = projection.extract(loaded, texts, "mean", batch_size=args.batch_size)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    np.save(args.save, vectors)
    print(json.dumps({"seconds": seconds, "peak_mb": peak / 1024, "before_mb": base / 1024, "batches": sizes}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--texts", type=int, default=48)
    p.add_argument("--tokens", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--pretend-free-gb", type=float, default=2.0)
    p.add_argument("--mode", choices=["naive", "adaptive"], help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        return child(args)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("naive", "adaptive"):
            out = subprocess.run([sys.executable, "-m", "benchmarks.bench_memory", "--mode", mode, "--save",
                                  f"{tmp}/{mode}.npy", *sys.argv[1:]], cwd=ROOT, capture_output=True, text=True,
                                 check=True)
            results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        np.testing.assert_allclose(np.load(f"{tmp}/naive.npy"), np.load(f"{tmp}/adaptive.npy"), rtol=1e-4,
                                   atol=1e-5)
    print(f"{platform.processor() or platform.machine()}, {args.texts} texts of {args.tokens} tokens, "
          f"bert-base size, batch size {args.batch_size}, pretend {args.pretend_free_gb} GB free")
    for mode, r in results.items():
        print(f"{mode:9s} peak RSS {r['peak_mb']:8.0f} MB (model loaded: {r['before_mb']:.0f} MB)  "
              f"{r['seconds']:6.1f} s  batches {r['batches']}")
    n, a = results["naive"], results["adaptive"]
    print(f"activation memory ratio naive/adaptive: "
          f"{(n['peak_mb'] - n['before_mb']) / max(a['peak_mb'] - a['before_mb'], 1):.2f}x; "
          f"time ratio adaptive/naive: {a['seconds'] / n['seconds']:.2f}x; vectors agree")


if __name__ == "__main__":
    main()
