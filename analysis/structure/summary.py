"""Where each task lives: the best layer, and the expected layer under cumulative gains (Tenney et al. 2019, "BERT
Rediscovers the Classical NLP Pipeline", §3, Eq. 2, the "center of gravity")::

    Delta_l = S(l) - S(l - 1),      E_Delta[l] = sum_l l * Delta_l / sum_l Delta_l

Tenney et al.'s ``S(l)`` is the score of a probe reading a scalar mix of layers ``0..l``, which can only grow with
``l``. We train one probe per layer, so ``S(l)`` here is the **running maximum** of the single-layer scores up to
``l`` (what the best of layers ``0..l`` gives): like theirs it never decreases, the ``Delta_l`` are never negative
and the expected layer lies between the first and last layer probed. (Single-layer scores themselves can fall,
and the ratio with negative ``Delta`` can leave the layer range.) Layers skipped by ``--layers`` are spanned by
one ``Delta`` assigned to the later layer.

Intervals: 95% percentile bootstrap over **test sentences** (Efron & Tibshirani 1993, ch. 13; the same resamples
for every layer and task, so the comparison is paired): each resample rescores every layer from per-sentence
counts (correct words, recovered edges, correct roots) and takes its best layer and center of gravity. The probes
are not retrained per resample, so with one training seed the interval is the test set's sampling error only.
With the counts of ``N`` training seeds (``--seeds N``: the probes retrained with seeds ``seed .. seed + N - 1``),
resample ``b`` rescores the counts of seed ``b mod N``: the interval is then the percentile interval of the
mixture of the ``N`` seeds' bootstrap distributions, which holds both the test set's sampling error and the
seed-to-seed spread (a two-stage resampling: Davison & Hinkley 1997, §3.8, seeds as the first stage, drawn
evenly rather than at random). The point estimates stay those of the first seed (``--seed``).

A statistic can be undefined on a resample (the center of gravity when no layer scores above the first; the best
layer when no layer has a score): its interval is taken over the resamples where it is defined, and the share of
the others is reported beside it (``*_undefined``). Where the point estimate itself is undefined, so is its
interval (empty), whatever the resamples give.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

BOOTSTRAP = 1000


@dataclasses.dataclass
class LayerCounts:
    """A task's primary metric per layer as a ratio of per-sentence counts: ``score(l) = sum correct[l] / sum
    total[l]``; ``correct``/``total`` ``(layers, sentences)``, or ``(seeds, layers, sentences)`` for probes
    trained with several seeds (the first seed's scores are the point estimates)."""

    task: str
    metric: str
    layers: list[int]
    correct: np.ndarray
    total: np.ndarray

    @property
    def seeds(self) -> int:
        return 1 if self.correct.ndim == 2 else self.correct.shape[0]

    def scores(self, weights: np.ndarray | None = None, seed: int = 0) -> np.ndarray:
        """``(resamples, layers)`` scores of training seed ``seed`` (its index) (one row of the plain scores
        without ``weights``)."""
        correct, total = (self.correct, self.total) if self.correct.ndim == 2 else (self.correct[seed],
                                                                                  self.total[seed])
        w = np.ones((1, correct.shape[1])) if weights is None else weights
        with np.errstate(invalid="ignore", divide="ignore"):
            return (w @ correct.T) / (w @ total.T)

    def resampled(self, weights: np.ndarray) -> np.ndarray:
        """``(resamples, layers)``: resample ``b`` (``weights[b]``) rescores the counts of seed ``b mod seeds``."""
        out = np.empty((len(weights), len(self.layers)))
        which = np.arange(len(weights)) % self.seeds
        for k in range(self.seeds):
            out[which == k] = self.scores(weights[which == k], k)
        return out


def center_of_gravity(scores: np.ndarray, layers: list[int]) -> np.ndarray:
    """Tenney et al.'s expected layer of ``scores`` ``(resamples, layers)`` under the running maximum (module
    docstring); NaN where nothing is gained after the first layer (or a score is missing)."""
    cumulative = np.maximum.accumulate(np.atleast_2d(scores), axis=1)
    delta = np.diff(cumulative, axis=1)
    gained = delta.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(gained > 0, (delta * np.asarray(layers[1:])).sum(1) / np.where(gained > 0, gained, 1), np.nan)


def best_layer(scores: np.ndarray, layers: list[int]) -> np.ndarray:
    """The layer of the highest score per row (ties: the lowest layer); NaN for a row without any score."""
    scores = np.atleast_2d(scores)
    scored = np.isfinite(scores).any(1)
    best = np.asarray(layers)[np.argmax(np.where(np.isfinite(scores), scores, -np.inf), axis=1)]
    return best if scored.all() else np.where(scored, best, np.nan)


def resample_weights(n_sentences: int, n_boot: int = BOOTSTRAP, seed: int = 0) -> np.ndarray:
    """``(n_boot, n_sentences)`` counts of each sentence in each bootstrap resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_sentences, np.full(n_sentences, 1 / n_sentences), size=n_boot).astype(float)


def interval(estimate: float, resampled: np.ndarray) -> tuple[float, float, float]:
    """``(low, high, undefined)``: the 95% percentile interval of ``resampled`` over the resamples where it is
    defined (finite), and the share where it is not; an empty interval (NaN, NaN) when ``estimate`` is undefined
    or no resample is defined (module docstring)."""
    defined = resampled[np.isfinite(resampled)]
    undefined = 1 - len(defined) / len(resampled)
    if not np.isfinite(estimate) or not len(defined):
        return np.nan, np.nan, undefined
    return float(np.percentile(defined, 2.5)), float(np.percentile(defined, 97.5)), undefined


def summarise(tasks: list[LayerCounts], n_boot: int = BOOTSTRAP, seed: int = 0) -> pd.DataFrame:
    """One row per task: best layer (and its score), center of gravity, each with a 95% bootstrap interval and the
    share of resamples where it is undefined; ``seeds``: the training seeds the interval covers."""
    rows = []
    weights = None
    for t in tasks:
        if weights is None or weights.shape[1] != t.correct.shape[-1]:
            weights = resample_weights(t.correct.shape[-1], n_boot, seed)
        plain, boot = t.scores()[0], t.resampled(weights)
        best = best_layer(plain, t.layers)[0]
        cog = center_of_gravity(plain, t.layers)[0]
        best_ci, cog_ci = interval(best, best_layer(boot, t.layers)), interval(cog, center_of_gravity(boot, t.layers))
        rows.append({"task": t.task, "metric": t.metric, "best_layer": int(best) if np.isfinite(best) else np.nan,
                     "best_score": float(np.nanmax(plain)) if np.isfinite(plain).any() else np.nan,
                     "best_layer_ci_low": best_ci[0], "best_layer_ci_high": best_ci[1],
                     "best_layer_undefined": best_ci[2], "center_of_gravity": float(cog),
                     "center_of_gravity_ci_low": cog_ci[0], "center_of_gravity_ci_high": cog_ci[1],
                     "center_of_gravity_undefined": cog_ci[2], "first_layer": t.layers[0],
                     "last_layer": t.layers[-1], "bootstrap": n_boot, "seeds": t.seeds})
    return pd.DataFrame(rows)
