"""Scores of predicted labels, each with what it should be compared with: accuracy and macro-F1 with the
majority-class baseline, a Wilson interval for an accuracy (it stays in [0, 1]), the confusion matrix, and a
flag for a model that predicts one class only. Used by fine-tuning, the jobs page and the atlas's probe. And the
one sentence bootstrap's draws (:func:`bootstrap_counts`), which the probe's and compare's intervals share."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator

import numpy as np

WILSON = "95% Wilson interval"


DRAW_CELLS = 100_000  # bootstrap indices drawn per call: 800 KB, reused by the allocator
Z95 = 1.959963984540054  # the standard normal quantile of a two-sided 95% interval


def bootstrap_counts(n: int, resamples: int, seed: int = 0, chunk_cells: int = 20_000_000
                     ) -> Iterator[tuple[int, np.ndarray]]:
    """``resamples`` draws of ``n`` rows with replacement (seeded) as ``(start, counts)`` chunks: ``counts``
    ``(rows, n)``, how often each row was drawn in resamples ``start .. start + rows``. The draws are those of one
    ``np.random.default_rng(seed).integers(0, n, (resamples, n))``, made in chunks of at most ``chunk_cells``
    indices (flat memory for many sentences). A statistic that is linear in the rows is then ``counts @ values``.
    Each chunk overwrites the one before (use it before asking for the next). The indices are drawn
    :data:`DRAW_CELLS` at a time: blocks under the allocator's 1 MB mmap threshold are reused, not page-faulted
    in afresh (at 20,000 sentences that was most of the probe's bootstrap time).
    """
    rng = np.random.default_rng(seed)
    step = max(1, min(resamples, chunk_cells // n))
    counts = np.empty((step, n), np.int64)  # one buffer for every chunk: it is yielded and overwritten
    draw = max(1, DRAW_CELLS // n)
    for start in range(0, resamples, step):
        rows = min(step, resamples - start)
        for first in range(0, rows, draw):  # the same stream as one call: integers are drawn one after another
            idx = rng.integers(0, n, size=(min(draw, rows - first), n))
            for row in range(len(idx)):  # a row at a time stays in cache (7x one flat bincount at n = 20,000)
                counts[first + row] = np.bincount(idx[row], minlength=n)
        yield start, counts[:rows]


def wilson_interval(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``correct`` successes in ``n`` trials (always inside [0, 1])."""
    if n <= 0:
        return math.nan, math.nan
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def majority_class(train_labels, names: list | None = None):
    """The baseline's class: the most frequent class of the **training** rows (ties: the first in ``names`` or
    sorted order). The one definition every view uses (fine-tuning, k-fold, the jobs page's ensemble)."""
    counts = Counter(train_labels)
    order = list(names) if names is not None else sorted(counts)
    return max(order, key=lambda c: (counts.get(c, 0), -order.index(c)))


def class_baseline(majority, eval_labels, names: list) -> dict:
    """Always predicting ``majority``: its class, accuracy and macro-F1 (over ``names``) on ``eval_labels``."""
    from sklearn.metrics import f1_score

    y = list(eval_labels)
    guess = [majority] * len(y)
    return {"class": majority, "accuracy": float(np.mean([t == majority for t in y])) if y else math.nan,
            "macro_f1": float(f1_score(y, guess, average="macro", labels=list(names), zero_division=0)) if y
            else math.nan}


def majority_baseline(train_labels, eval_labels, names: list | None = None) -> dict:
    """The training rows' majority class (:func:`majority_class`) scored on the evaluated rows."""
    order = list(names) if names is not None else sorted(Counter(train_labels))
    return class_baseline(majority_class(train_labels, order), eval_labels, order)


def classification_metrics(predictions: np.ndarray, labels, names: list[str], majority: int) -> dict:
    """Accuracy (with its Wilson interval), macro-F1, per-class report, confusion matrix (rows: true label,
    columns: predicted, in ``names`` order), the majority-class baseline (``majority``: the id of the training
    rows' majority class, :func:`majority_class`, scored on ``labels``) and ``one_class``: whether every
    prediction is the same class. Label ids index ``names``."""
    from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, f1_score

    y, predictions = np.asarray(labels), np.asarray(predictions)
    ids = list(range(len(names)))
    correct = int((y == predictions).sum())
    base = class_baseline(majority, y, ids)
    return {"accuracy": float(accuracy_score(y, predictions)),
            "accuracy_interval": list(wilson_interval(correct, len(y))),
            "macro_f1": float(f1_score(y, predictions, average="macro", labels=ids, zero_division=0)),
            "baseline": {**base, "class": names[base["class"]]},
            "predicted_classes": int(len(set(predictions.tolist()))), "one_class": len(set(predictions.tolist())) == 1,
            "report": classification_report(y, predictions, labels=ids, target_names=names, output_dict=True,
                                            zero_division=0),
            "confusion_matrix": confusion_matrix(y, predictions, labels=ids).tolist()}
