"""Minimum description length of a label task, online code (Voita & Titov 2020, "Information-Theoretic Probing
with Minimum Description Length", §3.2, Eq. 3).

The training examples, shuffled once (seeded), are cut at ``t_1 < t_2 < ... < t_S = N``, the paper's portions
0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.25, 12.5, 25, 50 and 100 % of ``N``. The first block is sent with the uniform code
over the ``K`` labels; each later block ``t_i + 1 .. t_{i+1}`` with a probe trained on the first ``t_i``
examples::

    L_online = t_1 * log2 K  -  sum_{i=1}^{S-1} log2 p_{theta_i}(y_{t_i+1 : t_{i+1}} | x_{t_i+1 : t_{i+1}})

and the compression is ``L_uniform / L_online`` with ``L_uniform = N log2 K`` (§3.3). Codelengths are in bits.

The linear probe has an output for each of the ``K`` labels, as the paper's, seen in the block or not
(:mod:`analysis.structure.softmax`), and each block's probe starts from the previous block's (the objective is
convex: the start changes how many iterations it takes, not the optimum it approaches; with the 100-iteration cap
a warm start ends nearer to it). The MLP option (scikit-learn) knows only the labels of its block and gives the
others probability 0, an infinite codelength. Deviation, argued: every probability is therefore mixed with the
uniform distribution, ``(1 - eps) p + eps / K`` with ``eps = 1e-3``: a label not yet seen costs at most
``log2(K / eps)`` bits, and a well-predicted one loses at most ``-log2(1 - eps) ≈ 0.0014`` bits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

PORTIONS = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.25, 12.5, 25.0, 50.0, 100.0)  # percent of the training examples
EPS = 1e-3

# (x_train, y_train as label ids, x_eval, K) -> (n_eval, K) probabilities over every label id
FitProba = Callable[[np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]


def block_ends(n: int, portions=PORTIONS) -> list[int]:
    """``t_1 .. t_S``: the example counts at the block boundaries (at least 1, increasing, the last ``n``)."""
    ends = sorted({min(n, max(1, int(round(n * p / 100)))) for p in portions})
    if ends[-1] != n:
        ends.append(n)
    return ends


@dataclasses.dataclass(frozen=True)
class Codelength:
    online_bits: float
    uniform_bits: float
    n: int
    classes: int
    block_bits: tuple[float, ...]  # bits of each block, the first (uniform) included

    @property
    def compression(self) -> float:
        return self.uniform_bits / self.online_bits


def online_codelength(x: np.ndarray, y: np.ndarray, fit_proba: FitProba, classes: int | None = None,
                      seed: int = 0, portions=PORTIONS, eps: float = EPS) -> Codelength:
    """The online codelength of labels ``y`` (ids ``0..K-1``) given ``x``, with ``fit_proba`` as the probe."""
    y = np.asarray(y)
    k = classes or int(y.max()) + 1
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    ends = block_ends(len(y), portions)
    blocks = [ends[0] * np.log2(k)]
    for start, stop in zip(ends[:-1], ends[1:], strict=True):
        p = fit_proba(x[:start], y[:start], x[start:stop], k)
        p = (1 - eps) * p + eps / k
        blocks.append(float(-np.log2(p[np.arange(stop - start), y[start:stop]]).sum()))
    return Codelength(float(sum(blocks)), float(len(y) * np.log2(k)), len(y), k, tuple(map(float, blocks)))


def probe_fit_proba(probe: str, seed: int) -> FitProba:
    """A :data:`FitProba` training the label probes' family (:func:`analysis.structure.probes.fit`): the linear
    probe over all ``K`` labels, warm-started from the previous call's; the MLP with zeros in the columns of
    labels it has not seen (mixed with the uniform code by :func:`online_codelength`)."""
    from analysis.structure.probes import fit
    from analysis.structure.softmax import fit_softmax

    last = []

    def fit_proba(x_train, y_train, x_eval, k):
        if probe == "linear":
            model = fit_softmax(x_train, y_train, classes=np.arange(k), init=last[-1] if last else None)
            last[:] = [model]
            return model.predict_proba(x_eval)
        model = fit(probe, x_train, y_train, seed)
        out = np.zeros((len(x_eval), k))
        out[:, np.asarray(model.classes_, dtype=int)] = model.predict_proba(x_eval)
        return out

    return fit_proba
