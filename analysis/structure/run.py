"""One linguistic-structure run: word vectors of both files, then per layer the label probes (with control tasks
and MDL) and the structural probes, then where each task lives. Tables for ``probes.csv``, ``mdl.csv``,
``summary.csv``, the records of ``trees.jsonl`` and the facts for ``run.json``."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pandas as pd
import torch
from threadpoolctl import threadpool_limits

from analysis.core.inputs import InputError, TextInputs
from analysis.core.layers import parse_layers
from analysis.core.parallel import ONE, Ranks
from analysis.core.scores import class_baseline, majority_class, wilson_interval
from analysis.core.separability import check_labels, out_of_fold
from analysis.core.store import ArrayStore
from analysis.core.treebank import Treebank
from analysis.core.vectors import Progress, representations
from analysis.structure import mdl, probes, structural
from analysis.structure.options import StructureOptions, check_rank
from analysis.structure.summary import BOOTSTRAP, LayerCounts, resample_weights, summarise
from analysis.structure.words import WordVectors, extract
from models.loading import LoadedModel

PRIMARY = {"upos": "accuracy", "deprel": "accuracy", "distance": "uuas", "depth": "root_acc", "label": "accuracy"}


@dataclasses.dataclass
class StructureResult:
    probes: pd.DataFrame  # layer, task, metric, value, ci_low, ci_high, majority_baseline, position_baseline,
    # control, selectivity
    mdl: pd.DataFrame  # layer, task, codelength_bits, uniform_bits, compression, examples, classes
    summary: pd.DataFrame
    trees: list[dict]
    info: dict


def _row(layer, task, metric, value, ci, baseline=math.nan, control=math.nan, position=math.nan):
    return {"layer": layer, "task": task, "metric": metric, "value": float(value), "ci_low": float(ci[0]),
            "ci_high": float(ci[1]), "majority_baseline": float(baseline), "position_baseline": float(position),
            "control": float(control), "selectivity": float(value - control) if not math.isnan(control) else math.nan}


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


class Steps:
    """The probes' progress in steps (a label fit, an MDL block, a structural probe's epoch): the fits' threads
    count them (:meth:`tick`), the calling thread reports each one (:meth:`wait`) as ``probes done/total``: the
    page's Stop and a job's Cancel act there (they raise from ``progress``), and the fits still running then stop
    at their next step."""

    def __init__(self, total: int, progress: Progress | None):
        self.total, self.done, self.progress = total, 0, progress
        self._ticks: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.stop = threading.Event()

    def tick(self, n: int = 1) -> None:
        if self.stop.is_set():
            raise Stopped("stopped")
        self._ticks.put(n)

    def counted(self, fit: Callable) -> Callable:
        """``fit`` that counts one step when it returns."""
        def run(*args):
            result = fit(*args)
            self.tick()
            return result
        return run

    def _report(self, n: int) -> None:
        if n:
            self.done += n
            if self.progress:
                self.progress("probes", min(self.done, self.total), self.total)

    def wait(self, future: Future):
        """``future``'s result, reporting every step counted meanwhile (its end wakes this thread too)."""
        future.add_done_callback(lambda _: self._ticks.put(0))
        try:
            while not future.done():
                with contextlib.suppress(queue.Empty):
                    self._report(self._ticks.get(timeout=1.0))
            self.finish()
            return future.result()
        except BaseException:
            self.stop.set()
            raise

    def finish(self) -> None:
        """Report the steps counted and not reported yet."""
        while not self._ticks.empty():
            self._report(self._ticks.get_nowait())


class Stopped(Exception):
    """A fit ended early because the run was stopped (never seen by the caller: the stop's own exception is)."""


@contextlib.contextmanager
def _cancel_pending(pool: ThreadPoolExecutor, steps: Steps):
    """On an error or a cancellation (``progress`` raising), drop the fits not yet started and have the running
    ones stop at their next step."""
    try:
        yield
    except BaseException:
        steps.stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise


def _codelength(train: probes.LabelData, features: np.ndarray, options: StructureOptions,
                tick: Callable[[], None]) -> mdl.Codelength:
    names = sorted(set(train.labels.tolist()))
    ids = np.searchsorted(names, train.labels.astype(str))
    fit_proba = mdl.probe_fit_proba(options.probe, options.seed)

    def counted(*args):
        out = fit_proba(*args)
        tick()
        return out
    return mdl.online_codelength(features, ids, counted, len(names), options.seed)


def _structural(task: str, x: dict, vec: dict, sents: dict, rank: int, options: StructureOptions, seed: int,
                steps: Steps) -> dict:
    fitted = structural.train(task, x["train"], vec["train"].offsets, sents["train"], rank, seed,
                              options.max_epochs, on_epoch=steps.tick)
    steps.tick(options.max_epochs - fitted.epochs)  # stopped early: the epochs it did not need
    preds = structural.predict(fitted.probe, x["test"], vec["test"].offsets, sents["test"])
    scores = structural.distance_scores if task == "distance" else structural.depth_scores
    return scores(preds, sents["test"])


def _sentence_label(x: np.ndarray, labels: np.ndarray, seed: int) -> dict:
    """The atlas's probe of a labelled set at one layer: its out-of-fold predictions (every row once), scored."""
    oof, _ = out_of_fold(x, labels, seed=seed)
    correct = np.asarray(oof == labels, dtype=float)
    return {"correct": correct, "accuracy": float(correct.mean()),
            "ci": wilson_interval(int(correct.sum()), len(correct))}


def _steps_per_layer(tasks: list[str], options: StructureOptions, n_train: dict, seeds: int) -> int:
    """The steps of one layer: per label task its fit and its control's (and the MLP's fit per further seed),
    its MDL blocks; per structural task ``max_epochs`` per seed; the labelled set's probe once per seed."""
    total = 0
    for t in tasks:
        if t in probes.LABEL_TASKS:
            total += 2 + (seeds - 1) * (options.probe == "mlp")
            total += len(mdl.block_ends(n_train[t])) - 1 if options.mdl else 0
        elif t in structural.STRUCTURAL_TASKS:
            total += options.max_epochs * seeds
        else:
            total += seeds
    return total


def run_structure(loaded: LoadedModel, train: Treebank, test: Treebank, options: StructureOptions,
                  progress: Progress | None = None, store: ArrayStore | None = None, ranks: Ranks = ONE,
                  labelled: TextInputs | None = None, label_pooling: str = "cls") -> StructureResult | None:
    """The analysis (module docstring). Under a launcher (``ranks``) the word vectors are extracted by every
    process and the probes run in the main one; the others return None.

    ``labelled``: a labelled set of texts (the atlas's input): its task label becomes one more task, ``label``,
    scored per layer as the atlas scores it (:func:`analysis.atlas.atlas.separability`'s probe, out of fold on the
    sentence vectors pooled by ``label_pooling``, from the atlas's cache), so the summary says where the task
    label peaks beside POS and syntax. Its intervals resample the labelled texts.

    ``options.seeds`` N > 1: every probe whose training depends on the seed (the structural probes, the MLP label
    probe, the labelled set's folds) is trained again with seeds ``seed + 1 .. seed + N - 1``; the linear label
    probe is deterministic (a convex objective from zero, no seed), so its counts are the same for every seed.
    ``summary.csv``'s intervals then pool the seeds (:mod:`analysis.structure.summary`); every other number is the
    first seed's. Progress: the stage ``probes`` counts steps (a label fit, an MDL block, a structural epoch)."""
    tasks = options.task_list
    n_states = loaded.num_layers + 1
    layers = parse_layers(options.layers, n_states)
    tree_layers = [] if options.tree_layers.strip().lower() == "none" else parse_layers(options.tree_layers, n_states)
    hidden = loaded.anatomy.hidden_size
    rank = check_rank(options.rank, hidden)
    seeds = [options.seed + k for k in range(options.seeds)]
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
    rows, mdl_rows, trees = [], [], {}

    label = {t: {n: probes.label_data(t, sents[n], vec[n].offsets) for n in vec} for t in tasks
             if t in probes.LABEL_TASKS}
    for t, data in label.items():
        if len(set(data["train"].labels.tolist())) < 2:
            raise InputError(f"{train.path}: the training file has a single {t} label; a probe needs two")
    controls = {t: probes.control_labels(d["train"], set(d["train"].types) | set(d["test"].types), options.seed)
                for t, d in label.items()}
    position = (structural.position_baselines(sents["train"], sents["test"])
                if set(tasks) & set(structural.STRUCTURAL_TASKS) else None)
    steps = Steps(len(layers) * _steps_per_layer(tasks, options, {t: len(d["train"].labels) for t, d in label.items()},
                                                 len(seeds)), progress)
    per_layer: dict[str, dict[int, list[tuple]]] = {t: {} for t in tasks}  # per layer, per seed: (correct, total)
    with parallel_fits() as workers, ThreadPoolExecutor(workers) as pool, _cancel_pending(pool, steps):
        for layer in layers:
            x = {n: vec[n].layer(layer) for n in vec}  # one layer in memory at a time
            jobs = {}
            for t, data in label.items():
                tr, te = data["train"], data["test"]
                fx = (tr.features(x["train"]), te.features(x["test"]))  # shared, read-only, by the fits below
                fit = steps.counted(probes.run_layer)
                jobs[t, "task"] = pool.submit(fit, options.probe, tr, te, *fx, n_test, options.seed)
                jobs[t, "control"] = pool.submit(fit, options.probe, probes.with_control(
                    tr, controls[t]), probes.with_control(te, controls[t]), *fx, n_test, options.seed)
                if options.mdl:
                    jobs[t, "mdl"] = pool.submit(_codelength, tr, fx[0], options, steps.tick)
                for s in seeds[1:] if options.probe == "mlp" else ():
                    jobs[t, "task", s] = pool.submit(fit, options.probe, tr, te, *fx, n_test, s)
            for t in (t for t in tasks if t in structural.STRUCTURAL_TASKS):
                for s in seeds:
                    jobs[t, "structural", s] = pool.submit(_structural, t, x, vec, sents, rank, options, s, steps)
            if reps is not None:
                for s in seeds:
                    jobs["label", "task", s] = pool.submit(steps.counted(_sentence_label), reps[layer],
                                                           sentence_labels, s)
            for t in tasks:
                if t == "label":
                    r = steps.wait(jobs[t, "task", options.seed])
                    rows.append(_row(layer, t, "accuracy", r["accuracy"], r["ci"], label_base["accuracy"]))
                    correct = [steps.wait(jobs[t, "task", k])["correct"] for k in seeds]
                    per_layer[t][layer] = [(c, np.ones_like(c)) for c in correct]
                elif t in label:
                    s, c = steps.wait(jobs[t, "task"]), steps.wait(jobs[t, "control"])
                    base = probes.baseline(label[t]["train"], label[t]["test"])
                    rows.append(_row(layer, t, "accuracy", s.accuracy, s.accuracy_ci, base["accuracy"], c.accuracy))
                    rows.append(_row(layer, t, "macro_f1", s.macro_f1, s.macro_f1_ci, base["macro_f1"], c.macro_f1))
                    others = [steps.wait(jobs[t, "task", k]) if (t, "task", k) in jobs else s for k in seeds[1:]]
                    per_layer[t][layer] = [(o.correct_per_sentence, o.examples_per_sentence) for o in [s, *others]]
                    if t == "upos" and layer in tree_layers:
                        trees.setdefault("upos", {})[layer] = s.predictions
                    if options.mdl:
                        code = steps.wait(jobs[t, "mdl"])
                        mdl_rows.append({"layer": layer, "task": t, "codelength_bits": code.online_bits,
                                         "uniform_bits": code.uniform_bits, "compression": code.compression,
                                         "examples": code.n, "classes": code.classes})
                else:
                    sc = steps.wait(jobs[t, "structural", options.seed])
                    if t == "distance":
                        rows.append(_row(layer, t, "uuas", sc["uuas"],
                                         _boot_interval(sc["correct"], sc["total"], weights),
                                         position=position["uuas"]))
                        if layer in tree_layers:
                            trees.setdefault("distance", {})[layer] = (sc["edges"], sc["correct"], sc["total"])
                    else:
                        rows.append(_row(layer, t, "root_acc", sc["root_acc"],
                                         wilson_interval(int(sc["correct"].sum()), int(sc["total"].sum())),
                                         position=position["root_acc"]))
                    lengths = [len(s) for s in sents["test"]]
                    boot = structural.length_average(sc["rows"], lengths, weights)
                    rows.append(_row(layer, t, "spearman", sc["spearman"], probes.percentile_interval(
                        boot[np.isfinite(boot)]) if np.isfinite(boot).any() else (math.nan, math.nan)))
                    per_layer[t][layer] = [(r["correct"], r["total"]) for r in
                                           [sc, *(steps.wait(jobs[t, "structural", k]) for k in seeds[1:])]]
            del x, jobs
        steps.finish()
    counts = [LayerCounts(t, PRIMARY[t], layers, *(np.stack([np.stack([per_layer[t][la][k][i] for la in layers])
                                                             for k in range(len(seeds))]) for i in (0, 1)))
              for t in tasks]
    summary = summarise(counts, BOOTSTRAP, options.seed)
    info = {"options": options.to_dict(), "layers": layers, "rank": rank if set(tasks) & {"distance", "depth"}
            else None, "train": {**train.to_dict(), **_dropped(vec["train"], train)},
            "test": {**test.to_dict(), **_dropped(vec["test"], test)}, **_vector_info(vec),
            "bootstrap": BOOTSTRAP, "test_sentences_scored": n_test, "seeds": seeds,
            "summary_interval": summary_interval(len(seeds)),
            "root_arcs": "excluded from deprel (the root's label is fixed by HEAD 0)",
            "position_baselines": None if position is None else {**position, "definition": POSITION_BASELINES},
            "label_task": None if reps is None else {
                "texts": len(labelled), "classes": len(set(labelled.labels)), "pooling": label_pooling,
                "probe": "the atlas's: StandardScaler + LogisticRegression(max_iter=1000), 5-fold out-of-fold",
                "interval": "95% Wilson (probes.csv); bootstrap over the labelled texts (summary.csv)"},
            "punctuation": "UPOS PUNCT excluded from UUAS and root accuracy"}
    return StructureResult(pd.DataFrame(rows), pd.DataFrame(mdl_rows), summary,
                           _tree_records(sents["test"], test, vec["test"], trees), info)


POSITION_BASELINES = ("probes.csv's position_baseline: positions alone, on the same test sentences. UUAS: the "
                      "right-branching chain (each non-punctuation word linked to the next). Root accuracy: the "
                      "training file's most frequent root position among the non-punctuation words (root_position, "
                      "0-based; the last word of a shorter sentence)")


def summary_interval(seeds: int) -> str:
    """What ``summary.csv``'s intervals cover (run.json, the page's caption)."""
    if seeds == 1:
        return ("95% percentile bootstrap over the test sentences (1,000 resamples) with the probes trained once "
                "(one seed): the test set's sampling error only, not the spread over training seeds "
                "(--seeds N for that)")
    return (f"95% percentile bootstrap over the test sentences (1,000 resamples) pooled over {seeds} training "
            "seeds (resample b rescores seed b mod N): the test set's sampling error and the seed-to-seed spread; "
            "it is wider than one seed's only where the seeds' best layers (centers of gravity) disagree")


LISTED = 100  # run.json lists at most this many dropped sentence ids per reason


def _dropped(v: WordVectors, bank: Treebank) -> dict:
    """The sentences left out of a file, per reason: the counts, and the first :data:`LISTED` ids of each."""
    return {"dropped_too_long": len(v.too_long), "dropped_no_subword": len(v.no_subword),
            "dropped_too_long_ids": [bank.sentences[i].sent_id for i in v.too_long[:LISTED]],
            "dropped_no_subword_ids": [bank.sentences[i].sent_id for i in v.no_subword[:LISTED]],
            "dropped_ids_listed": f"the first {LISTED} of each reason (counts: dropped_too_long, dropped_no_subword)"}


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
