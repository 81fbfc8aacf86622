"""One linguistic-structure run: word vectors of both files, then per layer the label probes (with control tasks
and MDL) and the structural probes, then where each task lives. Tables for ``probes.csv``, ``mdl.csv``,
``summary.csv``, the records of ``trees.jsonl`` and the facts for ``run.json``."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import torch
from threadpoolctl import threadpool_limits

from analysis.inputs import InputError, TextInputs
from analysis.parallel import ONE, Ranks
from analysis.projection import check_labels, out_of_fold, parse_layers, representations
from analysis.scores import class_baseline, majority_class, wilson_interval
from analysis.store import ArrayStore
from analysis.structure import mdl, probes, structural
from analysis.structure.options import StructureOptions, check_rank
from analysis.structure.summary import BOOTSTRAP, LayerCounts, resample_weights, summarise
from analysis.structure.treebank import Treebank
from analysis.structure.words import WordVectors, extract
from models.loading import LoadedModel

Progress = Callable[[str, int, int], None]
PRIMARY = {"upos": "accuracy", "deprel": "accuracy", "distance": "uuas", "depth": "root_acc", "label": "accuracy"}


@dataclasses.dataclass
class StructureResult:
    probes: pd.DataFrame  # layer, task, metric, value, ci_low, ci_high, majority_baseline, control, selectivity
    mdl: pd.DataFrame  # layer, task, codelength_bits, uniform_bits, compression, examples, classes
    summary: pd.DataFrame
    trees: list[dict]
    info: dict


def _row(layer, task, metric, value, ci, baseline=math.nan, control=math.nan):
    return {"layer": layer, "task": task, "metric": metric, "value": float(value), "ci_low": float(ci[0]),
            "ci_high": float(ci[1]), "majority_baseline": float(baseline), "control": float(control),
            "selectivity": float(value - control) if not math.isnan(control) else math.nan}


def _boot_interval(correct: np.ndarray, total: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    with np.errstate(invalid="ignore", divide="ignore"):
        samples = (weights @ correct) / (weights @ total)
    return probes.percentile_interval(samples[np.isfinite(samples)])


@contextlib.contextmanager
def parallel_fits():
    """Run the probes of a layer side by side, one thread each, instead of one probe at a time on every core:
    the fits are independent, and their small matrix products (17-48 classes) scale poorly across threads
    (on 2 cores, two UPOS fits took 12.5 s side by side against 22.1 s one after the other, the machine
    shared). Yields the number of workers, the cores torch would use; restores torch's and the BLAS's threads."""
    workers = max(1, torch.get_num_threads())
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            yield workers
    finally:
        torch.set_num_threads(workers)


@contextlib.contextmanager
def _cancel_pending(pool: ThreadPoolExecutor):
    """On an error or a cancellation (``progress`` raising), drop the fits not yet started."""
    try:
        yield
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise


def _codelength(train: probes.LabelData, features: np.ndarray, options: StructureOptions) -> mdl.Codelength:
    names = sorted(set(train.labels.tolist()))
    ids = np.searchsorted(names, train.labels.astype(str))
    return mdl.online_codelength(features, ids, mdl.probe_fit_proba(options.probe, options.seed), len(names),
                                 options.seed)


def _structural(task: str, x: dict, vec: dict, sents: dict, rank: int, options: StructureOptions) -> dict:
    fitted = structural.train(task, x["train"], vec["train"].offsets, sents["train"], rank, options.seed,
                              options.max_epochs)
    preds = structural.predict(fitted.probe, x["test"], vec["test"].offsets, sents["test"])
    scores = structural.distance_scores if task == "distance" else structural.depth_scores
    return scores(preds, sents["test"])


def _sentence_label(x: np.ndarray, labels: np.ndarray, seed: int) -> dict:
    """The atlas's probe of a labelled set at one layer: its out-of-fold predictions (every row once), scored."""
    oof, _ = out_of_fold(x, labels, seed=seed)
    correct = np.asarray(oof == labels, dtype=float)
    return {"correct": correct, "accuracy": float(correct.mean()),
            "ci": wilson_interval(int(correct.sum()), len(correct))}


def run_structure(loaded: LoadedModel, train: Treebank, test: Treebank, options: StructureOptions,
                  progress: Progress | None = None, store: ArrayStore | None = None, ranks: Ranks = ONE,
                  labelled: TextInputs | None = None, label_pooling: str = "cls") -> StructureResult | None:
    """The analysis (module docstring). Under a launcher (``ranks``) the word vectors are extracted by every
    process and the probes run in the main one; the others return None.

    ``labelled``: a labelled set of texts (the atlas's input): its task label becomes one more task, ``label``,
    scored per layer as the atlas scores it (:func:`analysis.projection.separability`'s probe, out of fold on the
    sentence vectors pooled by ``label_pooling``, from the atlas's cache), so the summary says where the task
    label peaks beside POS and syntax. Its intervals resample the labelled texts."""
    tasks = options.task_list
    n_states = loaded.num_layers + 1
    layers = parse_layers(options.layers, n_states)
    tree_layers = [] if options.tree_layers.strip().lower() == "none" else parse_layers(options.tree_layers, n_states)
    hidden = loaded.anatomy.hidden_size
    rank = check_rank(options.rank, hidden)
    vec: dict[str, WordVectors] = {}
    for name, bank in (("train", train), ("test", test)):
        vec[name] = extract(loaded, [list(s.words) for s in bank.sentences], options.word_vector, options.batch_size,
                            progress=(lambda st, d, t, n=name: progress(f"{n} {st}", d, t)) if progress else None,
                            store=store, ranks=ranks)
    reps = None
    if labelled is not None:
        if not labelled.labels:
            raise InputError("the labelled set has no labels: give its label column")
        check_labels(labelled.labels, 5)
        reps, _ = representations(loaded, labelled, label_pooling, batch_size=options.batch_size, store=store,
                                  ranks=ranks, progress=(lambda st, d, t: progress(f"labelled texts {st}", d, t))
                                  if progress else None)
    if not ranks.is_main:
        return None
    if reps is not None:
        tasks = [*tasks, "label"]
        sentence_labels = np.asarray(labelled.labels, dtype=object)
        label_base = class_baseline(majority_class(list(labelled.labels)), list(labelled.labels),
                                    sorted(set(labelled.labels)))
    sents = {n: [b.sentences[i] for i in vec[n].kept] for n, b in (("train", train), ("test", test))}
    if len(sents["train"]) < 2:
        raise InputError(f"{train.path}: fewer than 2 sentences fit the model's {vec['train'].max_length} tokens")
    n_test = len(sents["test"])
    weights = resample_weights(n_test, BOOTSTRAP, options.seed)
    rows, mdl_rows, counts, trees = [], [], [], {}

    label = {t: {n: probes.label_data(t, sents[n], vec[n].offsets) for n in vec} for t in tasks
             if t in probes.LABEL_TASKS}
    for t, data in label.items():
        if len(set(data["train"].labels.tolist())) < 2:
            raise InputError(f"{train.path}: the training file has a single {t} label; a probe needs two")
    controls = {t: probes.control_labels(d["train"], set(d["train"].types) | set(d["test"].types), options.seed)
                for t, d in label.items()}
    steps, step = len(layers) * len(tasks), 0
    per_layer: dict[str, dict[int, tuple]] = {t: {} for t in tasks}
    with parallel_fits() as workers, ThreadPoolExecutor(workers) as pool, _cancel_pending(pool):
        for layer in layers:
            x = {n: vec[n].layer(layer) for n in vec}  # one layer in memory at a time
            jobs = {}
            for t, data in label.items():
                tr, te = data["train"], data["test"]
                fx = (tr.features(x["train"]), te.features(x["test"]))  # shared, read-only, by the fits below
                jobs[t, "task"] = pool.submit(probes.run_layer, options.probe, tr, te, *fx, n_test, options.seed)
                jobs[t, "control"] = pool.submit(probes.run_layer, options.probe, probes.with_control(
                    tr, controls[t]), probes.with_control(te, controls[t]), *fx, n_test, options.seed)
                if options.mdl:
                    jobs[t, "mdl"] = pool.submit(_codelength, tr, fx[0], options)
            for t in (t for t in tasks if t in structural.STRUCTURAL_TASKS):
                jobs[t, "structural"] = pool.submit(_structural, t, x, vec, sents, rank, options)
            if reps is not None:
                jobs["label", "task"] = pool.submit(_sentence_label, reps[layer], sentence_labels, options.seed)
            for t in tasks:
                if t == "label":
                    r = jobs[t, "task"].result()
                    rows.append(_row(layer, t, "accuracy", r["accuracy"], r["ci"], label_base["accuracy"]))
                    per_layer[t][layer] = (r["correct"], np.ones_like(r["correct"]))
                elif t in label:
                    s, c = jobs[t, "task"].result(), jobs[t, "control"].result()
                    base = probes.baseline(label[t]["train"], label[t]["test"])
                    rows.append(_row(layer, t, "accuracy", s.accuracy, s.accuracy_ci, base["accuracy"], c.accuracy))
                    rows.append(_row(layer, t, "macro_f1", s.macro_f1, s.macro_f1_ci, base["macro_f1"], c.macro_f1))
                    per_layer[t][layer] = (s.correct_per_sentence, s.examples_per_sentence)
                    if t == "upos" and layer in tree_layers:
                        trees.setdefault("upos", {})[layer] = s.predictions
                    if options.mdl:
                        code = jobs[t, "mdl"].result()
                        mdl_rows.append({"layer": layer, "task": t, "codelength_bits": code.online_bits,
                                         "uniform_bits": code.uniform_bits, "compression": code.compression,
                                         "examples": code.n, "classes": code.classes})
                else:
                    sc = jobs[t, "structural"].result()
                    if t == "distance":
                        rows.append(_row(layer, t, "uuas", sc["uuas"],
                                         _boot_interval(sc["correct"], sc["total"], weights)))
                        if layer in tree_layers:
                            trees.setdefault("distance", {})[layer] = (sc["edges"], sc["correct"], sc["total"])
                    else:
                        rows.append(_row(layer, t, "root_acc", sc["root_acc"],
                                         wilson_interval(int(sc["correct"].sum()), int(sc["total"].sum()))))
                    lengths = [len(s) for s in sents["test"]]
                    boot = structural.length_average(sc["rows"], lengths, weights)
                    rows.append(_row(layer, t, "spearman", sc["spearman"], probes.percentile_interval(
                        boot[np.isfinite(boot)]) if np.isfinite(boot).any() else (math.nan, math.nan)))
                    per_layer[t][layer] = (sc["correct"], sc["total"])
                step += 1
                if progress:
                    progress("probes", step, steps)
            del x, jobs
    for t in tasks:
        counts.append(LayerCounts(t, PRIMARY[t], layers, np.stack([per_layer[t][la][0] for la in layers]),
                                  np.stack([per_layer[t][la][1] for la in layers])))
    summary = summarise(counts, BOOTSTRAP, options.seed)
    info = {"options": options.to_dict(), "layers": layers, "rank": rank if set(tasks) & {"distance", "depth"}
            else None, "train": {**train.to_dict(), **_dropped(vec["train"], train)},
            "test": {**test.to_dict(), **_dropped(vec["test"], test)}, **_vector_info(vec),
            "bootstrap": BOOTSTRAP, "test_sentences_scored": n_test,
            "root_arcs": "excluded from deprel (the root's label is fixed by HEAD 0)",
            "label_task": None if reps is None else {
                "texts": len(labelled), "classes": len(set(labelled.labels)), "pooling": label_pooling,
                "probe": "the atlas's: StandardScaler + LogisticRegression(max_iter=1000), 5-fold out-of-fold",
                "interval": "95% Wilson (probes.csv); bootstrap over the labelled texts (summary.csv)"},
            "punctuation": "UPOS PUNCT excluded from UUAS and root accuracy"}
    return StructureResult(pd.DataFrame(rows), pd.DataFrame(mdl_rows), summary,
                           _tree_records(sents["test"], test, vec["test"], trees), info)


def _dropped(v: WordVectors, bank: Treebank) -> dict:
    return {"dropped_too_long": len(v.too_long), "dropped_no_subword": len(v.no_subword),
            "dropped_ids": [bank.sentences[i].sent_id for i in v.too_long + v.no_subword][:100]}


def _vector_info(vec: dict[str, WordVectors]) -> dict:
    v = vec["train"]
    return {"word_vector": v.pooling, "word_vector_text": v.info()["word_vector_text"], "max_tokens": v.max_length,
            "cache_hit": {n: w.cache_hit for n, w in vec.items()}}


def _tree_records(sentences, bank: Treebank, v: WordVectors, trees: dict) -> list[dict]:
    """One record per test sentence: its words, gold UPOS and arcs (1-based, head 0 = root) and, per chosen layer,
    the distance probe's predicted undirected edges (1-based, punctuation excluded) and the UPOS probe's tags."""
    records = []
    distance, upos = trees.get("distance", {}), trees.get("upos", {})
    for s, sentence in enumerate(sentences):
        rec = {"sent_id": sentence.sent_id, "line": sentence.line, "words": list(sentence.words),
               "upos": list(sentence.upos), "deprel": list(sentence.deprels),
               "gold_arcs": [[i + 1, h] for i, h in enumerate(sentence.heads)], "layers": {}}
        start, stop = int(v.offsets[s]), int(v.offsets[s + 1])
        for layer, (edges, correct, total) in distance.items():
            pred, gold = edges[s]
            rec["layers"].setdefault(str(layer), {}).update(
                {"predicted_edges": [[i + 1, j + 1] for i, j in pred], "gold_edges": [[i + 1, j + 1] for i, j in gold],
                 "uuas": float(correct[s] / total[s]) if total[s] else None})
        for layer, pred in upos.items():
            rec["layers"].setdefault(str(layer), {})["predicted_upos"] = pred[start:stop].tolist()
        records.append(rec)
    return records
