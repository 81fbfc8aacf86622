"""Label probes, control tasks, MDL and the center of gravity (analysis.structure.probes, .mdl, .summary): each
number against a plain scikit-learn / numpy computation or a formula worked by hand."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from analysis.core.scores import wilson_interval
from analysis.core.treebank import read_conllu
from analysis.structure import mdl, probes
from analysis.structure.summary import LayerCounts, best_layer, center_of_gravity, resample_weights, summarise
from tests.support.data import FIXTURES

SENTENCES = read_conllu(FIXTURES / "ud_tiny_train.conllu").sentences
OFFSETS = np.concatenate([[0], np.cumsum([len(s) for s in SENTENCES])])


def test_edge_examples_are_dependent_then_head_and_skip_the_root():
    data = probes.label_data("deprel", SENTENCES, OFFSETS)
    assert len(data.rows) == sum(len(s) - 1 for s in SENTENCES)  # one arc per word but the root
    assert "root" not in set(data.labels)
    layer = np.random.default_rng(0).normal(size=(int(OFFSETS[-1]), 4)).astype(np.float32)
    s, first = SENTENCES[0], 0  # the multiword sentence: "I" -> "like" (nsubj)
    assert data.labels[first] == s.deprels[0] == "nsubj" and data.types[first] == "I"
    np.testing.assert_array_equal(data.features(layer)[first], np.concatenate([layer[0], layer[s.heads[0] - 1]]))
    upos = probes.label_data("upos", SENTENCES, OFFSETS)
    assert len(upos.rows) == OFFSETS[-1] and list(upos.labels[:len(s)]) == list(s.upos)


def test_control_labels_are_fixed_per_type_and_follow_the_label_distribution():
    rng = np.random.default_rng(1)
    labels = rng.choice(["A", "B", "C"], p=[0.6, 0.3, 0.1], size=20_000)
    types = np.array([f"w{i}" for i in rng.integers(0, 5000, size=20_000)], dtype=object)
    data = probes.LabelData(np.arange(20_000)[:, None], labels.astype(object), types, np.arange(20_000) // 10)
    control = probes.control_labels(data, set(types), seed=3)
    assert control == probes.control_labels(data, set(types), seed=3)  # seeded
    assert control != probes.control_labels(data, set(types), seed=4)
    relabelled = probes.with_control(data, control)
    assert pd.Series(relabelled.labels).groupby(types).nunique().max() == 1  # constant per type
    assert all(relabelled.labels[i] == control[t] for i, t in enumerate(types[:100]))
    per_type = Counter(control.values())
    empirical = Counter(labels.tolist())
    for name in "ABC":  # the types' labels are draws from the label distribution (5,000 draws: 4 sigma)
        p = empirical[name] / len(labels)
        assert abs(per_type[name] / len(control) - p) < 4 * math.sqrt(p * (1 - p) / len(control))


def test_macro_f1_and_its_bootstrap_equal_scikit_learn():
    rng = np.random.default_rng(0)
    y = rng.choice(list("abcde"), size=300).astype(object)
    pred = np.where(rng.random(300) < 0.6, y, rng.choice(list("abcdf"), size=300)).astype(object)
    sentence = np.sort(rng.integers(0, 40, size=300))
    sentence = np.unique(sentence, return_inverse=True)[1]
    value, _ = probes.macro_f1_bootstrap(y, pred, sentence)
    assert value == pytest.approx(f1_score(y.astype(str), pred.astype(str), average="macro"), abs=1e-12)
    weights = resample_weights(int(sentence.max()) + 1, 3, seed=5)
    _, samples = probes.macro_f1_bootstrap(y, pred, sentence, weights=weights)
    for w, got in zip(weights, samples, strict=True):  # a resample = each sentence's words repeated w times
        rows = np.concatenate([np.flatnonzero(sentence == s).repeat(int(c)) for s, c in enumerate(w)])
        assert got == pytest.approx(f1_score(y[rows].astype(str), pred[rows].astype(str), average="macro"))


def test_probe_scores_equal_a_plain_logistic_regression():
    rng = np.random.default_rng(0)
    train = probes.label_data("upos", SENTENCES, OFFSETS)
    code = {u: i for i, u in enumerate(sorted(set(train.labels)))}
    layer = rng.normal(size=(int(OFFSETS[-1]), 8)) + np.array([code[u] % 7 for u in train.labels])[:, None]
    layer = layer.astype(np.float32)
    scores = probes.run_layer("linear", train, train, layer, layer, len(SENTENCES), seed=0)
    plain = make_pipeline(StandardScaler(), LogisticRegression(max_iter=100, random_state=0)).fit(layer, train.labels)
    pred = scores.predictions  # equal to scikit-learn's to float32 (test_structure_softmax.py)
    assert np.mean(pred == plain.predict(layer)) >= 0.99
    assert scores.accuracy == pytest.approx(accuracy_score(train.labels, pred))
    assert scores.macro_f1 == pytest.approx(f1_score(train.labels.astype(str), pred.astype(str), average="macro"))
    assert scores.accuracy_ci == wilson_interval(int((pred == train.labels).sum()), len(pred))
    assert scores.correct_per_sentence.sum() == int((pred == train.labels).sum())
    assert scores.macro_f1_ci[0] <= scores.macro_f1 <= scores.macro_f1_ci[1]


def test_the_baseline_is_the_training_majority_scored_on_test():
    train = probes.label_data("upos", SENTENCES, OFFSETS)
    test_sents = read_conllu(FIXTURES / "ud_tiny_test.conllu").sentences
    test = probes.label_data("upos", test_sents, np.concatenate([[0], np.cumsum([len(s) for s in test_sents])]))
    majority = Counter(train.labels.tolist()).most_common(1)[0][0]
    base = probes.baseline(train, test)
    assert base["class"] == majority and base["accuracy"] == pytest.approx(np.mean(test.labels == majority))
    guess = np.full(len(test.labels), majority, dtype=object)  # macro-F1 defined as the probes' (sklearn's default)
    assert base["macro_f1"] == pytest.approx(f1_score(test.labels.astype(str), guess.astype(str), average="macro"))
    assert base["macro_f1"] == pytest.approx(probes.macro_f1_bootstrap(test.labels, guess, test.sentence)[0])


# --- MDL ---------------------------------------------------------------------------------------------------------

def test_block_ends_are_the_papers_portions():
    assert mdl.block_ends(10_000) == [10, 20, 40, 80, 160, 320, 625, 1250, 2500, 5000, 10_000]
    assert mdl.block_ends(50)[0] == 1 and mdl.block_ends(50)[-1] == 50


def test_online_codelength_equals_the_formula_on_a_toy_problem():
    """A "probe" that predicts the label frequencies of its training block (add-one smoothed): the codelength is
    t_1 log2 K plus each later label's -log2 of the mixed probability, worked out here without the module."""
    rng = np.random.default_rng(0)
    k, n = 3, 2000
    y = rng.choice(k, p=[0.7, 0.2, 0.1], size=n)
    x = np.zeros((n, 1))

    def frequencies(x_train, y_train, x_eval, classes):
        p = (np.bincount(y_train, minlength=classes) + 1) / (len(y_train) + classes)
        return np.tile(p, (len(x_eval), 1))

    got = mdl.online_codelength(x, y, frequencies, k, seed=7)
    order = np.random.default_rng(7).permutation(n)
    ys = y[order]
    ends = [2, 4, 8, 16, 32, 64, 125, 250, 500, 1000, 2000]
    expected = ends[0] * math.log2(k)
    for start, stop in zip(ends[:-1], ends[1:], strict=True):
        p = (np.bincount(ys[:start], minlength=k) + 1) / (start + k)
        for label in ys[start:stop]:
            expected -= math.log2((1 - mdl.EPS) * p[label] + mdl.EPS / k)
    assert got.online_bits == pytest.approx(expected, rel=1e-12)
    assert got.uniform_bits == pytest.approx(n * math.log2(k))
    assert got.compression == pytest.approx(n * math.log2(k) / expected)
    assert got.compression > 1  # the labels are skewed: frequencies compress them

    def uniform(x_train, y_train, x_eval, classes):
        return np.full((len(x_eval), classes), 1 / classes)

    assert mdl.online_codelength(x, y, uniform, k).compression == pytest.approx(1.0)


def test_labels_unseen_in_an_early_block_cost_finite_bits():
    rng = np.random.default_rng(0)
    y = np.r_[np.zeros(995, int), np.ones(5, int)]
    x = rng.normal(size=(1000, 3)) + y[:, None] * 3
    code = mdl.online_codelength(x, y, mdl.probe_fit_proba("linear", 0), 2, seed=0)
    assert np.isfinite(code.online_bits) and all(np.isfinite(code.block_bits))


# --- summary -----------------------------------------------------------------------------------------------------

def test_center_of_gravity_is_tenneys_expectation_under_cumulative_gains():
    scores = np.array([0.5, 0.7, 0.6, 0.9])  # running maximum 0.5 0.7 0.7 0.9: gains 0.2 (l=1), 0 (2), 0.2 (3)
    assert center_of_gravity(scores, [0, 1, 2, 3])[0] == pytest.approx((1 * 0.2 + 3 * 0.2) / 0.4)
    rising = np.array([0.1, 0.4, 0.5, 0.8, 0.8])
    delta = np.diff(rising)
    assert center_of_gravity(rising, [0, 1, 2, 3, 4])[0] == pytest.approx((np.arange(1, 5) * delta).sum() / delta.sum())
    assert center_of_gravity(rising[[0, 2, 4]], [0, 2, 4])[0] == pytest.approx((2 * 0.4 + 4 * 0.3) / 0.7)
    assert np.isnan(center_of_gravity(np.array([0.9, 0.8]), [0, 1])[0])
    assert best_layer(np.array([0.2, 0.9, 0.9]), [0, 1, 2])[0] == 1


def test_summary_bootstrap_rescores_every_layer_from_sentence_counts():
    rng = np.random.default_rng(0)
    total = rng.integers(1, 10, size=(3, 50)).astype(float)
    total[:] = total[0]
    correct = np.floor(total * np.array([[0.2], [0.6], [0.5]]) + rng.random((3, 50)))
    counts = LayerCounts("upos", "accuracy", [0, 1, 2], correct, total)
    row = summarise([counts], n_boot=200, seed=1).iloc[0]
    plain = correct.sum(1) / total.sum(1)
    assert row.best_layer == int(np.argmax(plain)) and row.best_score == pytest.approx(plain.max())
    assert row.center_of_gravity == pytest.approx(center_of_gravity(plain, [0, 1, 2])[0])
    weights = resample_weights(50, 200, seed=1)
    boot = (weights @ correct.T) / (weights @ total.T)
    cogs = center_of_gravity(boot, [0, 1, 2])
    assert row.center_of_gravity_ci_low == pytest.approx(np.percentile(cogs[np.isfinite(cogs)], 2.5))
    assert row.center_of_gravity_ci_low <= row.center_of_gravity <= row.center_of_gravity_ci_high


def test_the_mlp_probe_is_one_hidden_layer_of_256_and_fits_small_blocks():
    from sklearn.neural_network import MLPClassifier

    rng = np.random.default_rng(0)
    train = probes.label_data("upos", SENTENCES, OFFSETS)
    layer = rng.normal(size=(int(OFFSETS[-1]), 8)).astype(np.float32)
    scores = probes.run_layer("mlp", train, train, layer, layer, len(SENTENCES), seed=0)
    plain = make_pipeline(StandardScaler(), MLPClassifier(hidden_layer_sizes=(256,), max_iter=200, random_state=0,
                                                          early_stopping=False)).fit(layer, train.labels)
    assert scores.accuracy == pytest.approx(accuracy_score(train.labels, plain.predict(layer)))
    assert probes.fit("mlp", layer[:3], np.array(["a", "a", "b"], dtype=object), 0).predict(layer[:2]).shape == (2,)
