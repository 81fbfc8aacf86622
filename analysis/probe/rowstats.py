"""Per-row statistics of a logits block in one read: argmax, rank and probability of a target, top-k.

On CPU, the torch version of this needs six passes over the ``(rows, vocab)`` block (gather, compare, count,
top-k, subtract, exp, sum), which costs more than the matrix product that made it. Here a numba kernel finds
argmax, rank and top-k in one comparison-only pass per row, rows in parallel (numba is already installed with
umap-learn), and torch sums the softmax normaliser with its vectorised ``exp`` (numba's
``exp`` is scalar without Intel SVML, and was 85% of the kernel's time when it did both).
On a GPU the torch version is used: there those passes are cheap.

Semantics (both versions): ``pred`` is the first index of the maximum (as ``torch.argmax``); ``rank`` is 1 +
the number of logits strictly greater than the target's; top-k is ordered by value, earlier index first on
ties; probabilities are softmax probabilities.
"""

from __future__ import annotations

import numba
import numpy as np
import torch


@numba.njit(parallel=True, cache=True)
def _row_scan(logits, targets, tol, pred, rank, near, near_ids, top_ids, top_vals):  # pragma: no cover - compiled
    n, vocab = logits.shape
    k = top_ids.shape[1]
    cap = near_ids.shape[1]
    for i in numba.prange(n):
        row = logits[i]
        target = targets[i]
        t = row[target]
        margin = tol[i]
        greater = 0
        close = 0
        ids = np.full(k, -1, dtype=np.int64)
        vals = np.full(k, -np.inf, dtype=np.float32)
        for j in range(vocab):
            x = row[j]
            if x > t + margin:  # with margin 0: strictly greater, the rank's definition
                greater += 1
            elif x >= t - margin and j != target:  # within the margin: not sure which side (analysis.core.precision)
                if close < cap:
                    near_ids[i, close] = j
                close += 1
            if x > vals[k - 1]:
                pos = k - 1
                while pos > 0 and x > vals[pos - 1]:
                    vals[pos] = vals[pos - 1]
                    ids[pos] = ids[pos - 1]
                    pos -= 1
                vals[pos] = x
                ids[pos] = j
        pred[i] = ids[0]
        rank[i] = greater + 1
        near[i] = close
        for a in range(k):
            top_ids[i, a] = ids[a]
            top_vals[i, a] = vals[a]


def row_scan(logits: np.ndarray, targets: np.ndarray, k: int, tol: np.ndarray | None = None, near_cap: int = 0):
    """The one pass over float32 ``logits`` ``(n, vocab)``: ``(pred, rank, near, top_ids, top_vals, target_vals,
    total, near_ids)``. ``rank`` is 1 + the logits more than ``tol[i]`` above the target's, ``near`` the others
    within ``tol[i]`` of it (``tol`` default 0: the plain rank; ``near`` then counts exact ties), and ``near_ids``
    ``(n, near_cap)`` the first ``near_cap`` of those in vocabulary order (the rest -1); ``total`` is
    ``sum(exp(logit - max))`` per row. ``logits`` is used as scratch space and overwritten (the normaliser is
    summed in place, which is 2.5x faster than ``torch.logsumexp``); pass a copy to keep it."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    targets = targets.astype(np.int64)
    n = logits.shape[0]
    if targets.shape != (n,) or (n and not 0 <= targets.min() <= targets.max() < logits.shape[1]):
        raise ValueError(f"targets {targets.shape} do not match logits {logits.shape}")  # the kernel trusts them
    k = max(1, min(k, logits.shape[1]))
    tol = np.zeros(n, np.float32) if tol is None else np.ascontiguousarray(tol, dtype=np.float32)
    pred, rank, near = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    near_ids = np.full((n, near_cap), -1, np.int64)
    top_ids, top_vals = np.empty((n, k), np.int64), np.empty((n, k), np.float32)
    _row_scan(logits, targets, tol, pred, rank, near, near_ids, top_ids, top_vals)
    target_vals = logits[np.arange(n), targets]
    best = top_vals[:, :1]
    total = torch.from_numpy(logits).sub_(torch.from_numpy(best)).exp_().sum(-1).numpy()
    return pred, rank, near, top_ids, top_vals, target_vals, total, near_ids


def row_stats_numpy(logits: np.ndarray, targets: np.ndarray, k: int):
    """(pred, prob, rank, top_ids, top_probs) of float32 ``logits`` ``(n, vocab)`` against ``targets`` ``(n,)``
    (:func:`row_scan`; ``logits`` is overwritten)."""
    pred, rank, _, top_ids, top_vals, target_vals, total, _ = row_scan(logits, targets, k)
    best = top_vals[:, :1]
    return pred, np.exp(target_vals - best[:, 0]) / total, rank, top_ids, np.exp(top_vals - best) / total[:, None]


def row_stats_torch(logits: torch.Tensor, targets: torch.Tensor, k: int):
    """The same statistics with torch operations (used on GPUs)."""
    logits = logits.float()
    target_logit = logits.gather(1, targets[:, None])
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    top = logits.topk(min(k, logits.shape[-1]), dim=-1)
    return (logits.argmax(-1), (target_logit - lse).exp()[:, 0], (logits > target_logit).sum(-1) + 1,
            top.indices, (top.values - lse).exp())


def row_stats(logits: torch.Tensor, targets: torch.Tensor, k: int):
    """Dispatch: numba on CPU, torch elsewhere. Returns torch tensors on ``logits.device``."""
    if logits.device.type != "cpu":
        return row_stats_torch(logits, targets, k)
    out = row_stats_numpy(logits.float().numpy(), targets.numpy(), k)
    return tuple(torch.from_numpy(a) for a in out)
