"""Undirected dependency trees shared by the analyses that score them: the minimum spanning tree (Prim's
algorithm), the punctuation rule (words whose UPOS is ``PUNCT`` are left out) and the unlabelled undirected
attachment score's counts (UUAS, Hewitt & Manning 2019 §3.2: the gold edges are the minimum spanning tree of the
gold tree distances among the non-punctuation words).

Moved here unchanged from ``analysis.structure.structural`` (the structural probe's scores) so that the
attention-heads analysis (``analysis.heads``, Clark et al. 2019 §4.2) scores its attention trees with the same
code; a technique never imports another technique."""

from __future__ import annotations

import numpy as np

from analysis.core.treebank import Sentence


def prim_edges(dist: np.ndarray) -> set[tuple[int, int]]:
    """The minimum spanning tree of a complete graph with weights ``dist`` ``(n, n)`` by Prim's algorithm:
    edges ``(i, j)`` with ``i < j``."""
    n = len(dist)
    if n < 2:
        return set()
    inside = np.zeros(n, bool)
    inside[0] = True
    best = dist[0].astype(float).copy()
    parent = np.zeros(n, int)
    edges = set()
    for _ in range(n - 1):
        cand = np.where(inside, np.inf, best)
        j = int(np.argmin(cand))
        edges.add((min(j, parent[j]), max(j, parent[j])))
        inside[j] = True
        closer = dist[j] < best
        best = np.where(closer, dist[j], best)
        parent = np.where(closer, j, parent)
    return edges


def non_punct(sentence: Sentence) -> np.ndarray:
    return np.array([u != "PUNCT" for u in sentence.upos])


def uuas_counts(pred: np.ndarray, sentence: Sentence) -> tuple[int, int, set, set]:
    """``(correct, gold edges, predicted edges, gold edges)`` of one sentence; edges as (i, j) positions, i < j,
    among its non-punctuation words."""
    keep = np.flatnonzero(non_punct(sentence))
    sub = np.ix_(keep, keep)
    gold_edges = {(int(keep[a]), int(keep[b])) for a, b in prim_edges(sentence.distances()[sub])}
    pred_edges = {(int(keep[a]), int(keep[b])) for a, b in prim_edges(pred[sub])}
    return len(gold_edges & pred_edges), len(gold_edges), pred_edges, gold_edges
