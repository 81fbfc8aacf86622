"""The linguistic-structure analysis at bert-base size (issue 27): extraction, then all four tasks on every layer.

    python -m benchmarks.bench_structure [--model random:../shared/data/tokenizers/bert-base-uncased]
        [--layers all] [--max-sentences N] [--naive-layer 6] [--extract-sentences 300]

1. **Extraction**: word vectors of every layer for both files (from the cache when they are there: say so),
   and, on the first ``--extract-sentences`` sentences of the training file, the words' extraction against the
   atlas's extraction of the same sentences as texts (same model, same tokens, fresh caches): tokens per second.
2. **Probes after extraction**, in a child process so that its peak memory is its own: ``run_structure`` on the
   cached vectors (UPOS and DEPREL with control tasks and MDL, distance and depth probes) for ``--layers``;
   seconds, seconds per layer and the 13-layer figure, peak resident memory next to one layer's word vectors.
3. **Against the naive way**, on one layer (``--naive-layer``): the label probes as scikit-learn pipelines
   (StandardScaler + LogisticRegression, its defaults), one after another on every core, against ours on the
   same layer (same examples, task + control + MDL).
4. **Against the hardware**: the float32 matrix peak (a 2048^3 product) and the probe's own rate (its loss and
   gradient are two ``(n, d) x (d, K)`` products per evaluation), measured in the same run.

Defaults: EWT dev -> test from ../shared (the committed tiny fixtures otherwise) and bert-base's architecture
with seeded random weights (the hub is not reachable here).
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

from benchmarks import ROOT, SHARED, data_file

TOKENIZER = SHARED / "tokenizers" / "bert-base-uncased"


def _load(args):
    from analysis.core.treebank import read_conllu
    from models.loading import load_model
    from models.spec import ModelSpec

    train = read_conllu(data_file("ud_english_ewt/en_ewt-ud-dev.conllu.gz", "ud_tiny_train.conllu"),
                        args.max_sentences)
    test = read_conllu(data_file("ud_english_ewt/en_ewt-ud-test.conllu.gz", "ud_tiny_test.conllu"),
                       args.max_sentences)
    return load_model(ModelSpec(args.model, device="cpu")), train, test


def gemm_gflops(n: int = 2048, repeats: int = 3) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def extraction(args, loaded, train, test) -> None:
    from analysis.core.inputs import TextInputs
    from analysis.core.store import ArrayStore
    from analysis.core.vectors import extract as atlas_extract
    from analysis.structure.words import extract

    for name, bank in (("train", train), ("test", test)):
        start = time.perf_counter()
        v = extract(loaded, [list(s.words) for s in bank.sentences])
        print(f"word vectors, {name}: {v.vectors.shape[1]:,} words x {v.vectors.shape[0]} states in "
              f"{time.perf_counter() - start:.1f} s ({'from the cache' if v.cache_hit else 'extracted'}); "
              f"dropped {len(v.too_long)} too long")
    sentences = [list(s.words) for s in train.sentences[:args.extract_sentences]]
    tokens = sum(len(ids) for ids in loaded.tokenizer(sentences, is_split_into_words=True)["input_ids"])
    texts = TextInputs(tuple(" ".join(s) for s in sentences))
    with tempfile.TemporaryDirectory() as tmp:  # a warm-up of both first: the first forward passes pay set-up
        extract(loaded, sentences[:8], store=ArrayStore(tmp))
        atlas_extract(loaded, TextInputs(texts.texts[:8]), pooling="mean")
    with tempfile.TemporaryDirectory() as tmp:
        words = _timed(lambda: extract(loaded, sentences, store=ArrayStore(tmp)))
    atlas = _timed(lambda: atlas_extract(loaded, texts, pooling="mean"))
    print(f"extraction of {len(sentences)} sentences (~{tokens:,} tokens): word vectors {tokens / words:,.0f} "
          f"tokens/s, the atlas's sentence vectors {tokens / atlas:,.0f} tokens/s (ratio {atlas / words:.2f})")


def probes_child(args) -> None:
    """Run in a child process: the probes on cached vectors; prints one JSON line."""
    from analysis.structure.options import StructureOptions
    from analysis.structure.run import run_structure

    loaded, train, test = _load(args)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    options = StructureOptions(layers=args.layers, tree_layers="none")
    start = time.perf_counter()
    result = run_structure(loaded, train, test, options)
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "layers": result.info["layers"], "rss_mb": rss, "model_rss_mb": base_rss,
                      "cache_hit": result.info["cache_hit"], "words": {n: result.info[n]["words"] for n in
                                                                       ("train", "test")},
                      "summary": result.summary.to_dict("records")}))


def naive_against_ours(args, loaded, train, test) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from analysis.structure import mdl, probes
    from analysis.structure.options import StructureOptions
    from analysis.structure.run import run_structure
    from analysis.structure.softmax import fit_softmax
    from analysis.structure.words import extract

    layer = args.naive_layer
    vec = {n: extract(loaded, [list(s.words) for s in b.sentences]) for n, b in (("train", train), ("test", test))}
    sents = {n: [b.sentences[i] for i in vec[n].kept] for n, b in (("train", train), ("test", test))}
    x = {n: np.array(vec[n].vectors[layer]) for n in vec}

    def naive():
        for task in probes.LABEL_TASKS:
            tr, te = (probes.label_data(task, sents[n], vec[n].offsets) for n in ("train", "test"))
            control = probes.control_labels(tr, set(tr.types) | set(te.types), 0)
            xtr, xte = tr.features(x["train"]), te.features(x["test"])

            def sk_fit_proba(a, b, c, k):
                model = make_pipeline(StandardScaler(), LogisticRegression()).fit(a, b)
                out = np.zeros((len(c), k))
                out[:, model.classes_] = model.predict_proba(c)
                return out

            for labels in (tr.labels, probes.with_control(tr, control).labels):
                make_pipeline(StandardScaler(), LogisticRegression()).fit(xtr, labels).predict(xte)
            names = sorted(set(tr.labels.tolist()))
            mdl.online_codelength(xtr, np.searchsorted(names, tr.labels.astype(str)), sk_fit_proba, len(names))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slow = _timed(naive)
    options = StructureOptions(layers=str(layer), tasks="upos,deprel", tree_layers="none")
    ours = _timed(lambda: run_structure(loaded, train, test, options))
    print(f"label probes of layer {layer} (UPOS + DEPREL, task + control + MDL): scikit-learn one after another "
          f"{slow:.1f} s, ours {ours:.1f} s: {slow / ours:.2f}x")

    upos = probes.label_data("upos", sents["train"], vec["train"].offsets)
    xs = upos.features(x["train"])
    seconds = _timed(lambda: fit_softmax(xs, upos.labels))
    model = fit_softmax(xs, upos.labels)
    n, d, k = len(xs), xs.shape[1], len(model.classes_)
    rate = model.n_eval * 4 * n * d * k / seconds / 1e9
    peak = gemm_gflops()
    print(f"one UPOS fit ({n:,} x {d} -> {k} classes, {model.n_eval} evaluations) on every core: {seconds:.2f} s, "
          f"{rate:.1f} GFLOP/s = {rate / peak:.1%} of this run's float32 matrix peak ({peak:.0f} GFLOP/s); "
          "its products are (n, d) x (d, K) with K = 17: memory-bound, not compute-bound")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=f"random:{TOKENIZER}" if TOKENIZER.is_dir() else "random:demo")
    p.add_argument("--layers", default="all")
    p.add_argument("--max-sentences", type=int)
    p.add_argument("--naive-layer", type=int, default=6)
    p.add_argument("--extract-sentences", type=int, default=300)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--skip", default="", help="comma-separated stages to skip: extraction, probes, naive")
    args = p.parse_args()
    if args.child:
        probes_child(args)
        return
    skip = set(args.skip.split(","))
    print(f"model {args.model}; torch threads {torch.get_num_threads()}")
    loaded, train, test = _load(args)
    if "extraction" not in skip:
        extraction(args, loaded, train, test)
    if "probes" not in skip:
        cmd = [sys.executable, "-m", "benchmarks.bench_structure", "--child", "--model", args.model, "--layers",
               args.layers] + (["--max-sentences", str(args.max_sentences)] if args.max_sentences else [])
        out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
        r = json.loads(out)
        per = r["seconds"] / len(r["layers"])
        one_layer = 4 * (r["words"]["train"] + r["words"]["test"]) * loaded.anatomy.hidden_size / 2**20
        print(f"probes after extraction, {len(r['layers'])} layer(s) x 4 tasks (cache hit {r['cache_hit']}): "
              f"{r['seconds']:.0f} s, {per:.1f} s a layer, {13 * per / 60:.1f} min for 13 layers (target 10 min); "
              f"peak RSS {r['rss_mb']:.0f} MB (model and treebanks {r['model_rss_mb']:.0f} MB, one layer's word "
              f"vectors of both files {one_layer:.0f} MB)")
        for row in r["summary"]:
            print("  " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    if "naive" not in skip:
        naive_against_ours(args, loaded, train, test)


if __name__ == "__main__":
    main()
