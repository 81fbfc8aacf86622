"""The layer atlas against the naive way, in one run.

    python -m benchmarks.bench_atlas [--model demo] [--texts 5000] [--pca-rows 100000] [--umap-rows 10000]

1. Extraction of every layer's [CLS] vector for SST-2 texts. Naive: what a user would write: padded batches of 32
   in file order through the full masked-LM model with ``output_hidden_states=True``, ``h[:, 0]`` per layer.
   Engine: :func:`analysis.atlas.atlas.extract` (length buckets, encoder only). Both must agree.
2. PCA of a 100k x 768 matrix: scikit-learn's full-SVD solver (naive) vs the engine's ``project`` (scikit-learn's
   default, which picks the exact covariance-eigendecomposition solver for tall matrices). Both must agree up
   to the sign of each axis.
3. UMAP of 10k points: time only (real [CLS] vectors of the last layer, tiled when there are fewer texts).
"""

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from analysis.core.inputs import read_file
from analysis.core.projection import project
from analysis.core.vectors import extract
from models.loading import ModelSpec, load_model

DATA = Path(os.environ.get("LAYERLENS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@torch.inference_mode()
def naive_extract(loaded, texts, batch_size=32) -> np.ndarray:
    tok, model = loaded.tokenizer, loaded.model
    out = []
    for start in range(0, len(texts), batch_size):
        enc = tok(list(texts[start:start + batch_size]), padding=True, truncation=True, return_tensors="pt")
        states = model(**enc.to(loaded.spec.device), output_hidden_states=True).hidden_states
        out.append(np.stack([h[:, 0].float().cpu().numpy() for h in states]))
    return np.concatenate(out, axis=1)


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="demo")
    p.add_argument("--device", default="auto")
    p.add_argument("--texts", type=int, default=5000, help="first N texts of SST-2 train")
    p.add_argument("--pca-rows", type=int, default=100_000)
    p.add_argument("--umap-rows", type=int, default=10_000)
    args = p.parse_args()
    loaded = load_model(ModelSpec(args.model, device=args.device))
    inputs = read_file(DATA / "sst2" / "train.tsv", limit=args.texts)
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"device {loaded.spec.device}; model {args.model}: {loaded.num_layers} layers, hidden "
          f"{loaded.anatomy.hidden_size}; {len(inputs)} SST-2 train texts")

    extract(loaded, read_file(DATA / "sst2" / "dev.tsv", limit=64))  # warm-up
    naive, t_naive = timed(lambda: naive_extract(loaded, inputs.texts))
    fast, t_fast = timed(lambda: extract(loaded, inputs, "cls", batch_size=32))
    same = np.allclose(naive, fast, atol=1e-4)
    print(f"extraction  naive {t_naive:.2f} s ({len(inputs) / t_naive:,.0f} texts/s) | engine {t_fast:.2f} s "
          f"({len(inputs) / t_fast:,.0f} texts/s) | ratio {t_naive / t_fast:.2f}x | same vectors: {same}")

    rng = np.random.default_rng(0)
    x = (rng.normal(size=(args.pca_rows, 768)) @ rng.normal(size=(768, 768)) / 30).astype(np.float32)
    from sklearn.decomposition import PCA

    ref, t_full = timed(lambda: PCA(n_components=2, svd_solver="full").fit_transform(x))
    ours, t_pca = timed(lambda: project(x, "pca"))
    agree = np.allclose(np.abs(ref), np.abs(ours), rtol=1e-3, atol=1e-3 * np.abs(ref).max())
    print(f"PCA {args.pca_rows:,} x 768  full SVD {t_full:.2f} s | engine {t_pca:.2f} s | ratio "
          f"{t_full / t_pca:.1f}x | agree up to sign: {agree}")

    last = fast[-1]
    tiled = np.resize(last, (args.umap_rows, last.shape[1])) + rng.normal(scale=1e-3, size=(args.umap_rows,
                                                                                              last.shape[1]))
    _, t_umap = timed(lambda: project(tiled.astype(np.float32), "umap"))
    print(f"UMAP {args.umap_rows:,} x {last.shape[1]}: {t_umap:.2f} s (includes numba compilation on first use)")


if __name__ == "__main__":
    main()
