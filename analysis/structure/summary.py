"""Where each task lives: the best layer, and the expected layer under cumulative gains (Tenney et al. 2019, "BERT
Rediscovers the Classical NLP Pipeline", §3, Eq. 2, the "center of gravity")::

    Delta_l = S(l) - S(l - 1),      E_Delta[l] = sum_l l * Delta_l / sum_l Delta_l

Tenney et al.'s ``S(l)`` is the score of a probe reading a scalar mix of layers ``0..l``, which can only grow with
``l``. We train one probe per layer, so ``S(l)`` here is the **running maximum** of the single-layer scores up to
``l`` (what the best of layers ``0..l`` gives): like theirs it never decreases, the ``Delta_l`` are never negative
and the expected layer lies between the first and last layer probed. (Single-layer scores themselves can fall,
and the ratio with negative ``Delta`` can leave the layer range.) Layers skipped by ``--layers`` are spanned by
one ``Delta`` assigned to the later layer.

Intervals: 95% percentile bootstrap over **test sentences** (the same resamples for every layer and task, so the
comparison is paired): each resample rescores every layer from per-sentence counts (correct words, recovered
edges, correct roots) and takes its best layer and center of gravity. The probes are not retrained per resample:
the interval is the test set's sampling error, not the variation over training seeds.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

BOOTSTRAP = 1000


@dataclasses.dataclass
class LayerCounts:
    """A task's primary metric per layer as a ratio of per-sentence counts: ``score(l) = sum correct[l] / sum
    total[l]``; ``correct``/``total`` ``(layers, sentences)``."""

    task: str
    metric: str
    layers: list[int]
    correct: np.ndarray
    total: np.ndarray

    def scores(self, weights: np.ndarray | None = None) -> np.ndarray:
        """``(resamples, layers)`` scores (one row of the plain scores without ``weights``)."""
        w = np.ones((1, self.correct.shape[1])) if weights is None else weights
        with np.errstate(invalid="ignore", divide="ignore"):
            return (w @ self.correct.T) / (w @ self.total.T)


def center_of_gravity(scores: np.ndarray, layers: list[int]) -> np.ndarray:
    """Tenney et al.'s expected layer of ``scores`` ``(resamples, layers)`` under the running maximum (module
    docstring); NaN where nothing is gained after the first layer."""
    cumulative = np.maximum.accumulate(np.atleast_2d(scores), axis=1)
    delta = np.diff(cumulative, axis=1)
    gained = delta.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(gained > 0, (delta * np.asarray(layers[1:])).sum(1) / np.where(gained > 0, gained, 1), np.nan)


def best_layer(scores: np.ndarray, layers: list[int]) -> np.ndarray:
    """The layer of the highest score per row (ties: the lowest layer)."""
    return np.asarray(layers)[np.nanargmax(np.atleast_2d(scores), axis=1)]


def resample_weights(n_sentences: int, n_boot: int = BOOTSTRAP, seed: int = 0) -> np.ndarray:
    """``(n_boot, n_sentences)`` counts of each sentence in each bootstrap resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_sentences, np.full(n_sentences, 1 / n_sentences), size=n_boot).astype(float)


def summarise(tasks: list[LayerCounts], n_boot: int = BOOTSTRAP, seed: int = 0) -> pd.DataFrame:
    """One row per task: best layer (and its score), center of gravity, each with a 95% bootstrap interval."""
    rows = []
    weights = None
    for t in tasks:
        if weights is None or weights.shape[1] != t.correct.shape[1]:
            weights = resample_weights(t.correct.shape[1], n_boot, seed)
        plain, boot = t.scores()[0], t.scores(weights)
        best, best_boot = best_layer(plain, t.layers)[0], best_layer(boot, t.layers)
        cog, cog_boot = center_of_gravity(plain, t.layers)[0], center_of_gravity(boot, t.layers)
        finite = cog_boot[np.isfinite(cog_boot)]
        rows.append({"task": t.task, "metric": t.metric, "best_layer": int(best),
                     "best_score": float(np.nanmax(plain)),
                     "best_layer_ci_low": float(np.percentile(best_boot, 2.5)),
                     "best_layer_ci_high": float(np.percentile(best_boot, 97.5)),
                     "center_of_gravity": float(cog),
                     "center_of_gravity_ci_low": float(np.percentile(finite, 2.5)) if len(finite) else np.nan,
                     "center_of_gravity_ci_high": float(np.percentile(finite, 97.5)) if len(finite) else np.nan,
                     "first_layer": t.layers[0], "last_layer": t.layers[-1], "bootstrap": n_boot})
    return pd.DataFrame(rows)
