"""How separable the classes are in a layer's vectors (Sun et al. 2019 §5.3.2 / Tab. 3): silhouette (euclidean)
and a linear probe (standardised logistic regression, stratified k-fold: mean and std of accuracy; macro-F1 and a
95% Wilson interval of the pooled out-of-fold predictions; the majority-class baseline)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from analysis.core.inputs import InputError
from analysis.core.scores import wilson_interval

SILHOUETTE_MAX_ROWS = 10_000  # above this the silhouette is computed on a seeded sample of this size (reported)


def check_labels(labels: tuple[str, ...] | None, folds: int) -> dict[str, int]:
    """Class counts, or an :class:`InputError` saying why these labels cannot be analysed."""
    if labels is None:
        raise InputError("no label column: the atlas colours and scores layers by class; choose the label column")
    counts = pd.Series(labels).value_counts().to_dict()
    if len(counts) < 2:
        only = next(iter(counts), "")
        raise InputError(f"the label column has a single class ('{only}'): separability needs at least two")
    if len(labels) < folds:
        raise InputError(f"{len(labels)} rows are fewer than the {folds} folds of the linear probe")
    rare = min(counts, key=counts.get)
    if counts[rare] < folds:
        raise InputError(f"class '{rare}' has {counts[rare]} row(s); the {folds}-fold linear probe needs at least "
                         f"{folds} per class (use fewer folds, or drop or merge that class)")
    return counts


SEPARABILITY_COLUMNS = ["layer", "silhouette", "probe_accuracy", "probe_accuracy_std", "probe_macro_f1",
                        "probe_ci_low", "probe_ci_high", "majority_baseline"]


SEPARABILITY_HEADERS = {
    "probe_accuracy": ("probe accuracy", "linear probe, mean over the stratified folds"),
    "probe_accuracy_std": ("std over folds", "numpy std (ddof 0) of the fold accuracies"),
    "probe_macro_f1": ("probe macro-F1", "of the pooled out-of-fold predictions"),
    "probe_ci_low": ("95% CI low (Wilson)", "Wilson interval of the pooled out-of-fold accuracy"),
    "probe_ci_high": ("95% CI high (Wilson)", "see 95% CI low"),
    "majority_baseline": ("majority class", "accuracy of always predicting the most frequent class"),
}


def out_of_fold(x: np.ndarray, labels: np.ndarray, folds: int = 5, seed: int = 0) -> tuple[np.ndarray, list[float]]:
    """The linear probe's out-of-fold predictions of ``x`` ``(n, d)`` (every row predicted once, by the fold that
    did not train on it) and each fold's accuracy: ``StandardScaler -> LogisticRegression(max_iter=1000)``,
    ``StratifiedKFold(folds, shuffle=True, random_state=seed)``. The same folds for the same labels and seed, so
    two models' predictions of the same rows pair up (:mod:`analysis.compare`'s McNemar test)."""
    from sklearn.base import clone
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    oof, scores = np.empty_like(labels), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for fit, held in StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, labels):
            oof[held] = clone(probe).fit(x[fit], labels[fit]).predict(x[held])
            scores.append(float((oof[held] == labels[held]).mean()))
    return oof, scores


def separability(x: np.ndarray, labels: np.ndarray, folds: int = 5, seed: int = 0) -> dict:
    """Silhouette and a cross-validated linear probe of vectors ``x`` ``(n, d)`` with ``labels``.

    Silhouette: euclidean on the full vectors (a seeded sample of ``SILHOUETTE_MAX_ROWS`` above that size).
    Probe: ``StandardScaler -> LogisticRegression(max_iter=1000)``, ``StratifiedKFold(folds, shuffle=True,
    random_state=seed)``: ``probe_accuracy`` is the mean over folds and ``probe_accuracy_std`` numpy's std
    (``ddof=0``); ``probe_macro_f1`` and the 95% Wilson interval (``probe_ci_low``, ``probe_ci_high``) are of the
    pooled out-of-fold predictions (every row predicted once); ``majority_baseline`` is the accuracy of always
    predicting the most frequent class.
    """
    from sklearn.metrics import f1_score, silhouette_score

    sample = SILHOUETTE_MAX_ROWS if len(x) > SILHOUETTE_MAX_ROWS else None
    sil = float(silhouette_score(x, labels, metric="euclidean", sample_size=sample, random_state=seed))
    oof, scores = out_of_fold(x, labels, folds, seed)
    low, high = wilson_interval(int((oof == labels).sum()), len(labels))
    _, counts = np.unique(labels, return_counts=True)
    return {"silhouette": sil, "probe_accuracy": float(np.mean(scores)), "probe_accuracy_std": float(np.std(scores)),
            "probe_macro_f1": float(f1_score(labels, oof, average="macro")), "probe_ci_low": low,
            "probe_ci_high": high, "majority_baseline": float(counts.max() / len(labels))}
