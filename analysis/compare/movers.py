"""Which examples moved between two checkpoints at a layer, and how their neighbourhoods changed (issue 28).

- **Procrustes distance**: B's layer-l vectors are rotated onto A's by the orthogonal matrix R that minimises
  ``||B R - A||_F`` (Schönemann 1966; ``scipy.linalg.orthogonal_procrustes``), fitted on all examples, so a pure
  change of basis (B = A Q, Q orthogonal) moves nothing. Each example's movement is the cosine distance
  ``1 - cos(a_i, (B R)_i)``. No centring or scaling: a rotation of the hidden basis is what fine-tuning cannot
  be blamed for; a shift or a rescale it can.
- **Neighbour overlap**: the share of an example's k nearest neighbours (cosine, itself excluded) at A's layer l
  that are also among its k nearest at B's layer l (Merchant et al. 2020 use the same kind of local comparison).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.linalg import orthogonal_procrustes  # loaded before threadpool_limits is entered: it limits what is loaded


def procrustes_rotation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The orthogonal ``R`` ``(d, d)`` minimising ``||b R - a||_F`` for ``a``, ``b`` ``(n, d)``."""
    return orthogonal_procrustes(np.asarray(b, np.float64), np.asarray(a, np.float64))[0]


def cosine_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``1 - cos(a_i, b_i)`` per row ``(n,)``; 0 for a row that is zero on both sides."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.where(norms > 0, (a * b).sum(1) / np.where(norms > 0, norms, 1), 1.0)
    return np.clip(1 - cos, 0, 2)


def movement(a: np.ndarray, b: np.ndarray, rotation: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(aligned, raw)``: per example the cosine distance between ``a`` and ``b`` after rotating ``b`` onto ``a``
    (``rotation``, default :func:`procrustes_rotation` of the two; needs the same width) and without it."""
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"the two models' vectors differ in width ({a.shape[1]} vs {b.shape[1]}): no Procrustes")
    raw = cosine_distance(a, b)
    rotation = procrustes_rotation(a, b) if rotation is None else rotation
    return cosine_distance(a, np.asarray(b, np.float64) @ rotation), raw


def nearest(x: np.ndarray, k: int, block: int = 2048) -> np.ndarray:
    """``(n, k)``: each row's k nearest other rows by cosine similarity (exact, blocked; ``topk``, not a full
    sort), nearest first, equal similarities in order of index (a tie exactly at the k-th place may keep either)."""
    v = torch.from_numpy(np.asarray(x, np.float32))
    v = v / v.norm(dim=1, keepdim=True).clamp(min=1e-12)
    n = len(v)
    k = min(k, n - 1)
    out = np.empty((n, k), np.int64)
    for start in range(0, n, block):
        sim = v[start:start + block] @ v.T
        sim[torch.arange(len(sim)), torch.arange(start, start + len(sim))] = -np.inf  # not itself
        values, ids = sim.topk(k, dim=1)  # then ties in order of index, as a stable sort would give them
        order = np.lexsort((ids.numpy(), -values.numpy()), axis=1)
        out[start:start + block] = np.take_along_axis(ids.numpy(), order, axis=1)
    return out


def neighbour_overlap(a: np.ndarray, b: np.ndarray, k: int = 10) -> np.ndarray:
    """Per example, the share of its ``k`` nearest neighbours at ``a`` that are among its ``k`` nearest at ``b``."""
    na, nb = nearest(a, k), nearest(b, k)
    if na.shape[1] == 0:
        return np.ones(len(a))
    return np.array([len(set(x) & set(y)) for x, y in zip(na.tolist(), nb.tolist(), strict=True)]) / na.shape[1]


def mcnemar(correct_a: np.ndarray, correct_b: np.ndarray) -> dict:
    """Exact McNemar test (the binomial test on the discordant pairs, two-sided) of two classifiers' correctness on
    the same rows: ``{"a_only", "b_only", "p_value"}`` (p = 1 when no pair is discordant)."""
    from scipy.stats import binomtest

    a_only = int((correct_a & ~correct_b).sum())
    b_only = int((correct_b & ~correct_a).sum())
    p = binomtest(min(a_only, b_only), a_only + b_only, 0.5).pvalue if a_only + b_only else 1.0
    return {"a_only": a_only, "b_only": b_only, "p_value": float(p)}
