"""Issue 53 item 15: a classifier of many classes neither writes a column per class and layer nor holds more
probabilities than the bound: examples.csv keeps the label's and the prediction's probability, and too many
rows x layers x classes is one line before any batch runs."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.classifier_lens import lens
from analysis.core.inputs import InputError


def test_many_classes_keep_the_label_and_prediction_columns():
    rng = np.random.default_rng(0)
    n, layers, classes = 6, 3, lens.MAX_CLASS_COLUMNS + 10
    probs = rng.dirichlet(np.ones(classes), size=(n, layers))
    labels = rng.integers(0, classes, n)
    names = [f"c{i}" for i in range(classes)]
    frame = lens.example_table(probs, range(n), ["t"] * n, labels, names)
    assert [c for c in frame.columns if c.startswith("p_l")] == [f"p_l{i}_{w}" for i in range(layers)
                                                                 for w in ("label", "prediction")]
    np.testing.assert_allclose(frame["p_l1_label"], probs[np.arange(n), 1, labels])
    final = probs[:, -1].argmax(-1)
    np.testing.assert_allclose(frame["p_l0_prediction"], probs[np.arange(n), 0, final])


def test_too_many_probabilities_are_refused_before_running(monkeypatch):
    class Readout:
        num_layers, num_classes = 12, 10_000

        def states(self, inputs):
            raise AssertionError("no batch may run")

    encoded = lens.Encoded([[1, 2]] * 5000, None, 8, 0)
    with pytest.raises(InputError, match="GB, over the classifier lens"):
        lens.layer_probabilities(Readout(), encoded, 0, "cpu")
