"""The classifier lens's tables against straightforward computations (scipy, scikit-learn, a loop), its intervals
on planted data, and the tuned lens's refusal and training."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import entropy
from sklearn.metrics import accuracy_score

from analysis.classifier_lens import lens, tuned
from analysis.core.inputs import InputError


def random_probs(n=40, layers=5, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, layers, classes)) * 2
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_layer_table_is_sklearn_and_scipy():
    probs = random_probs()
    labels = np.random.default_rng(1).integers(0, 3, len(probs))
    table = lens.layer_table(probs, labels, ["a", "b", "c"])
    for layer in range(probs.shape[1]):
        row = table.iloc[layer]
        assert row["accuracy"] == pytest.approx(accuracy_score(labels, probs[:, layer].argmax(-1)))
        assert row["agreement"] == pytest.approx(accuracy_score(probs[:, -1].argmax(-1), probs[:, layer].argmax(-1)))
        assert row["kl_to_final"] == pytest.approx(np.mean([entropy(p[-1], p[layer]) for p in probs]))
        assert row["accuracy_low"] <= row["accuracy"] <= row["accuracy_high"]
        assert row["agreement_low"] <= row["agreement"] <= row["agreement_high"]
        counts = np.bincount(probs[:, layer].argmax(-1), minlength=3)
        assert row["top_class_share"] == pytest.approx(counts.max() / len(probs))
    assert table["majority_baseline"].iloc[0] == pytest.approx(np.bincount(labels).max() / len(labels))
    assert table["agreement"].iloc[-1] == 1 and table["kl_to_final"].iloc[-1] == 0


def test_decision_layer_is_the_first_layer_that_stays_final():
    probs = random_probs(200, 6, 3, seed=2)
    predicted = probs.argmax(-1)
    expected = [min(k for k in range(6) if all(predicted[i, j] == predicted[i, -1] for j in range(k, 6)))
                for i in range(len(probs))]
    assert lens.decision_layers(probs).tolist() == expected


def test_the_accuracy_interval_covers_a_planted_accuracy_at_its_rate():
    rng = np.random.default_rng(3)
    covered, trials, true = 0, 400, 0.7
    for _ in range(trials):
        labels = rng.integers(0, 2, 60)
        right = rng.random(60) < true
        predicted = np.where(right, labels, 1 - labels)
        probs = np.zeros((60, 1, 2))
        probs[np.arange(60), 0, predicted] = 1
        row = lens.layer_table(probs, labels, ["x", "y"]).iloc[0]
        covered += row["accuracy_low"] <= true <= row["accuracy_high"]
    assert covered / trials >= 0.92  # a 95% interval (Wilson: close to its nominal rate at n = 60)


def test_labels_by_name_or_id_and_an_unknown_label_is_one_line():
    assert lens.label_ids(["pos", "neg", "1"], ["neg", "pos"]).tolist() == [1, 0, 1]
    with pytest.raises(InputError, match="label 'maybe' is not one of the classifier's classes"):
        lens.label_ids(["maybe"], ["neg", "pos"])


def test_the_example_table_holds_every_layers_probabilities():
    probs = random_probs(4, 3, 2)
    frame = lens.example_table(probs, [10, 11, 12, 13], list("abcd"), np.array([0, 1, 0, 1]), ["neg", "pos"])
    assert frame["row"].tolist() == [10, 11, 12, 13]
    assert frame["p_l1_pos"].tolist() == pytest.approx(probs[:, 1, 1].tolist())
    assert frame["prediction"].tolist() == [["neg", "pos"][i] for i in probs[:, -1].argmax(-1)]


def test_the_tuned_lens_refuses_too_few_rows_in_one_line():
    with pytest.raises(InputError, match=r"needs at least 100 rows .* this data has 40"):
        tuned.split(40, 0)
    train, held = tuned.split(100, 0)
    assert len(held) == 20 and not set(train) & set(held) and len(train) + len(held) == 100
