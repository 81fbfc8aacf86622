"""Structural probes (Hewitt & Manning 2019, "A Structural Probe for Finding Syntax in Word Representations").

- **Distance probe** (§2, Eq. 1-2): ``d_B(h_i, h_j)^2 = (B(h_i - h_j))^T (B(h_i - h_j))`` with ``B`` of shape
  ``(k, hidden)`` trained so that it matches the tree distance ``d_T(w_i, w_j)``: per sentence
  ``sum_{i,j} |d_T(w_i, w_j) - d_B(h_i, h_j)^2| / |s|^2``, averaged over a batch (their Eq. 3: L1, normalised by
  the sentence length squared).
- **Depth probe** (§2, Eq. 4-5): ``||h_i||_B^2 = (B h_i)^T (B h_i)`` against the depth ``||w_i||`` in the tree;
  loss ``sum_i | ||w_i|| - ||h_i||_B^2 | / |s|``.
- **Training** as their code: ``B`` initialised uniformly in ``[-0.05, 0.05]``, Adam (lr 1e-3), 20 sentences a
  batch, the learning rate times 0.1 when the dev loss does not improve, at most 30 epochs, early stopping after
  ``patience`` epochs without improvement on a dev split of the training file (10% of its sentences, seeded); the
  parameters of the best dev epoch are kept. The batches are made once (sentences shuffled, seeded) and their
  order shuffled every pass. Deviation: an "epoch" is at least 50 optimiser steps (a file of
  fewer than 1,000 sentences is gone through more than once between two dev evaluations); otherwise a small
  treebank's first epochs (a few steps each) would trigger the learning-rate cuts before anything is learnt.
  With EWT dev (~1,800 training sentences, 90 steps) an epoch is an epoch.
- **Rank**: default ``k = min(hidden, 128)``. The paper's main results use the full rank (``k`` = hidden); their
  rank study (§4.1, Fig. 3 for BERT-large) finds UUAS flat from about ``k = 64`` up, so 128 keeps the result at
  a sixth of bert-base's parameters and time; ``--rank`` up to ``hidden`` is accepted.
- **Scores** on the test file (§3.2, their reporter): **UUAS**, the share of gold undirected edges recovered by
  the minimum spanning tree (Prim's algorithm) of the predicted distances, **punctuation excluded** (words whose
  UPOS is ``PUNCT``; the paper drops punctuation by PTB tag) - the gold edges being, as in their code, the minimum
  spanning tree of the gold distances among the same words, i.e. the tree's arcs when punctuation hangs off the
  tree as leaves; pooled over sentences. **Distance Spearman** (DSpr.): for each word the Spearman correlation of
  its row of predicted distances with its row of gold distances (all words), averaged per sentence length,
  then over the lengths 5-50. **Root accuracy**: the word of least predicted depth among non-punctuation words is
  the gold root. **Norm Spearman** (NSpr.): per sentence the Spearman correlation of predicted and gold depths,
  averaged per length, then over lengths 5-50.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from scipy.stats import rankdata

from analysis.core.treebank import Sentence
from analysis.core.trees import non_punct, uuas_counts

STRUCTURAL_TASKS = ("distance", "depth")
DEFAULT_RANK = 128
BATCH = 20
MIN_STEPS = 50  # optimiser steps between two dev evaluations (an epoch of a small file is repeated)


def default_rank(hidden: int) -> int:
    return min(hidden, DEFAULT_RANK)


class Packed(NamedTuple):
    """A batch's word vectors without padding: ``h`` ``(words, hidden)`` sentence after sentence, and each word's
    ``(sentence, position)`` in the padded ``(sentences, longest)`` layout. The probe's product ``h B^T``
    then costs the batch's words, not its sentences times the longest one (EWT: about a third)."""

    h: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    sentences: int
    longest: int


class Probe(torch.nn.Module):
    """``B``: ``(k, hidden)``. ``forward(h)`` with ``h`` ``(batch, len, hidden)`` (zeros as padding) or
    :class:`Packed` gives ``(batch, len, len)`` squared distances (``distance``) or ``(batch, len)`` squared norms
    (``depth``); padding positions have ``B h = 0`` either way."""

    def __init__(self, kind: str, hidden: int, rank: int, generator: torch.Generator | None = None):
        super().__init__()
        self.kind = kind
        self.B = torch.nn.Parameter(torch.empty(rank, hidden).uniform_(-0.05, 0.05, generator=generator))

    def forward(self, h: torch.Tensor | Packed) -> torch.Tensor:
        if isinstance(h, Packed):
            t = torch.zeros(h.sentences, h.longest, self.B.shape[0]).index_put((h.rows, h.cols), h.h @ self.B.T)
        else:
            t = h @ self.B.T
        if self.kind == "depth":
            return (t * t).sum(-1)
        sq = (t * t).sum(-1)  # |a - b|^2 = |a|^2 + |b|^2 - 2 a.b: no (batch, len, len, k) tensor
        return (sq[:, :, None] + sq[:, None, :] - 2 * t @ t.transpose(1, 2)).clamp(min=0)


def gold(kind: str, sentence: Sentence) -> np.ndarray:
    return sentence.distances() if kind == "distance" else sentence.depths()


def _batch(kind, layer, offsets, sentences, idx, targets):
    sizes = [len(sentences[i]) for i in idx]
    n = max(sizes)
    h = torch.from_numpy(np.concatenate([np.asarray(layer[offsets[i]:offsets[i] + m], dtype=np.float32)
                                         for i, m in zip(idx, sizes, strict=True)]))
    rows = torch.from_numpy(np.repeat(np.arange(len(idx)), sizes))
    cols = torch.from_numpy(np.concatenate([np.arange(m) for m in sizes]))
    y = torch.zeros((len(idx), n, n) if kind == "distance" else (len(idx), n))
    mask = torch.zeros_like(y)
    for row, (i, m) in enumerate(zip(idx, sizes, strict=True)):
        if kind == "distance":
            y[row, :m, :m] = torch.from_numpy(targets[i].astype(np.float32))
            mask[row, :m, :m] = 1
        else:
            y[row, :m] = torch.from_numpy(targets[i].astype(np.float32))
            mask[row, :m] = 1
    lengths = torch.tensor(sizes, dtype=torch.float32)
    return Packed(h, rows, cols, len(idx), n), y, mask, lengths


def loss_of(kind: str, pred, y, mask, lengths) -> torch.Tensor:
    """H&M's L1 loss: per sentence the summed absolute error over the length (depth) or its square
    (distance), averaged over the batch."""
    per = ((pred - y).abs() * mask).flatten(1).sum(1)
    return (per / (lengths ** 2 if kind == "distance" else lengths)).mean()


@dataclasses.dataclass
class Trained:
    probe: Probe
    epochs: int
    dev_loss: float


def train(kind: str, layer: np.ndarray, offsets: np.ndarray, sentences: list[Sentence], rank: int, seed: int = 0,
          max_epochs: int = 30, patience: int = 4, lr: float = 1e-3, dev_fraction: float = 0.1,
          on_epoch: Callable[[], None] | None = None) -> Trained:
    """A structural probe of ``kind`` on one layer's word vectors ``(words, hidden)`` of ``sentences`` (whose
    words start at ``offsets``). ``on_epoch`` is called after each epoch (progress; it may raise to stop)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(sentences))
    n_dev = max(1, int(round(len(sentences) * dev_fraction))) if len(sentences) > 1 else 0
    dev, fit_on = order[:n_dev], order[n_dev:] if n_dev < len(sentences) else order
    targets = [gold(kind, s) for s in sentences]
    probe = Probe(kind, layer.shape[1], rank, torch.Generator().manual_seed(seed))  # no global state: probes of
    # several layers and tasks train at once in threads (analysis.structure.run)
    opt = torch.optim.Adam(probe.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.1, patience=0)
    dev_batches = [_batch(kind, layer, offsets, sentences, dev[i:i + BATCH], targets)
                   for i in range(0, len(dev), BATCH)] or None
    fit_batches = [_batch(kind, layer, offsets, sentences, fit_on[i:i + BATCH], targets)  # made once; their
                   for i in range(0, len(fit_on), BATCH)]  # order is shuffled every pass
    best, best_state, stale, epochs = np.inf, None, 0, 0
    for epoch in range(1, max_epochs + 1):
        epochs = epoch
        probe.train()
        steps = 0
        while steps < MIN_STEPS or steps == 0:  # a small file: its batches repeated up to MIN_STEPS updates
            for b in rng.permutation(len(fit_batches)):
                loss = loss_of(kind, probe(fit_batches[b][0]), *fit_batches[b][1:])
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
        probe.eval()
        with torch.no_grad():
            batches = dev_batches or fit_batches
            dev_loss = float(np.mean([loss_of(kind, probe(b[0]), *b[1:]).item() for b in batches]))
        sched.step(dev_loss)
        if on_epoch is not None:
            on_epoch()
        if dev_loss < best - 1e-7:
            best, best_state, stale = dev_loss, {k: v.clone() for k, v in probe.state_dict().items()}, 0
        else:
            stale += 1
            if stale >= patience:
                break
    probe.load_state_dict(best_state)
    return Trained(probe.eval(), epochs, float(best))


@torch.no_grad()
def predict(probe: Probe, layer: np.ndarray, offsets: np.ndarray, sentences: list[Sentence]) -> list[np.ndarray]:
    """Per sentence: ``(n, n)`` predicted squared distances or ``(n,)`` predicted squared norms."""
    out = []
    for i in range(0, len(sentences), BATCH):
        idx = list(range(i, min(i + BATCH, len(sentences))))
        h = _batch(probe.kind, layer, offsets, sentences, idx, [np.zeros((len(s),) * (2 if probe.kind ==
                   "distance" else 1)) for s in sentences])[0]
        pred = probe(h).numpy()
        for row, s in enumerate(idx):
            m = len(sentences[s])
            out.append(pred[row, :m, :m] if probe.kind == "distance" else pred[row, :m])
    return out


# --- scores ----------------------------------------------------------------------------------------------------

def spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row of ``a`` with the same row of ``b`` (average ranks for ties; NaN for a
    constant row)."""
    ra, rb = rankdata(a, axis=-1), rankdata(b, axis=-1)
    ra, rb = ra - ra.mean(-1, keepdims=True), rb - rb.mean(-1, keepdims=True)
    den = np.sqrt((ra * ra).sum(-1) * (rb * rb).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(-1) / np.where(den > 0, den, 1), np.nan)


def length_average(values: list[np.ndarray], lengths: list[int], weights: np.ndarray | None = None,
                   low: int = 5, high: int = 50) -> np.ndarray:
    """H&M's averaging: the mean of each sentence length's values (every row of every sentence of that length;
    NaN rows left out), then the mean over the lengths ``low..high`` that occur. ``weights`` ``(resamples,
    sentences)``: sentence counts of bootstrap resamples; gives one average per resample (``(resamples,)``)."""
    n = len(values)
    sums = np.array([np.nansum(v) for v in values], dtype=float)
    counts = np.array([np.isfinite(np.atleast_1d(v)).sum() for v in values], dtype=float)
    lengths = np.asarray(lengths)
    grid = np.arange(low, high + 1)
    group = (lengths[:, None] == grid[None, :]).astype(float)  # (sentences, lengths)
    w = np.ones((1, n)) if weights is None else weights
    total, count = (w * sums) @ group, (w * counts) @ group
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(count > 0, total / np.where(count > 0, count, 1), np.nan)
        present = count > 0
        return np.where(present.any(1), np.nansum(means, 1) / np.maximum(present.sum(1), 1), np.nan)


def by_length(values: list[np.ndarray], lengths: list[int], low: int = 5, high: int = 50) -> float:
    return float(length_average(values, lengths, None, low, high)[0])


def distance_scores(preds: list[np.ndarray], sentences: list[Sentence]) -> dict:
    correct = np.zeros(len(sentences), int)
    total = np.zeros(len(sentences), int)
    rows, edges = [], []
    for i, (p, s) in enumerate(zip(preds, sentences, strict=True)):
        correct[i], total[i], pred_edges, gold_edges = uuas_counts(p, s)
        rows.append(spearman_rows(p, s.distances()))
        edges.append((sorted(pred_edges), sorted(gold_edges)))
    return {"uuas": correct.sum() / max(total.sum(), 1), "spearman": by_length(rows, [len(s) for s in sentences]),
            "correct": correct, "total": total, "rows": rows, "edges": edges}


def position_baselines(train: list[Sentence], test: list[Sentence]) -> dict:
    """What positions alone give, scored as the probes are, on the test sentences: ``uuas`` of the right-branching
    chain (each non-punctuation word linked to the next one: the minimum spanning tree of ``|i - j|``, through
    :func:`uuas_counts`), and ``root_acc`` of the training file's most frequent root position (the k-th
    non-punctuation word, the last one where a sentence has fewer), ``root_position`` that k (0-based). Hewitt &
    Manning 2019 report the chain as the LINEAR baseline of their Table 1."""
    correct = total = 0
    for s in test:
        pos = np.arange(len(s), dtype=float)
        c, t, _, _ = uuas_counts(np.abs(pos[:, None] - pos[None, :]), s)
        correct, total = correct + c, total + t
    places = Counter(int(np.flatnonzero(keep == s.root)[0]) for s in train
                     if (keep := np.flatnonzero(non_punct(s))).size and s.root in keep)
    k = min(places, key=lambda p: (-places[p], p)) if places else 0
    hits = counted = 0
    for s in test:
        keep = np.flatnonzero(non_punct(s))
        if len(keep):
            counted += 1
            hits += int(keep[min(k, len(keep) - 1)] == s.root)
    return {"uuas": correct / max(total, 1), "root_acc": hits / max(counted, 1), "root_position": k}


def depth_scores(preds: list[np.ndarray], sentences: list[Sentence]) -> dict:
    hits = np.zeros(len(sentences), int)
    counted = np.zeros(len(sentences), int)
    rhos = []
    for i, (p, s) in enumerate(zip(preds, sentences, strict=True)):
        keep = np.flatnonzero(non_punct(s))
        if len(keep):
            counted[i] = 1
            hits[i] = int(keep[np.argmin(p[keep])] == s.root)
        rhos.append(spearman_rows(p[None], s.depths()[None])[0])
    return {"root_acc": hits.sum() / max(counted.sum(), 1), "spearman": by_length(rhos, [len(s) for s in sentences]),
            "correct": hits, "total": counted, "rows": rhos}
