"""Token vectors and nearest-neighbour search at corpus scale (issue 29): the demo model on the shared English
corpus, every layer; the same figures at bert-base size (random weights); the UMAP map's fit and transform.

    python -m benchmarks.bench_tokens [--model demo] [--lines 32000] [--index-layers 4] [--queries 100]
        [--hnsw-rows 200000] [--encoder-texts 2000] [--flat-layers all]
    python -m benchmarks.bench_tokens --model random:../shared/data/tokenizers/bert-base-uncased --lines 3800 \
        --encoder-texts all --flat-layers all --index-layers 0,6,12
    python -m benchmarks.bench_tokens --umap-vectors DIR --umap-layer 12 [--umap-sample 20000]

Every figure is printed with the load average at the moment it was taken (the machine is shared), and the run
starts by measuring this machine's float32 and bfloat16 matrix peak on bert-base's feed-forward shape
(``benchmarks.bench_precision.gemm_peak``, 4,096 x hidden by hidden x 4 hidden): the extraction's GFLOP/s
(2 x block parameters per padded token + attention's 4 x seq x hidden) is reported as a share of the float32
peak it runs at.

1. **Extraction** (``analysis.tokens.vectors.extract``, from the cache when it is there: said so) of the first
   ``--lines`` non-empty lines of ``english_corpus/train.txt.gz``: tokens, seconds, tokens/s, float16 bytes on
   disk; against **the probe's encoder throughput**: ``analysis.core.activations.hidden_states`` alone over the same
   length buckets of the first ``--encoder-texts`` texts (tokens/s, padding included in neither count: counted
   tokens only).
2. **Indexes** per layer in ``--index-layers``: build seconds of ``flat`` (exact) and ``ivf``, ``hnsw`` on the first
   ``--hnsw-rows`` rows only when asked (its build grows as n log n: measured below the target size and said);
   recall@10 of the approximate ones against exact.
3. **Queries**: one token at a time, ``--queries`` random tokens: milliseconds per query of the flat index, of
   IVF, and of **brute force in numpy** (the same normalised float32 matrix in memory, ``x @ q``, then
   ``argpartition``) and of the streaming brute force over the float16 shards; the ratios.
4. Peak resident memory of this process (ru_maxrss) after each stage.
5. ``--umap-vectors``: only the UMAP map of one layer (``analysis.tokens.maps.umap_map``) in a fresh process:
   fit seconds on the sample, transform seconds per 100,000 rows, peak resident memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import time
from pathlib import Path

import numpy as np

from benchmarks import SHARED


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages now (the machine is shared: every figure carries them)."""
    return [round(x, 2) for x in os.getloadavg()]


def forward_flops(loaded, encoded, batches) -> float:
    """Multiply-add FLOPs of the encoder's forward passes over ``batches`` (padded): 2 x the transformer blocks'
    parameters per padded token, plus attention's two (seq x seq x hidden) products per layer."""
    blocks = sum(p.numel() for name, p in loaded.model.base_model.named_parameters()
                 if ".layer." in name or ".layers." in name)
    hidden, layers = loaded.anatomy.hidden_size, loaded.num_layers
    total = 0.0
    for idx in batches:
        seq = max(len(encoded.input_ids[i]) for i in idx)
        total += len(idx) * seq * 2 * blocks + layers * 4 * len(idx) * seq * seq * hidden
    return total


def matrix_peaks(hidden: int) -> dict:
    """This machine's float32 and bfloat16 matrix peak now, on the feed-forward shape of a ``hidden`` model."""
    import torch

    from benchmarks.bench_precision import gemm_peak

    return {"gemm_shape": f"4096 x {hidden} by {hidden} x {4 * hidden}",
            "fp32_peak_gflops": gemm_peak(4096, hidden, 4 * hidden, torch.float32),
            "bf16_peak_gflops": gemm_peak(4096, hidden, 4 * hidden, torch.bfloat16), "load": load()}


def lines_of(path: Path, n: int) -> list[str]:
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(line.strip())
                if len(out) >= n:
                    break
    return out


def ms_per_query(search_one, q: np.ndarray) -> float:
    """Milliseconds per query, one query at a time (as a page asks)."""
    start = time.perf_counter()
    for i in range(len(q)):
        search_one(q[i:i + 1])
    return (time.perf_counter() - start) * 1000 / len(q)


def numpy_search(x: np.ndarray, q: np.ndarray, k: int = 10) -> np.ndarray:
    """The naive way: the layer as one float32 matrix, ``x @ q``, then ``argpartition``."""
    s = x @ q[0]
    top = np.argpartition(-s, k)[:k]
    return top[np.argsort(-s[top])][None]


def tie_recall(found, exact, rows) -> float:
    """Tie-aware recall@10 of faiss's ``(scores, rows)`` against exact ``(scores, rows)``, both asked for 11 and
    the query's own row (``rows``) left out of each (``search.without_query``), as ``search.measure_recall``."""
    from analysis.tokens.search import recall_at, without_query

    found, exact = without_query(*found, rows, 10), without_query(*exact, rows, 10)
    return recall_at(found[1], exact[1], found[0], exact[0])


def bench_layer(tv, layer: int, args, rng) -> dict:
    import faiss

    from analysis.tokens import search

    row: dict = {"layer": layer}
    for kind in ("flat", "ivf"):
        info = search.build_index(tv, layer, kind, force=True)
        row[f"{kind}_build_s"] = info["build_seconds"]
        row[f"{kind}_bytes"] = info["bytes"]
        row[f"{kind}_build_load"] = load()
    row["peak_mb_after_build"] = peak_mb()
    rows = np.sort(rng.choice(tv.rows, args.queries, replace=False))
    q = search.normalise(tv.rows_at(layer, rows))
    flat = search.load_index(tv, layer, "flat")
    row["flat_query_ms"] = ms_per_query(lambda v: flat.search(v, 10), q)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    row["flat_query_ms_1_thread"] = ms_per_query(lambda v: flat.search(v, 10), q)
    faiss.omp_set_num_threads(threads)
    exact_s, exact = flat.search(q, 11)  # the query's own row is left out of every recall below
    row["peak_mb_flat_loaded"] = peak_mb()
    flat = None  # one index in memory at a time
    ivf = search.load_index(tv, layer, "ivf")
    nprobe = ivf.nprobe
    for scale in (1, 2, 4):
        ivf.nprobe = nprobe * scale
        row[f"ivf_nprobe{ivf.nprobe}_query_ms"] = ms_per_query(lambda v: ivf.search(v, 10), q)
        row[f"ivf_nprobe{ivf.nprobe}_recall@10"] = tie_recall(ivf.search(q, 11), (exact_s, exact), rows)
    ivf = None
    x = search.layer_matrix(tv, layer)
    row["numpy_query_ms"] = ms_per_query(lambda v: numpy_search(x, v), q[:20])
    found = np.concatenate([numpy_search(x, q[i:i + 1], 11) for i in range(len(q))])
    row["numpy_recall@10"] = tie_recall((np.einsum("qd,qkd->qk", q, x[found]), found), (exact_s, exact), rows)
    row["peak_mb_numpy_matrix"] = peak_mb()
    x = None
    row["streaming_brute_force_query_ms"] = ms_per_query(lambda v: search.brute_force(tv, layer, v, 10), q[:3])
    row["flat_vs_numpy"] = row["numpy_query_ms"] / row["flat_query_ms_1_thread"]
    row["ivf_vs_numpy"] = row["numpy_query_ms"] / row[f"ivf_nprobe{nprobe}_query_ms"]
    row["query_load"] = load()
    if args.hnsw_rows:
        n = min(args.hnsw_rows, tv.rows)
        xs = search.normalise(tv.rows_at(layer, np.arange(n)))
        index = faiss.IndexHNSWFlat(tv.hidden, search.HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = search.HNSW_EF_CONSTRUCTION
        start = time.perf_counter()
        index.add(xs)
        row["hnsw_rows"], row["hnsw_build_s"] = n, time.perf_counter() - start
        index.hnsw.efSearch = search.HNSW_EF_SEARCH
        sub_exact = faiss.IndexFlatIP(tv.hidden)
        sub_exact.add(xs)
        sub_rows = rng.choice(n, args.queries, replace=False)
        qs = xs[sub_rows]
        row["hnsw_query_ms"] = ms_per_query(lambda v: index.search(v, 10), qs)
        row["hnsw_recall@10"] = tie_recall(index.search(qs, 11), sub_exact.search(qs, 11), sub_rows)
    row["load_average"] = load()
    return row


def bench_umap(args) -> None:
    """The UMAP map of one layer in this (fresh) process: fit on the sample, transform of the rest."""
    from analysis.tokens.maps import umap_map
    from analysis.tokens.vectors import TokenVectors

    tv = TokenVectors.open(args.umap_vectors)
    layer = tv.layers[-1] if args.umap_layer is None else args.umap_layer
    before = load()
    start = time.perf_counter()
    coords, info = umap_map(tv, layer, sample=args.umap_sample, seed=0, force=True)
    wall = time.perf_counter() - start
    rest = tv.rows - info["sample"]
    print(json.dumps({"rows": tv.rows, "hidden": tv.hidden, "layer": layer, "sample": info["sample"],
                      "fit_s": info["fit_seconds"], "transform_s": info["transform_seconds"],
                      "transform_s_per_100k_rows": info["transform_seconds"] / max(rest, 1) * 100_000,
                      "transform_graph_s": info["transform_graph_seconds"],
                      "transform_layout_s": info["transform_layout_seconds"],
                      "wall_s": wall, "peak_mb": peak_mb(), "load_before": before, "load_after": load(),
                      "umap": info["umap_version"], "model": tv.manifest["model"]}, indent=1), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--lines", type=int, default=32_000)
    parser.add_argument("--index-layers", default="4", help="comma-separated hidden states to index and query")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--hnsw-rows", type=int, default=0, help="build HNSW on this many rows (0: skip)")
    parser.add_argument("--encoder-texts", default="2000", help="texts of the encoder-only measurement: a number, "
                        "all (the same texts as the extraction), or 0 to skip it")
    parser.add_argument("--flat-layers", default="", help="also build the exact index of these hidden states "
                        "(comma-separated, or all) and time each")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--umap-vectors", help="only time the UMAP map of this extraction (a fresh process)")
    parser.add_argument("--umap-layer", type=int, help="hidden state of the UMAP map (default: the last)")
    parser.add_argument("--umap-sample", type=int, default=20_000)
    args = parser.parse_args()
    if args.umap_vectors:
        bench_umap(args)
        return

    import torch

    from analysis.core.activations import bucket_indices, hidden_states, make_batch, max_input_length
    from analysis.core.inputs import TextInputs
    from analysis.tokens.corpus import from_texts
    from analysis.tokens.vectors import extract
    from models.loading import ModelSpec, load_model

    report: dict = {"machine": subprocess.run(["lscpu"], capture_output=True, text=True).stdout.split("Model name:")[
        -1].split("\n")[0].strip(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "load_average_start": load()}
    loaded = load_model(ModelSpec(args.model, device="cpu"))
    report["model"], report["hidden_states"] = args.model, loaded.num_layers + 1
    report["peaks"] = matrix_peaks(loaded.anatomy.hidden_size)
    print(json.dumps(report, indent=1), flush=True)
    texts = lines_of(SHARED / "english_corpus" / "train.txt.gz", args.lines)
    corpus = from_texts(loaded.tokenizer, TextInputs(tuple(texts)), max_input_length(loaded))
    report["texts"], report["tokens"] = len(texts), corpus.n_rows
    batches = list(bucket_indices(corpus.encoded, args.batch_size, loaded))
    flops = forward_flops(loaded, corpus.encoded, batches)
    report["padded_tokens"] = sum(len(i) * max(len(corpus.encoded.input_ids[t]) for t in i) for i in batches)
    with torch.inference_mode():  # warm-up: the first forward passes pay one-time set-up
        hidden_states(loaded, make_batch(corpus.encoded, batches[len(batches) // 2][:8], loaded.tokenizer.pad_token_id))

    # 1. the probe's encoder alone (hidden_states over the same length buckets, same batch size)
    if args.encoder_texts != "0":
        if args.encoder_texts == "all":
            enc, enc_batches, enc_flops = corpus, batches, flops
        else:
            sub = TextInputs(tuple(texts[:int(args.encoder_texts)]))
            enc = from_texts(loaded.tokenizer, sub, max_input_length(loaded))
            enc_batches = list(bucket_indices(enc.encoded, args.batch_size, loaded))
            enc_flops = forward_flops(loaded, enc.encoded, enc_batches)
        counted = int(enc.counts.sum())
        start = time.perf_counter()
        with torch.inference_mode():
            for idx in enc_batches:
                hidden_states(loaded, make_batch(enc.encoded, idx, loaded.tokenizer.pad_token_id))
        secs = time.perf_counter() - start
        report.update(encoder_texts=len(enc.encoded), encoder_tokens=counted, encoder_seconds=secs,
                      encoder_tokens_per_s=counted / secs, encoder_gflops=enc_flops / secs / 1e9,
                      encoder_share_of_fp32_peak=enc_flops / secs / 1e9 / report["peaks"]["fp32_peak_gflops"],
                      encoder_load=load())

    start = time.perf_counter()
    tv = extract(loaded, corpus, batch_size=args.batch_size)
    seconds = time.perf_counter() - start
    report.update(extraction_seconds=seconds, extraction_tokens_per_s=corpus.n_rows / seconds,
                  extraction_gflops=flops / seconds / 1e9,
                  extraction_share_of_fp32_peak=flops / seconds / 1e9 / report["peaks"]["fp32_peak_gflops"],
                  extraction_load=load(), disk_bytes=tv.disk_bytes(),
                  disk_bytes_formula=f"{tv.rows} x {len(tv.layers)} x {tv.hidden} x 2 + headers",
                  layers=tv.layers, hidden=tv.hidden, vectors=str(tv.directory),
                  shards=len(tv.manifest["shards"]), peak_mb_after_extraction=peak_mb())
    if args.encoder_texts != "0":
        report["extraction_vs_encoder"] = report["extraction_tokens_per_s"] / report["encoder_tokens_per_s"]
    print(json.dumps(report, indent=1), flush=True)
    loaded = None  # the model is not needed by the indexes and queries

    from analysis.tokens import search

    flat_layers = tv.layers if args.flat_layers == "all" else [int(x) for x in args.flat_layers.split(",") if x]
    for layer in flat_layers:
        info = search.build_index(tv, layer, "flat", force=True)
        print(json.dumps({"layer": layer, "flat_build_s": info["build_seconds"], "flat_bytes": info["bytes"],
                          "peak_mb": peak_mb(), "load": load()}), flush=True)

    rng = np.random.default_rng(0)
    for layer in [int(x) for x in args.index_layers.split(",")]:
        print(json.dumps(bench_layer(tv, layer, args, rng)), flush=True)
    report["peaks_end"] = matrix_peaks(tv.hidden)
    print(json.dumps({"peak_mb": peak_mb(), "load_average_end": load(), "peaks_end": report["peaks_end"]}),
          flush=True)


if __name__ == "__main__":
    main()
