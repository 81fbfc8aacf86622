"""Per-row statistics of a logits block in one read: argmax, rank and probability of a target, top-k.

On CPU, the torch version of this needs six passes over the ``(rows, vocab)`` block (gather, compare, count,
top-k, subtract, exp, sum), which costs more than the matrix product that made it. The numba kernel reads
each row twice while it is in cache and runs rows in parallel (numba is already installed with umap-learn).
On a GPU the torch version is used: there those passes are cheap.

Semantics (both versions): ``pred`` is the first index of the maximum (as ``torch.argmax``); ``rank`` is 1 +
the number of logits strictly greater than the target's; top-k is ordered by value, earlier index first on
ties; probabilities are softmax probabilities.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch


@numba.njit(parallel=True, cache=True)
def _row_stats(logits, targets, pred, prob, rank, top_ids, top_probs):  # pragma: no cover - compiled
    n, vocab = logits.shape
    k = top_ids.shape[1]
    for i in numba.prange(n):
        row = logits[i]
        t = row[targets[i]]
        best = row[0]
        arg = 0
        greater = 0
        ids = np.full(k, -1, dtype=np.int64)
        vals = np.full(k, -np.inf, dtype=np.float32)
        for j in range(vocab):
            x = row[j]
            if x > t:
                greater += 1
            if x > best:
                best = x
                arg = j
            if x > vals[k - 1]:
                pos = k - 1
                while pos > 0 and x > vals[pos - 1]:
                    vals[pos] = vals[pos - 1]
                    ids[pos] = ids[pos - 1]
                    pos -= 1
                vals[pos] = x
                ids[pos] = j
        total = 0.0
        for j in range(vocab):
            total += math.exp(row[j] - best)
        pred[i] = arg
        rank[i] = greater + 1
        prob[i] = math.exp(t - best) / total
        for a in range(k):
            top_ids[i, a] = ids[a]
            top_probs[i, a] = math.exp(vals[a] - best) / total


def row_stats_numpy(logits: np.ndarray, targets: np.ndarray, k: int):
    """(pred, prob, rank, top_ids, top_probs) of float32 ``logits`` ``(n, vocab)`` against ``targets`` ``(n,)``."""
    n = logits.shape[0]
    k = min(k, logits.shape[1])
    pred, rank = np.empty(n, np.int64), np.empty(n, np.int64)
    prob = np.empty(n, np.float32)
    top_ids, top_probs = np.empty((n, k), np.int64), np.empty((n, k), np.float32)
    _row_stats(np.ascontiguousarray(logits, dtype=np.float32), targets.astype(np.int64), pred, prob, rank,
               top_ids, top_probs)
    return pred, prob, rank, top_ids, top_probs


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
