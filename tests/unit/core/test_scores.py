"""Scores with their baselines: Wilson intervals (scipy's), the majority-class baseline, one-class runs."""

import numpy as np
import pytest
from scipy.stats import binomtest
from sklearn.metrics import f1_score

from analysis.core.scores import classification_metrics, majority_baseline, majority_class, wilson_interval


@pytest.mark.parametrize("k, n", [(0, 1), (1, 1), (0, 5), (5, 5), (3, 7), (640, 1000), (1, 2)])
def test_wilson_interval_is_scipys_and_stays_in_0_1(k, n):
    ref = binomtest(k, n).proportion_ci(0.95, method="wilson")
    low, high = wilson_interval(k, n)
    assert (low, high) == pytest.approx((ref.low, ref.high), abs=1e-12)
    assert 0 <= low <= k / n <= high <= 1


def test_a_one_class_model_scores_the_majority_baseline_and_is_flagged():
    """The review's case: every row predicted 'positive' reads 0.643 accuracy, which is the majority rate."""
    names = ["negative", "neutral", "positive"]
    labels = np.array([2] * 9 + [0] * 3 + [1] * 2)  # 9/14 = 0.643 positive
    m = classification_metrics(np.full(14, 2), labels, names, majority_class([2, 2, 0, 1], [0, 1, 2]))
    assert m["accuracy"] == pytest.approx(9 / 14) == m["baseline"]["accuracy"]
    assert m["baseline"]["class"] == "positive" and m["one_class"] and m["predicted_classes"] == 1
    assert m["baseline"]["macro_f1"] == pytest.approx(f1_score(labels, np.full(14, 2), average="macro"))
    assert m["confusion_matrix"][2] == [0, 0, 9]


def test_the_baseline_class_comes_from_the_training_rows():
    base = majority_baseline(["a", "a", "b"], ["b", "b", "a"])
    assert base["class"] == "a" and base["accuracy"] == pytest.approx(1 / 3)
