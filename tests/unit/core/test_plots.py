"""Figures that cannot mislead: anchored colour scales, visible groups, one colour per class everywhere."""

import numpy as np
import pandas as pd
import pytest

from analysis.core.figures import label_colours
from analysis.training.heads import near_uniform
from analysis.training.plots import layer_weight_heatmap, mean_weight_lines


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

    from analysis.atlas.plots import atlas_grid
    from analysis.training.plots import layer_weight_heatmap, mean_weight_lines
    from ui.results import md_plain

    hostile = '<a href="http://evil">click</a>'
    coords = pd.DataFrame({"layer": [0] * 4, "example_id": range(4), "x": [0.0, 1, 2, 3], "y": [0.0, 1, 0, 1],
                           "label": [hostile, hostile, "ok", "ok"]})
    fig = atlas_grid(coords, {i: f"text {i}" for i in range(4)}, ["embeddings"])
    names = {t.name for t in fig.data}
    assert '&lt;a href="http://evil"&gt;click&lt;/a&gt;' in names and hostile not in names
    weights = pd.DataFrame({"example_id": [0, 1], "layer_0": [0.5, 0.4], "layer_1": [0.5, 0.6]})
    heat = layer_weight_heatmap(weights, pd.Series([hostile, "ok"]), ["embeddings", "layer 1"])
    assert hostile not in str(heat.to_plotly_json())
    lines = mean_weight_lines({hostile: weights}, ["embeddings", "layer 1"], "t")
    assert lines.data[0].name.startswith("&lt;a")
    assert md_plain("[x](http://e) **b**") == r"\[x\]\(http\://e\) \*\*b\*\*"


TYPED = '"a" <b>x</b> \u202eevil\u2066'  # markup, quotes, a right-to-left override and an isolate
SHOWN = '"a" <b>x</b> \\u202eevil\\u2066'  # as typed, the bidi controls written out so that nothing reorders


def plotly_shows(text: str) -> str:
    """What Plotly displays for a text piece: it renders tags (none may come from the data) and decodes only
    ``&mu; &amp; &lt; &gt; &nbsp; &times; &plusmn; &deg;`` and numeric entities (plotly.js ``convertEntities``)."""
    import html
    import re

    assert not re.search(r"<[A-Za-z/]", text), text
    named = {"mu", "amp", "lt", "gt", "nbsp", "times", "plusmn", "deg"}
    return re.sub(r"&(#\d+|#x[\da-fA-F]+|[a-z]+);",
                  lambda m: html.unescape(m[0]) if m[1][0] == "#" or m[1] in named else m[0], text)


def test_a_label_is_shown_exactly_as_typed_with_bidi_controls_made_visible():
    """Issue 25.12: quotes were shown as &quot;, and U+202E reversed the rest of a legend entry."""
    import re

    from analysis.atlas.plots import atlas_grid, separability_curve
    from analysis.core.figures import plain
    from ui.results import md_plain

    coords = pd.DataFrame({"layer": [0] * 4, "example_id": range(4), "x": [0.0, 1, 2, 3], "y": [0.0, 1, 0, 1],
                           "label": [TYPED, TYPED, "ok", "ok"]})
    fig = atlas_grid(coords, {i: f"text {i} {TYPED}" for i in range(4)}, ["embeddings"])
    trace = next(t for t in fig.data if t.name != "ok")
    assert plotly_shows(trace.name) == SHOWN  # the legend
    ours = r"</?(b|br|extra)>"  # the hover template's own markup
    assert SHOWN in plotly_shows(re.sub(ours, "", trace.hovertemplate))
    assert all(plotly_shows(h) == f"text {i} {SHOWN}" for i, h in zip((0, 1), (c[1] for c in trace.customdata),
                                                                       strict=True))
    sep = separability_table(3)
    curve = separability_curve({TYPED: sep}, {TYPED: ["embeddings", "layer 1", "layer 2"]})
    assert plotly_shows(curve.data[1].name) == SHOWN and SHOWN in plotly_shows(re.sub(ours, "", curve.data[1]
                                                                                          .hovertemplate))
    assert "\u202e" not in str(fig.to_plotly_json()) + str(curve.to_plotly_json())
    assert plotly_shows(plain("tab\there, NUL \x00, RLM \u200f")) == r"tab\u0009here, NUL \u0000, RLM \u200f"
    assert plotly_shows(plain("emoji 👨\u200d👩 and ünïcode")) == "emoji 👨\u200d👩 and ünïcode"  # joiners kept
    # Streamlit markdown: every markdown/HTML character escaped, so the text is shown, never rendered
    md = md_plain(TYPED)
    assert "\u202e" not in md and re.sub(r"\\(.)", r"\1", md) == SHOWN


# --- issue 24: models of different depth, hovers, PCA variance, one epoch ----------------------------------

def probe_layers(states: int) -> pd.DataFrame:
    """A reconstruction ``layers`` table of ``states`` hidden states (values do not matter here)."""
    acc = np.linspace(1, 0.2, states)
    return pd.DataFrame({"layer": range(states), "tokens": 10, "correct": (acc * 10).astype(int), "accuracy": acc,
                         "sentence_mean": acc, "ci_low": acc - 0.05, "ci_high": np.minimum(acc + 0.05, 1)})


def separability_table(states: int) -> pd.DataFrame:
    acc = np.linspace(0.4, 0.9, states)
    return pd.DataFrame({"layer": range(states), "silhouette": np.linspace(0, 0.2, states), "probe_accuracy": acc,
                         "probe_accuracy_std": 0.01, "probe_macro_f1": acc, "probe_ci_low": acc - 0.05,
                         "probe_ci_high": acc + 0.05, "majority_baseline": 0.34})


def depth_names() -> dict[str, list[str]]:
    """The demo model's 4 layers and a 7-layer duplication export of it (names from models.anatomy)."""
    from models.anatomy import layer_name

    plan = (0, 1, 1, 2, 2, 3, 3)
    return {"demo": [layer_name(i, 4) for i in range(5)],
            "deeper": [layer_name(i, 7, plan, "bert") for i in range(8)]}


def named_traces(fig, label: str) -> list:
    """The traces of run ``label`` that carry layer names in their hover (customdata[:, 0])."""
    return [t for t in fig.data if t.legendgroup == label and t.customdata is not None]


@pytest.mark.parametrize("which", ["separability", "accuracy"])
def test_models_of_different_depth_keep_their_own_layers(which):
    """Issue 24.2: a 4-layer and a 7-layer model: each curve at its own indices with its own names (hover), and
    no model's names under the other's points; relative depth puts layer i of L at i / L, said on the axis."""
    from analysis.atlas.plots import separability_curve
    from analysis.probe.plots import accuracy_curve

    names = depth_names()
    assert names["deeper"][3] == "3 ← 2"
    draw, table = {"separability": (separability_curve, separability_table),
                   "accuracy": (accuracy_curve, probe_layers)}[which]
    runs = {label: table(len(n)) for label, n in names.items()}
    fig = draw(runs, names)
    for label, own in names.items():
        traces = named_traces(fig, label)
        assert traces
        for t in traces:
            assert list(t.x) == list(range(len(own)))
            assert [c[0] for c in t.customdata] == own
    assert fig.layout.xaxis.ticktext is None  # the deeper model's "3 ← 2" is not written under the demo's layer 3
    relative = draw(runs, names, relative=True)
    for label, own in names.items():
        for t in named_traces(relative, label):
            assert list(t.x) == pytest.approx([i / (len(own) - 1) for i in range(len(own))])
            assert min(t.x) == 0 and max(t.x) == 1
            assert [c[0] for c in t.customdata] == own
    axis = relative.layout.xaxis2 if which == "separability" else relative.layout.xaxis
    assert "relative depth" in axis.title.text and "layer / L" in axis.title.text
    plain_axis = fig.layout.xaxis2 if which == "separability" else fig.layout.xaxis
    assert "relative" not in plain_axis.title.text


def test_a_duplicated_model_aligned_on_its_own_axis_keeps_its_tick_names():
    """The duplication page's chart: the original's layers placed at their last copy are in the deeper model's
    coordinates, so the ticks may say "new ← source"."""
    from analysis.duplication.plan import aligned_positions
    from analysis.probe.plots import accuracy_curve

    names = depth_names()
    fig = accuracy_curve({"original": probe_layers(5), "deeper": probe_layers(8)},
                         {"original": names["demo"], "deeper": names["deeper"]},
                         positions={"original": aligned_positions([0, 1, 1, 2, 2, 3, 3], 4, "bert")})
    assert list(fig.layout.xaxis.ticktext) == names["deeper"]


def test_divergence_curves_take_relative_depth_too():
    from analysis.probe.plots import divergence_curves

    names = depth_names()
    runs = {label: probe_layers(len(n)).assign(kl_to_final=np.linspace(2, 0, len(n)),
                                               agreement=np.linspace(0, 1, len(n))) for label, n in names.items()}
    fig = divergence_curves(runs, names, relative=True)
    for label, own in names.items():
        for t in named_traces(fig, label):
            assert list(t.x) == pytest.approx([i / (len(own) - 1) for i in range(len(own))])
    assert "relative depth" in fig.layout.xaxis.title.text


def test_hover_text_shows_quotes_as_quotes_and_markup_as_text():
    """Issue 24.12: Plotly decodes only &lt; &gt; &amp; (and numeric entities), so &quot; showed literally."""
    from analysis.atlas.plots import atlas_grid
    from analysis.core.figures import plain
    from analysis.probe.plots import token_heatmap

    assert plain('say "hi" & <b>bold</b>') == 'say "hi" &amp; &lt;b&gt;bold&lt;/b&gt;'
    tokens = pd.DataFrame({"text_id": 0, "layer": [0, 0, 1, 1], "position": [1, 2, 1, 2],
                           "input_token": ['"', "<b>"] * 2, "predicted_token": ['"', "x"] * 2,
                           "correct": [True, False] * 2, "prob": [0.5, 0.1, 0.6, 0.2], "rank": [1, 3, 1, 2],
                           "top_tokens": [['"', "<b>"]] * 4, "top_probs": [[0.5, 0.1]] * 4})
    fig = token_heatmap(tokens, ["embeddings", "layer 1 (last)"])
    hover = fig.data[0].text
    assert hover[0][0].startswith('input <b>"</b> · predicted <b>"</b>') and "&quot;" not in str(hover)
    assert hover[0][1].startswith("input <b>&lt;b&gt;</b>")  # the token <b> is shown, never rendered as bold
    assert "top: &quot;" not in hover[0][0] and 'top: " 0.50, &lt;b&gt; 0.10' in hover[0][0]
    assert list(fig.data[0].x) == ['1: "', "2: &lt;b&gt;"]
    coords = pd.DataFrame({"layer": 0, "example_id": range(4), "x": [0.0, 1, 2, 3], "y": [0.0, 1, 0, 1],
                           "label": ['"pos"', '"pos"', "neg", "neg"]})
    grid = atlas_grid(coords, {0: 'a "quoted" <i>text</i>'}, ["embeddings"])
    shown = str(grid.to_plotly_json())
    assert "&quot;" not in shown and 'a "quoted" &lt;i&gt;text&lt;/i&gt;' in shown
    assert '"pos"' in {t.name for t in grid.data}


def test_pca_panels_say_the_variance_each_axis_explains():
    from analysis.atlas.plots import atlas_grid

    coords = pd.DataFrame({"layer": [1] * 4 + [2] * 4, "example_id": list(range(4)) * 2, "x": 0.0, "y": 0.0,
                           "label": ["a", "b"] * 4})
    fig = atlas_grid(coords, {}, ["embeddings", "layer 1", "layer 2 (last)"],
                     explained={1: (0.234, 0.1), 2: None})
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == ("PC1 (23.4%)", "PC2 (10.0%)")
    assert fig.layout.xaxis2.title.text is None  # a constant layer: no variance to split
    assert atlas_grid(coords, {}, ["embeddings", "layer 1", "layer 2 (last)"]).layout.xaxis.title.text is None


def test_a_one_epoch_history_shows_every_point_side_by_side():
    """Issue 24.12: one epoch drew four points on one x (two pairs of nearly equal values hid each other)."""
    from analysis.training.plots import history_chart

    fig = history_chart([{"epoch": 1, "train_loss": 0.7, "val_loss": 0.7, "val_accuracy": 0.5, "val_macro_f1": 0.5}])
    assert all(t.mode == "markers" for t in fig.data)
    xs = [t.x[0] for t in fig.data]
    assert len(set(xs)) == 4 and all(abs(x - 1) < 0.5 for x in xs)  # side by side around epoch 1, not stacked
    low, high = fig.layout.xaxis.range
    assert low < min(xs) and max(xs) < high and high - low <= 2
    assert list(fig.layout.xaxis.tickvals) == [1]
    assert all(list(t.customdata) == [1] and "epoch %{customdata}" in t.hovertemplate for t in fig.data)  # not 0.82
    two = history_chart([{"epoch": e, "train_loss": 0.7, "val_loss": 0.6, "val_accuracy": 0.5, "val_macro_f1": 0.4}
                         for e in (1, 2)])
    assert all(list(t.x) == [1, 2] and t.mode == "lines+markers" for t in two.data)


def test_divergence_curves_place_the_attention_halves_half_a_layer_before_their_layer():
    """A lens of both halves (issue 36 item 5) gives KL and agreement at each attention half: those points sit at
    l - 0.5, as on the accuracy curve, not on top of the layer's output (which drew a vertical segment)."""
    from analysis.probe.plots import divergence_curves

    halves = pd.DataFrame({"layer": [0, 1, 1, 2, 2], "half": ["output", "attention", "output", "attention", "output"],
                           "kl_to_final": [2.0, 1.5, 1.2, 0.4, 0.0], "agreement": [0.1, 0.3, 0.4, 0.8, 1.0]})
    fig = divergence_curves({"m": halves})
    for t in fig.data:
        assert list(t.x) == [0, 0.5, 1, 1.5, 2]
