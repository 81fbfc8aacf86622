"""Figures that cannot mislead: anchored colour scales, visible groups, one colour per class everywhere."""

import numpy as np
import pandas as pd
import pytest

from analysis.heads import near_uniform
from analysis.plots import label_colours, layer_weight_heatmap, mean_weight_lines


def weights_frame(w: np.ndarray) -> pd.DataFrame:
    frame = pd.DataFrame(w, columns=[f"layer_{i + 1}" for i in range(w.shape[1])])
    frame.insert(0, "example_id", range(len(w)))
    return frame


def test_a_weight_heat_map_that_learned_nothing_does_not_look_like_a_preference():
    """The review's case: a scalar mix at 0.1994-0.2008 was drawn over the whole colour scale."""
    w = np.full((6, 5), 0.2) + np.linspace(-6e-4, 8e-4, 5)
    fig = layer_weight_heatmap(weights_frame(w), pd.Series(["a", "b"] * 3), [f"L{i}" for i in range(6)])
    heat = fig.data[0]
    assert heat.zmin == 0 and heat.zmax == pytest.approx(2 / 5)  # anchored at 0 and twice the uniform weight
    assert near_uniform(w) and not near_uniform(np.array([[0.5, 0.1, 0.1, 0.1, 0.2]]))
    peaked = np.array([[0.9, 0.025, 0.025, 0.025, 0.025]])
    assert layer_weight_heatmap(weights_frame(peaked), pd.Series(["a"]), [f"L{i}" for i in range(6)]) \
        .data[0].zmax == pytest.approx(0.9)


def test_the_heat_map_shows_its_label_groups():
    w = np.random.default_rng(0).dirichlet(np.ones(4), 7)
    labels = pd.Series(["pos", "neg", "pos", "neg", "neu", "pos", "neg"])
    fig = layer_weight_heatmap(weights_frame(w), labels, [f"L{i}" for i in range(5)])
    assert list(fig.layout.yaxis.ticktext) == ["neg", "neu", "pos"]  # a tick per group, in the rows' order
    assert list(fig.layout.yaxis.tickvals) == [1.0, 3.0, 5.0]  # rows 0-2 neg, 3 neu, 4-6 pos
    assert len(fig.layout.shapes) == 2  # a line between neighbouring groups


def test_a_class_keeps_its_colour_in_every_chart():
    colours = label_colours(["neg", "neu", "pos"])
    w = weights_frame(np.full((3, 4), 0.25))
    fig = mean_weight_lines({"pos": w, "neg": w}, [f"L{i}" for i in range(5)], "by class", colours)
    assert {t.name: t.line.color for t in fig.data} == {"pos": colours["pos"], "neg": colours["neg"]}


def test_labels_are_shown_as_text_never_rendered():
    """Issue 20.9: a class label with HTML or markdown is escaped in every figure that shows labels."""
    import pandas as pd

    from analysis.plots import atlas_grid, layer_weight_heatmap, mean_weight_lines
    from ui.results import md_plain

    hostile = '<a href="http://evil">click</a>'
    coords = pd.DataFrame({"layer": [0] * 4, "example_id": range(4), "x": [0.0, 1, 2, 3], "y": [0.0, 1, 0, 1],
                           "label": [hostile, hostile, "ok", "ok"]})
    fig = atlas_grid(coords, {i: f"text {i}" for i in range(4)}, ["embeddings"])
    names = {t.name for t in fig.data}
    assert "&lt;a href=&quot;http://evil&quot;&gt;click&lt;/a&gt;" in names and hostile not in names
    weights = pd.DataFrame({"example_id": [0, 1], "layer_0": [0.5, 0.4], "layer_1": [0.5, 0.6]})
    heat = layer_weight_heatmap(weights, pd.Series([hostile, "ok"]), ["embeddings", "layer 1"])
    assert hostile not in str(heat.to_plotly_json())
    lines = mean_weight_lines({hostile: weights}, ["embeddings", "layer 1"], "t")
    assert lines.data[0].name.startswith("&lt;a")
    assert md_plain("[x](http://e) **b**") == r"\[x\]\(http\://e\) \*\*b\*\*"
