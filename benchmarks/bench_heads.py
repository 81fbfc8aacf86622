"""Attention heads at bert-base size (issue 36): every statistic, the head map and every relation in one pass.

    python -m benchmarks.bench_heads [--model random:../shared/data/tokenizers/bert-base-uncased] [--device cpu]
        [--sentences 1000] [--naive-sentences 40]

1. **Ours**: ``analysis.heads.run.analyse`` on the first ``--sentences`` sentences of UD English-EWT dev (the
   committed tiny fixture otherwise): token statistics with intervals, the JS/MDS head map, per-relation accuracy,
   baselines and attention-tree UUAS. Wall seconds, CPU seconds (this process, after loading) and the process's
   peak resident memory (the model included).
2. **The naive way**, on the first ``--naive-sentences`` sentences: every attention map kept (one sentence at a
   time through the model, a list of numpy arrays), then each statistic, each word map, each relation's argmax
   and each head's Prim tree computed in Python loops. The ratio is per sentence (the naive loop on 1,000
   sentences would take hours).
3. **Against the hardware**: the float32 matrix peak of the device that runs the model (:mod:`benchmarks.peak`:
   a 2048^3 product on a CPU, 8192^3 on a GPU) measured in the same run, and the forward
   pass's matrix FLOPs (``24 d^2`` per token per layer for the projections and feed-forward, ``4 n d`` for the
   attention products) over our wall time, as a fraction of that peak.

``--importance ROWS`` measures the issue's second target instead: head importance (Michel et al. 2019, the MLM
loss: the demo model has no classifier) and a 10-point pruning curve (the importance order and 3 random orders)
on the texts of the first ROWS rows of SST-2 dev (the demo sentiment set without ``../shared``), on the demo
model. The naive way is importance by ablation: the loss with each head masked in turn, one pass over the texts
per head (``layers x heads + 1`` passes) against our one backward pass; both on the same batches.
"""

import argparse
import math
import resource
import time

import numpy as np
import torch

from benchmarks import SHARED, data_file
from benchmarks.peak import device_name, gemm_tflops

TOKENIZER = SHARED / "tokenizers" / "bert-base-uncased"


def gemm_gflops(device: str = "cpu") -> float:
    """The float32 matrix peak of the device that runs the model, this run (:mod:`benchmarks.peak`)."""
    return gemm_tflops(device) * 1000


def naive(loaded, sentences) -> float:
    """Seconds for the naive way on ``sentences``: keep every map, then loop in Python."""
    from analysis.core.trees import non_punct, prim_edges

    tok = loaded.tokenizer
    start = time.perf_counter()
    kept = []
    with torch.no_grad():
        for s in sentences:
            enc = tok(list(s.words), is_split_into_words=True, return_tensors="pt").to(loaded.spec.device)
            maps = loaded.model.base_model(**enc, output_attentions=True).attentions
            kept.append((enc.word_ids(), enc["input_ids"][0].tolist(), [a[0].float().cpu().numpy() for a in maps]))
    punct = {i for i, t in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))) if t in {".", ",", "!", "?"}}
    correct = {}
    for s, (word_ids, ids, maps) in zip(sentences, kept, strict=True):
        n, m = len(ids), len(s)
        for layer, a in enumerate(maps):
            for h in range(a.shape[0]):
                rows = a[h]
                for i in range(n):
                    _ = (-sum(p * math.log(p) for p in rows[i] if p > 0), rows[i][0],
                         sum(rows[i][j] for j in range(n) if ids[j] == tok.sep_token_id),
                         sum(rows[i][j] for j in range(n) if ids[j] in punct), rows[i][i],
                         rows[i][i - 1] if i else 0, rows[i][i + 1] if i + 1 < n else 0,
                         sum(rows[i][j] * abs(i - j) for j in range(n)))
                words = np.zeros((m, m))
                for wi in range(m):
                    src = [t for t, w in enumerate(word_ids) if w == wi]
                    for wj in range(m):
                        dst = [t for t, w in enumerate(word_ids) if w == wj]
                        words[wi, wj] = np.mean([sum(rows[t][u] for u in dst) for t in src])
                for wi, (head, rel) in enumerate(zip(s.heads, s.deprels, strict=True)):
                    if head:
                        pred = max((j for j in range(m) if j != wi), key=lambda j: words[wi, j], default=-1)
                        correct[rel, layer, h] = correct.get((rel, layer, h), 0) + (pred == head - 1)
                keep = np.flatnonzero(non_punct(s))
                prim_edges(-np.maximum(words, words.T)[np.ix_(keep, keep)])
    return time.perf_counter() - start


def importance_bench(rows: int) -> None:
    from analysis.core.inputs import read_file
    from analysis.heads import importance as imp
    from analysis.heads.model import head_shape
    from models.loading import load_model
    from models.spec import ModelSpec

    path = data_file("sst2/dev.tsv", "../../analysis/data/demo_sentiment.csv")
    texts = read_file(path, "text", limit=rows)
    loaded = load_model(ModelSpec("demo", device="cpu"))
    config = loaded.model.config
    layers, heads = head_shape(loaded.model)
    peak = gemm_gflops()
    model, batches = imp.scored_mlm(loaded, texts)  # what mlm_importance scores: the head at the masked rows only
    tokens = sum(int(b.inputs["attention_mask"].sum()) for b in batches)
    calls = []
    real_mean_loss = imp.mean_loss

    def counted(*args, **kwargs):  # each call is one pass over the texts
        calls.append(1)
        return real_mean_loss(*args, **kwargs)

    imp.mean_loss = counted
    cpu, wall = time.process_time(), time.perf_counter()
    result = imp.head_importance(model, batches, encoder=loaded.model, steps=10)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    imp.mean_loss = real_mean_loss
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    d, inner = config.hidden_size, config.intermediate_size
    per_pass = tokens * layers * (8 * d * d + 4 * d * inner) + result.info["targets"] * 2 * d * config.vocab_size
    passes = 3 + len(calls)  # the importance pass (a backward ~ 2 forwards), then each scored set of masked heads
    print(f"demo ({layers} layers x {heads} heads), {len(texts)} texts from {path}, {tokens:,} tokens, "
          f"{result.info['targets']:,} masked targets: importance + pruning curve ({len(result.pruning)} points) + "
          f"prunable shares in {wall:.1f} s wall, {cpu:.1f} s CPU; peak resident memory {rss:,.0f} MB")
    print(f"matrix peak {peak:.1f} GFLOP/s (this run); about {passes} forward-pass equivalents of "
          f"{per_pass / 1e9:.1f} GFLOP: {per_pass * passes / wall / 1e9:.1f} GFLOP/s, "
          f"{per_pass * passes / wall / 1e9 / peak:.0%} of the peak")
    start = time.perf_counter()
    gradient = np.abs(imp.example_gradients(model, batches, loaded.model)).mean(0)
    ours = time.perf_counter() - start
    start = time.perf_counter()
    base, _ = imp.mean_loss(model, batches, torch.ones(layers, heads), loaded.model)
    ablation = np.zeros((layers, heads))
    for layer in range(layers):
        for head in range(heads):
            gates = torch.ones(layers, heads)
            gates[layer, head] = 0
            ablation[layer, head] = imp.mean_loss(model, batches, gates, loaded.model)[0] - base
    naive_seconds = time.perf_counter() - start
    agree = np.corrcoef(gradient.ravel(), np.abs(ablation).ravel())[0, 1]
    print(f"importance by gradient {ours:.1f} s against by ablation ({layers * heads + 1} passes) {naive_seconds:.1f} "
          f"s: {naive_seconds / ours:.1f}x; the two rankings' Pearson correlation {agree:.2f}")
    mine = result.pruning[result.pruning.order == "importance"].set_index("fraction")["accuracy"]
    chance = result.pruning[result.pruning.order == "random"].groupby("fraction")["accuracy"].mean()
    print("pruning curve (MLM token accuracy): fraction masked, importance order, random orders' mean")
    for fraction in mine.index:
        print(f"  {fraction:.2f}  {mine[fraction]:.4f}  {chance[fraction]:.4f}")
    print(result.layers.to_string(index=False))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=f"random:{TOKENIZER}")
    p.add_argument("--device", default="cpu")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--naive-sentences", type=int, default=40)
    p.add_argument("--importance", type=int, metavar="ROWS", help="the importance target instead (see above)")
    args = p.parse_args()
    if args.importance:
        importance_bench(args.importance)
        return

    from analysis.core.treebank import Treebank, read_conllu
    from analysis.heads.model import load_eager
    from analysis.heads.run import analyse
    from models.spec import ModelSpec

    bank = read_conllu(data_file("ud_english_ewt/en_ewt-ud-dev.conllu.gz", "ud_tiny_train.conllu"), args.sentences)
    loaded = load_eager(ModelSpec(args.model, device=args.device))
    config = loaded.model.config
    print(f"model {args.model} ({config.num_hidden_layers} layers x {config.num_attention_heads} heads, eager "
          f"attention); torch threads {torch.get_num_threads()}; {len(bank.sentences)} sentences from {bank.path}")
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak = gemm_gflops(loaded.spec.device)
    print(f"device {device_name(loaded.spec.device)}")

    cpu, wall = time.process_time(), time.perf_counter()
    result = analyse(loaded, bank)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    info = result.info
    tokens, d, layers = info["tokens"], config.hidden_size, config.num_hidden_layers
    mean_n = tokens / info["sentences"]
    flops = tokens * layers * (24 * d * d + 4 * mean_n * d)
    print(f"ours: {info['sentences']} sentences, {tokens:,} tokens, {len(result.relations) // 2} relations, "
          f"{info['cluster_tokens']} tokens in the head map: {wall:.1f} s wall, {cpu:.1f} s CPU after loading; "
          f"peak resident memory {rss:,.0f} MB (after loading: {rss_loaded:,.0f} MB)")
    print(f"matrix peak {peak:.1f} GFLOP/s (float32 product on the model's device, this run); the forward pass's "
          "matrix work "
          f"{flops / 1e12:.2f} TFLOP in {wall:.1f} s = {flops / wall / 1e9:.1f} GFLOP/s, "
          f"{flops / wall / 1e9 / peak:.0%} of the peak")

    few = Treebank(bank.path, bank.sentences[:args.naive_sentences])
    start = time.perf_counter()
    analyse(loaded, few)
    ours_few = time.perf_counter() - start
    naive_seconds = naive(loaded, few.sentences)
    per_ours, per_naive = wall / info["sentences"], naive_seconds / len(few.sentences)
    print(f"naive loop (every map kept, statistics in Python) on {len(few.sentences)} sentences: "
          f"{naive_seconds:.1f} s against ours {ours_few:.2f} s on the same sentences; per sentence naive "
          f"{per_naive * 1e3:.0f} ms vs ours (1,000-sentence run) {per_ours * 1e3:.1f} ms: {per_naive / per_ours:.0f}x")
    best = result.relations.sort_values("count", ascending=False).head(5)
    print("largest relations (random weights: near the baselines):")
    print(best.to_string(index=False))


if __name__ == "__main__":
    main()
