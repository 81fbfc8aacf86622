"""Attention heads as dependency parsers on a Universal Dependencies treebank, Clark et al. 2019 §4.2 ("What Does
BERT Look At?"), on word-level attention (:mod:`analysis.heads.words`, §4.1).

- **Per relation and direction** (§4.2): a head's prediction for a word is the other word it attends to most
  (``argmax_{j != i} W_ij``; a row with no attention to any other word predicts nothing). *dependent -> head*:
  the dependent's prediction is its gold head; *head -> dependent*: the head word's prediction is the dependent.
  Every word but the root (HEAD 0) counts once under its DEPREL (the full label, subtypes kept: ``nmod:poss``).
  *Head -> dependent* reads Clark's transposed map by default (``reading="clark"``, as their notebook's
  ``attn.T``): the word that attends most to the dependent is predicted as its head, so each dependent counts
  once as in the other direction; ``reading="row"`` asks instead whether the head word's own most-attended word
  is the dependent (a head with several dependents can then be right for one of them only).
- **Selection and held-out** (after Clark et al., who chose heads on one part and scored on another): the kept
  sentences alternate between a selection split (even positions) and a held-out split (odd). The best head per
  relation and direction (ties: the first in layer-major order) and the best offset are chosen on the selection
  split and scored on the held-out one, with a 95% Wilson interval on the held-out words (valid: the head was
  fixed before those words were seen). Both accuracies are reported; a relation with fewer than ``min_count``
  words (default 20) in either split is left out of relations.csv and named in ``run.json``.
- **Fixed-offset baseline** (§4.2: "a fixed offset from the word"): on the same words, the word ``k`` positions
  away from the attending word (``k`` chosen per relation and direction as the most accurate; ties: the smallest
  ``|k|``, then the negative one), ``k`` in ``baseline_offset``.
- **Attention trees**: per sentence and head, the maximum spanning tree of ``W_ij + W_ji`` (Clark's "both" mode;
  ``symmetry="max"``: ``max(W_ij, W_ji)``) among the
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
from analysis.core.transfer import to_host
from analysis.core.treebank import Sentence
from analysis.core.trees import non_punct, prim_edges
from analysis.heads.options import MIN_COUNT, READINGS, SYMMETRIES

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
    splits: torch.Tensor  # (batch,): each sentence's split, 0 selection, 1 held-out


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


SPLITS = ("selection", "held_out")


class Parsing:
    """Counts of correct predictions per split, relation, direction, layer and head, the fixed-offset baseline's
    counts, and the attention trees' correct edges. Sentence ``k`` of the kept sentences (treebank order) is in
    the selection split when ``k`` is even, the held-out split when odd: the best head, offset and tree are chosen
    on the first and scored on the second (Clark et al. chose on one part and scored on another)."""

    STATE = ("correct", "count", "offsets", "tree_correct", "tree_edges")  # what changes as batches are added

    def __init__(self, layers: int, heads: int, relations: list[str], reading: str = "clark",
                 symmetry: str = "sum", min_count: int = MIN_COUNT):
        if reading not in READINGS or symmetry not in SYMMETRIES:
            raise InputError(f"head -> dependent reading {reading!r} / tree symmetry {symmetry!r}: choose among "
                             f"{', '.join(READINGS)} / {', '.join(SYMMETRIES)}")
        if min_count < 1:
            raise InputError(f"the minimum count must be at least 1 (got {min_count})")
        self.layers, self.heads, self.relations = layers, heads, list(relations)
        self.reading, self.symmetry, self.min_count = reading, symmetry, min_count
        self.index = {r: i for i, r in enumerate(self.relations)}
        n = len(self.relations)
        self.correct = np.zeros((2, n, 2, layers, heads))
        self.count = np.zeros((2, n), int)
        self.offsets: list[Counter] = [Counter() for _ in range(2 * n)]  # split-major: split * relations + r
        self.tree_correct = np.zeros((2, layers, heads))
        self.tree_edges = np.zeros(2, int)

    def batch(self, sentences: list[Sentence], splits: list[int]) -> BatchWords:
        """The words of ``sentences`` (one batch, in row order; ``splits``: each one's split, 0 or 1) that count,
        and their baseline offsets."""
        row, word, head, relation = [], [], [], []
        n = len(self.relations)
        for b, (s, split) in enumerate(zip(sentences, splits, strict=True)):
            for i, (h, rel) in enumerate(zip(s.heads, s.deprels, strict=True)):
                if h == 0 or rel not in self.index:
                    continue
                r = self.index[rel]
                row.append(b)
                word.append(i)
                head.append(h - 1)
                relation.append(split * n + r)
                self.count[split, r] += 1
                self.offsets[split * n + r][h - 1 - i] += 1
        keeps = [np.flatnonzero(non_punct(s)) for s in sentences]
        m = max(1, max(map(len, keeps)))
        keep = np.full((len(sentences), m), -1)
        gold = np.zeros((len(sentences), m, m), bool)
        for b, (s, k, split) in enumerate(zip(sentences, keeps, splits, strict=True)):
            keep[b, :len(k)] = k
            for x, y in prim_edges(s.distances()[np.ix_(k, k)]):
                gold[b, x, y] = gold[b, y, x] = True
                self.tree_edges[split] += 1
        n_words = torch.tensor([len(s) for s in sentences])
        as_tensor = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
        return BatchWords(as_tensor(row), as_tensor(word), as_tensor(head), as_tensor(relation), n_words, keep,
                          gold, torch.tensor(splits))

    def add(self, layer: int, words: torch.Tensor, batch: BatchWords) -> None:
        """One layer of one batch: ``words`` ``(batch, heads, n, n)`` word-to-word attention (0-based
        ``layer``)."""
        w = words.float()
        n, device = w.shape[-1], w.device
        pos = torch.arange(n, device=device)
        blocked = ((pos[None, :] >= batch.n_words.to(device)[:, None])[:, None, None, :]
                   | torch.eye(n, dtype=torch.bool, device=device))
        row, word, head, relation = (t.to(device) for t in (batch.row, batch.word, batch.head, batch.relation))

        def most(x: torch.Tensor) -> torch.Tensor:  # per row: the other word of largest weight; -1 when none
            top, pred = x.masked_fill(blocked, -1.0).max(-1)
            return torch.where(top > 0, pred, torch.full_like(pred, -1))

        pred = most(w)  # (batch, heads, n): the word each word attends to most
        if len(batch.row):
            d2h = pred[row, :, word] == head[:, None]  # (words, heads)
            if self.reading == "clark":  # the word attending most to the dependent is its head
                h2d = most(w.transpose(-1, -2))[row, :, word] == head[:, None]
            else:  # the head word's own row points at the dependent
                h2d = pred[row, :, head] == word[:, None]
            slots = 2 * len(self.relations)
            sums = [torch.zeros((slots, self.heads), device=device).index_add_(0, relation, hits.float())
                    for hits in (d2h, h2d)]
            for k, counted in enumerate(to_host(sums)):  # relation counts, not maps, reach the host
                self.correct[:, :, k, layer] += counted.reshape(2, -1, self.heads)
        self._trees(layer, w, batch)

    def _trees(self, layer: int, w: torch.Tensor, batch: BatchWords) -> None:
        keep = batch.keep
        b, m = keep.shape
        sizes = (keep >= 0).sum(1)
        safe = torch.from_numpy(np.where(keep >= 0, keep, 0)).to(w.device)
        sub = w[torch.arange(b, device=w.device)[:, None, None], :, safe[:, :, None], safe[:, None, :]]
        # (batch, m, m, heads): the non-punctuation words' maps go to the host for Prim's algorithm (scipy)
        sub = sub.permute(0, 3, 1, 2).double().cpu().numpy()
        both = np.swapaxes(sub, -1, -2)
        sym = sub + both if self.symmetry == "sum" else np.maximum(sub, both)
        parent = prim_parents(-sym.reshape(b * self.heads, m, m), np.repeat(sizes, self.heads))
        parent = parent.reshape(b, self.heads, m)
        node = np.arange(m)
        hit = batch.gold[np.arange(b)[:, None, None], node[None, None, :], parent]  # (batch, heads, m)
        real = (node[None, :] >= 1) & (node[None, :] < sizes[:, None])
        per_sentence = (hit & real[:, None, :]).sum(2)  # (batch, heads)
        for split in (0, 1):
            self.tree_correct[split, layer] += per_sentence[batch.splits.numpy() == split].sum(0)

    def offset(self, r: int, direction: int) -> int:
        """The best fixed offset for relation ``r`` on the selection split (ties: the smallest ``|k|``, then the
        negative one): dependent -> head predicts the word at ``+k`` from the dependent; head -> dependent from
        the head, so its offset is the negative."""
        chosen = self.offsets[r]
        if not chosen:
            return 0
        k = min(chosen.items(), key=lambda kv: (-kv[1], abs(kv[0]), kv[0]))[0]
        return k if direction == 0 else -k

    def accuracies(self) -> pd.DataFrame:
        """Every head's accuracy over every word (both splits; nothing is chosen here): ``relation, direction,
        layer, head, accuracy, correct, count``."""
        r, d, layer, head = np.meshgrid(np.arange(len(self.relations)), np.arange(2), np.arange(self.layers),
                                        np.arange(self.heads), indexing="ij")
        count = self.count.sum(0)[r.ravel()]
        correct = self.correct.sum(0).ravel().astype(int)
        return pd.DataFrame({"relation": np.asarray(self.relations, dtype=object)[r.ravel()],
                             "direction": np.asarray(DIRECTIONS, dtype=object)[d.ravel()],
                             "layer": layer.ravel() + 1, "head": head.ravel(),
                             "accuracy": correct / np.maximum(count, 1), "correct": correct, "count": count})

    def under_min_count(self) -> dict[str, list[int]]:
        """Relations left out of :meth:`table`: relation -> ``[selection words, held-out words]``."""
        return {rel: [int(self.count[0, r]), int(self.count[1, r])] for r, rel in enumerate(self.relations)
                if min(self.count[:, r]) < self.min_count}

    def table(self) -> pd.DataFrame:
        """relations.csv: per relation and direction the head chosen on the selection split, its accuracy on the
        held-out split with a Wilson interval, the offset chosen likewise; relations with fewer than
        ``min_count`` words in either split are left out (:meth:`under_min_count`)."""
        rows = []
        n_rel = len(self.relations)
        for r, relation in enumerate(self.relations):
            chosen, n = int(self.count[0, r]), int(self.count[1, r])
            if min(chosen, n) < self.min_count:
                continue
            for d, direction in enumerate(DIRECTIONS):
                flat = int(np.argmax(self.correct[0, r, d].ravel()))
                selected = int(self.correct[0, r, d].ravel()[flat])
                correct = int(self.correct[1, r, d].ravel()[flat])
                low, high = wilson_interval(correct, n)
                offset = self.offset(r, d)
                base = self.offsets[n_rel + r][offset if d == 0 else -offset]
                rows.append({"relation": relation, "direction": direction, "layer": flat // self.heads + 1,
                             "head": flat % self.heads, "accuracy": correct / n, "low": low, "high": high,
                             "baseline_offset": offset, "baseline_accuracy": base / n, "count": n,
                             "selection_accuracy": selected / chosen, "selection_count": chosen})
        return pd.DataFrame(rows, columns=["relation", "direction", "layer", "head", "accuracy", "low", "high",
                                           "baseline_offset", "baseline_accuracy", "count", "selection_accuracy",
                                           "selection_count"])

    def uuas(self) -> pd.DataFrame:
        """Per head its attention tree's UUAS over every sentence (both splits; nothing chosen): ``layer, head,
        uuas, correct, edges``."""
        layer, head = np.meshgrid(np.arange(1, self.layers + 1), np.arange(self.heads), indexing="ij")
        correct = self.tree_correct.sum(0).ravel().astype(int)
        edges = int(self.tree_edges.sum())
        return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(), "uuas": correct / max(edges, 1),
                             "correct": correct, "edges": edges})

    def best_tree(self) -> dict:
        """The head whose attention trees are best on the selection split, with its UUAS there and on the
        held-out split (``uuas``)."""
        flat = int(np.argmax(self.tree_correct[0].ravel()))
        edges = np.maximum(self.tree_edges, 1)
        return {"layer": flat // self.heads + 1, "head": flat % self.heads,
                "uuas": float(self.tree_correct[1].ravel()[flat] / edges[1]),
                "selection_uuas": float(self.tree_correct[0].ravel()[flat] / edges[0]),
                "edges": int(self.tree_edges[1]), "selection_edges": int(self.tree_edges[0]),
                "symmetry": self.symmetry}


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
