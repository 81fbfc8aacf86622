"""Structural probes (analysis.structure.structural): UUAS against scipy's minimum spanning tree, Spearman against
scipy.stats.spearmanr, H&M's per-length averaging against a plain loop, and planted structure recovered whole."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.stats import spearmanr

from analysis.core.treebank import read_conllu
from analysis.core.trees import prim_edges
from analysis.structure import structural
from tests.support.data import FIXTURES

TRAIN = read_conllu(FIXTURES / "ud_tiny_train.conllu").sentences
TEST = read_conllu(FIXTURES / "ud_tiny_test.conllu").sentences


def scipy_edges(dist: np.ndarray) -> set:
    tree = minimum_spanning_tree(dist + 1e-9).tocoo()  # scipy drops zero weights: none here
    return {(int(min(i, j)), int(max(i, j))) for i, j in zip(tree.row, tree.col, strict=True)}


@pytest.mark.parametrize("n", [2, 5, 17, 40])
def test_prims_tree_is_scipys_minimum_spanning_tree(n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, 6))
    dist = ((x[:, None] - x[None]) ** 2).sum(-1)
    assert prim_edges(dist) == scipy_edges(dist)


def test_uuas_equals_a_plain_scipy_computation_without_punctuation():
    rng = np.random.default_rng(0)
    correct = total = 0
    preds = []
    for s in TEST:
        pred = s.distances() + rng.normal(scale=1.0, size=(len(s), len(s)))
        pred = np.abs(pred + pred.T) / 2
        preds.append(pred)
        keep = [i for i, u in enumerate(s.upos) if u != "PUNCT"]
        sub = np.ix_(keep, keep)
        gold = {(min(i, h - 1), max(i, h - 1)) for i, h in enumerate(s.heads) if h and i in keep and h - 1 in keep}
        predicted = {(keep[a], keep[b]) for a, b in scipy_edges(pred[sub])}
        correct += len(gold & predicted)
        total += len(gold)
    scores = structural.distance_scores(preds, TEST)
    assert 0 < scores["uuas"] < 1 and scores["uuas"] == pytest.approx(correct / total)


def test_distance_and_norm_spearman_are_averaged_per_length_then_over_lengths_5_to_50():
    rng = np.random.default_rng(1)
    preds = [s.distances() + rng.random((len(s), len(s))) * 3 for s in TEST]
    by_len: dict[int, list] = {}
    for p, s in zip(preds, TEST, strict=True):
        for i in range(len(s)):
            by_len.setdefault(len(s), []).append(spearmanr(p[i], s.distances()[i]).statistic)
    expected = np.mean([np.mean(v) for n, v in by_len.items() if 5 <= n <= 50])
    assert structural.distance_scores(preds, TEST)["spearman"] == pytest.approx(expected)
    depths = [s.depths() + rng.random(len(s)) * 2 for s in TEST]
    by_len = {}
    for p, s in zip(depths, TEST, strict=True):
        by_len.setdefault(len(s), []).append(spearmanr(p, s.depths()).statistic)
    expected = np.mean([np.mean(v) for n, v in by_len.items() if 5 <= n <= 50])
    scores = structural.depth_scores(depths, TEST)
    assert scores["spearman"] == pytest.approx(expected)
    roots = [s.upos[int(np.argmin(np.where([u == "PUNCT" for u in s.upos], np.inf, p)))] for p, s in
             zip(depths, TEST, strict=True)]
    hits = [int(np.argmin(np.where([u == "PUNCT" for u in s.upos], np.inf, p))) == s.root for p, s in
            zip(depths, TEST, strict=True)]
    assert roots and scores["root_acc"] == pytest.approx(np.mean(hits))


def test_spearman_rows_match_scipy_with_ties():
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 4, size=(6, 12)).astype(float), rng.normal(size=(6, 12))
    for i in range(6):
        assert structural.spearman_rows(a, b)[i] == pytest.approx(spearmanr(a[i], b[i]).statistic)


def planted(sentences, seed: int, noise_dims: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Hewitt & Manning's Pythagorean embedding: word i = the sum of one unit vector per arc on its path to the
    root (axis = the arc's dependent), so in those axes |h_i - h_j|^2 = d_T(i, j) and |h_i|^2 = depth(i); plus
    noise axes the probe has to ignore."""
    rng = np.random.default_rng(seed)
    width = max(map(len, sentences))
    rows = []
    for s in sentences:
        h = np.zeros((len(s), width + noise_dims))
        for i in range(len(s)):
            j = i
            while s.heads[j]:
                h[i, j] += 1
                j = s.heads[j] - 1
        h[:, width:] = rng.normal(size=(len(s), noise_dims))
        rows.append(h)
    return np.concatenate(rows).astype(np.float32), np.concatenate([[0], np.cumsum([len(s) for s in sentences])])


def test_the_pythagorean_embedding_is_exact():
    x, offsets = planted(TEST, 0)
    width = max(map(len, TEST))
    for k, s in enumerate(TEST):
        h = x[offsets[k]:offsets[k + 1], :width]
        np.testing.assert_allclose(((h[:, None] - h[None]) ** 2).sum(-1), s.distances())
        np.testing.assert_allclose((h ** 2).sum(-1), s.depths())


def planted_scores(task: str) -> dict:
    """A rank-12 probe of ``task`` trained on planted vectors and scored on others (one torch thread, restored)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x_train, o_train = planted(TRAIN, 0)
        x_test, o_test = planted(TEST, 1)
        fitted = structural.train(task, x_train, o_train, TRAIN, rank=12, seed=0, lr=1e-2, max_epochs=12)
        predicted = structural.predict(fitted.probe, x_test, o_test, TEST)
        return (structural.distance_scores if task == "distance" else structural.depth_scores)(predicted, TEST)
    finally:
        torch.set_num_threads(threads)


def test_planted_tree_distances_are_found_uuas_one():
    scores = planted_scores("distance")
    assert scores["uuas"] == 1.0 and scores["spearman"] > 0.85


def test_planted_depths_are_found_root_accuracy_one():
    scores = planted_scores("depth")
    assert scores["root_acc"] == 1.0 and scores["spearman"] > 0.8


def test_random_vectors_find_no_tree():
    x = np.random.default_rng(0).normal(size=(sum(map(len, TRAIN)), 24)).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in TRAIN])])
    fitted = structural.train("distance", x, offsets, TRAIN, rank=12, seed=0, lr=1e-2, max_epochs=3)
    assert structural.distance_scores(structural.predict(fitted.probe, x, offsets, TRAIN), TRAIN)["uuas"] < 0.9


def test_the_loss_is_hewitt_and_mannings_l1_over_squared_length():
    pred, y = torch.tensor([[[0.0, 2.0], [2.0, 0.0]]]), torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    assert structural.loss_of("distance", pred, y, torch.ones_like(y), torch.tensor([2.0])).item() == 0.5
    pred, y = torch.tensor([[1.0, 3.0, 0.0]]), torch.tensor([[0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third position is padding
    assert structural.loss_of("depth", pred, y, mask, torch.tensor([2.0])).item() == 1.5


def test_predicted_distances_are_squared_norms_of_b_times_differences():
    probe = structural.Probe("distance", 6, 4)
    h = torch.randn(2, 5, 6)
    t = h @ probe.B.detach().T
    expected = ((t[:, :, None] - t[:, None]) ** 2).sum(-1)
    torch.testing.assert_close(probe(h).detach(), expected, atol=1e-5, rtol=1e-5)
    depth = structural.Probe("depth", 6, 4)
    depth.B.data = probe.B.data
    torch.testing.assert_close(depth(h).detach(), (t ** 2).sum(-1))


def test_a_packed_batch_is_the_padded_batch_without_the_padding():
    """The probes train on packed batches (no h B^T for padding): the same predictions and gradient as the
    zero-padded batch."""
    rng = np.random.default_rng(0)
    sentences = read_conllu(FIXTURES / "ud_tiny_train.conllu").sentences[:3]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sentences])])
    layer = rng.normal(size=(int(offsets[-1]), 6)).astype(np.float32)
    for kind in structural.STRUCTURAL_TASKS:
        targets = [structural.gold(kind, s) for s in sentences]
        packed, y, mask, lengths = structural._batch(kind, layer, offsets, sentences, [2, 0, 1], targets)
        padded = torch.zeros(packed.sentences, packed.longest, 6)
        padded[packed.rows, packed.cols] = packed.h
        for row, i in enumerate([2, 0, 1]):  # sentence after sentence, in the batch's order
            torch.testing.assert_close(padded[row, :len(sentences[i])], torch.from_numpy(
                layer[offsets[i]:offsets[i + 1]]), rtol=0, atol=0)
        probe = structural.Probe(kind, 6, 4, torch.Generator().manual_seed(1))
        grads = []
        for h in (packed, padded):
            probe.zero_grad()
            out = probe(h)
            structural.loss_of(kind, out, y, mask, lengths).backward()
            grads.append((out.detach(), probe.B.grad.clone()))
        torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-5, rtol=1e-5)
