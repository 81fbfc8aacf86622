"""Attention heads as dependency parsers on a Universal Dependencies treebank, Clark et al. 2019 §4.2 ("What Does
BERT Look At?"), on word-level attention (:mod:`analysis.heads.words`, §4.1).

- **Per relation and direction** (§4.2): a head's prediction for a word is the other word it attends to most
  (``argmax_{j != i} W_ij``; a row with no attention to any other word predicts nothing). *dependent -> head*:
  the dependent's prediction is its gold head; *head -> dependent*: the head word's prediction is the dependent.
  Every word but the root (HEAD 0) counts once under its DEPREL (the full label, subtypes kept: ``nmod:poss``).
  The best head per relation and direction (ties: the first in layer-major order) with its 95% Wilson interval.
- **Fixed-offset baseline** (§4.2: "a fixed offset from the word"): on the same words, the word ``k`` positions
  away from the attending word (``k`` chosen per relation and direction as the most accurate; ties: the smallest
  ``|k|``, then the negative one), ``k`` in ``baseline_offset``.
- **Attention trees**: per sentence and head, the maximum spanning tree of ``max(W_ij, W_ji)`` among the
  non-punctuation words, scored by UUAS against the gold tree with the structural probe's reader and rules
  (:mod:`analysis.core.treebank`, :func:`analysis.core.trees.non_punct`; the gold edges by
  :func:`analysis.core.trees.prim_edges` as :func:`analysis.core.trees.uuas_counts`); the spanning tree is
  :func:`prim_edges`'s algorithm run on every head of a batch at once (a test checks it edge for edge).

Memory: counts per ``(relation, direction, layer, head)`` and per ``(layer, head)``; nothing per sentence.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pandas as pd
import torch

from analysis.core.inputs import InputError
from analysis.core.scores import wilson_interval
from analysis.core.treebank import Sentence
from analysis.core.trees import non_punct, prim_edges

DIRECTIONS = ("dependent_to_head", "head_to_dependent")


@dataclasses.dataclass
class BatchWords:
    """One batch's words flattened: sentence row, position, gold head position, relation id; and for the trees
    the non-punctuation words of each sentence (``keep`` ``(batch, m)`` positions, ``-1`` padding) and each
    sentence's gold-edge adjacency among them (``gold`` ``(batch, m, m)`` bool)."""

    row: torch.Tensor
    word: torch.Tensor
    head: torch.Tensor
    relation: torch.Tensor
    n_words: torch.Tensor
    keep: np.ndarray
    gold: np.ndarray
    gold_edges: int


def prim_parents(dist: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """:func:`analysis.core.trees.prim_edges`' minimum spanning tree for many graphs at once: ``dist`` ``(g, m,
    m)`` (graph ``i`` uses its first ``sizes[i]`` nodes; the rest are ignored), returns ``parent`` ``(g, m)``:
    node ``j`` (``1 <= j < sizes[i]``) joined the tree through edge ``(j, parent[i, j])``. Same steps, same ties."""
    g, m, _ = dist.shape
    dist = np.where((np.arange(m)[None, :, None] < sizes[:, None, None]) &
                    (np.arange(m)[None, None, :] < sizes[:, None, None]), dist.astype(float), np.inf)
    rows = np.arange(g)
    inside = np.zeros((g, m), bool)
    inside[:, 0] = True
    best = dist[:, 0].copy()
    parent = np.zeros((g, m), int)
    joined = np.zeros((g, m), int)
    for _ in range(m - 1):
        cand = np.where(inside, np.inf, best)
        j = np.argmin(cand, axis=1)
        new = np.isfinite(cand[rows, j])  # a graph already whole picks nothing new
        joined[rows[new], j[new]] = parent[rows[new], j[new]]  # the edge as it joins (prim_edges adds it then)
        inside[rows, j] = True
        row = dist[rows, j]
        closer = row < best
        best = np.where(closer, row, best)
        parent = np.where(closer, j[:, None], parent)
    return joined


class Parsing:
    """Counts of correct predictions per relation, direction, layer and head, the fixed-offset baseline's counts,
    and the attention trees' correct edges."""

    STATE = ("correct", "count", "offsets", "tree_correct", "tree_edges")  # what changes as batches are added

    def __init__(self, layers: int, heads: int, relations: list[str]):
        self.layers, self.heads, self.relations = layers, heads, list(relations)
        self.index = {r: i for i, r in enumerate(self.relations)}
        self.correct = np.zeros((len(self.relations), 2, layers, heads))
        self.count = np.zeros(len(self.relations), int)
        self.offsets: list[Counter] = [Counter() for _ in self.relations]
        self.tree_correct = np.zeros((layers, heads))
        self.tree_edges = 0

    def batch(self, sentences: list[Sentence]) -> BatchWords:
        """The words of ``sentences`` (one batch, in row order) that count, and their baseline offsets."""
        row, word, head, relation = [], [], [], []
        for b, s in enumerate(sentences):
            for i, (h, rel) in enumerate(zip(s.heads, s.deprels, strict=True)):
                if h == 0 or rel not in self.index:
                    continue
                r = self.index[rel]
                row.append(b)
                word.append(i)
                head.append(h - 1)
                relation.append(r)
                self.count[r] += 1
                self.offsets[r][h - 1 - i] += 1
        keeps = [np.flatnonzero(non_punct(s)) for s in sentences]
        m = max(1, max(map(len, keeps)))
        keep = np.full((len(sentences), m), -1)
        gold = np.zeros((len(sentences), m, m), bool)
        edges = 0
        for b, (s, k) in enumerate(zip(sentences, keeps, strict=True)):
            keep[b, :len(k)] = k
            for x, y in prim_edges(s.distances()[np.ix_(k, k)]):
                gold[b, x, y] = gold[b, y, x] = True
                edges += 1
        self.tree_edges += edges
        n_words = torch.tensor([len(s) for s in sentences])
        as_tensor = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
        return BatchWords(as_tensor(row), as_tensor(word), as_tensor(head), as_tensor(relation), n_words, keep,
                          gold, edges)

    def add(self, layer: int, words: torch.Tensor, batch: BatchWords) -> None:
        """One layer of one batch: ``words`` ``(batch, heads, n, n)`` word-to-word attention (0-based
        ``layer``)."""
        w = words.float()
        n = w.shape[-1]
        pos = torch.arange(n)
        blocked = (pos[None, :] >= batch.n_words[:, None])[:, None, None, :] | torch.eye(n, dtype=torch.bool)
        scored = w.masked_fill(blocked, -1.0)
        top, pred = scored.max(-1)  # (batch, heads, n)
        pred = torch.where(top > 0, pred, torch.full_like(pred, -1))
        if len(batch.row):
            d2h = pred[batch.row, :, batch.word] == batch.head[:, None]  # (words, heads)
            h2d = pred[batch.row, :, batch.head] == batch.word[:, None]
            for k, hits in enumerate((d2h, h2d)):
                sums = torch.zeros((len(self.relations), self.heads)).index_add_(0, batch.relation, hits.float())
                self.correct[:, k, layer] += sums.numpy()
        self._trees(layer, w, batch)

    def _trees(self, layer: int, w: torch.Tensor, batch: BatchWords) -> None:
        keep = batch.keep
        b, m = keep.shape
        sizes = (keep >= 0).sum(1)
        safe = torch.from_numpy(np.where(keep >= 0, keep, 0))
        sub = w[torch.arange(b)[:, None, None], :, safe[:, :, None], safe[:, None, :]]  # (batch, m, m, heads)
        sub = sub.permute(0, 3, 1, 2).double().numpy()
        sym = np.maximum(sub, np.swapaxes(sub, -1, -2))
        parent = prim_parents(-sym.reshape(b * self.heads, m, m), np.repeat(sizes, self.heads))
        parent = parent.reshape(b, self.heads, m)
        node = np.arange(m)
        hit = batch.gold[np.arange(b)[:, None, None], node[None, None, :], parent]  # (batch, heads, m)
        real = (node[None, :] >= 1) & (node[None, :] < sizes[:, None])
        self.tree_correct[layer] += (hit & real[:, None, :]).sum((0, 2))

    def baseline(self, r: int, direction: int) -> tuple[int, int]:
        """``(offset, correct)`` of the best fixed offset for relation ``r``: dependent -> head predicts the word
        at ``+k`` from the dependent; head -> dependent from the head, so its offset is the negative."""
        if not self.offsets[r]:
            return 0, 0
        k, hits = min(self.offsets[r].items(), key=lambda kv: (-kv[1], abs(kv[0]), kv[0]))
        return (k if direction == 0 else -k), hits

    def accuracies(self) -> pd.DataFrame:
        """Every head's accuracy: ``relation, direction, layer, head, accuracy, correct, count``."""
        r, d, layer, head = np.meshgrid(np.arange(len(self.relations)), np.arange(2), np.arange(self.layers),
                                        np.arange(self.heads), indexing="ij")
        count = self.count[r.ravel()]
        correct = self.correct.ravel().astype(int)
        return pd.DataFrame({"relation": np.asarray(self.relations, dtype=object)[r.ravel()],
                             "direction": np.asarray(DIRECTIONS, dtype=object)[d.ravel()],
                             "layer": layer.ravel() + 1, "head": head.ravel(),
                             "accuracy": correct / np.maximum(count, 1), "correct": correct, "count": count})

    def table(self) -> pd.DataFrame:
        """relations.csv: per relation and direction the best head and its Wilson interval, the best offset."""
        rows = []
        for r, relation in enumerate(self.relations):
            n = int(self.count[r])
            if not n:
                continue
            for d, direction in enumerate(DIRECTIONS):
                flat = int(np.argmax(self.correct[r, d].ravel()))
                correct = int(self.correct[r, d].ravel()[flat])
                low, high = wilson_interval(correct, n)
                offset, base = self.baseline(r, d)
                rows.append({"relation": relation, "direction": direction, "layer": flat // self.heads + 1,
                             "head": flat % self.heads, "accuracy": correct / n, "low": low, "high": high,
                             "baseline_offset": offset, "baseline_accuracy": base / n, "count": n})
        return pd.DataFrame(rows, columns=["relation", "direction", "layer", "head", "accuracy", "low", "high",
                                           "baseline_offset", "baseline_accuracy", "count"])

    def uuas(self) -> pd.DataFrame:
        """Per head its attention tree's UUAS: ``layer, head, uuas, correct, edges``."""
        layer, head = np.meshgrid(np.arange(1, self.layers + 1), np.arange(self.heads), indexing="ij")
        correct = self.tree_correct.ravel().astype(int)
        return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(),
                             "uuas": correct / max(self.tree_edges, 1), "correct": correct,
                             "edges": self.tree_edges})


def relations_of(sentences: list[Sentence], wanted: list[str] | None = None) -> list[str]:
    """The relations to score: every non-root DEPREL of ``sentences`` (sorted), or those of ``wanted`` that
    occur; none in common is an :class:`InputError`."""
    present = sorted({rel for s in sentences for h, rel in zip(s.heads, s.deprels, strict=True) if h != 0})
    if wanted is None:
        chosen = present
    else:
        chosen = [r for r in dict.fromkeys(wanted) if r in set(present)]
    if not chosen:
        shown = ", ".join(present[:12]) + (" ..." if len(present) > 12 else "")
        raise InputError(f"the treebank has none of the relations asked for ({', '.join(wanted or [])}); it has: "
                         f"{shown or 'no dependency relation (every word is a root)'}")
    return chosen
