"""Plotly figures of a comparison of checkpoints (:mod:`analysis.compare`; the page Compare checkpoints): the paired
CKA curve, paired accuracy curves with the probe's majority-class baseline, per-epoch curves and the shared map of
one pair. Plain functions of results: no streamlit."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from analysis.core.figures import COLOURS, plain, rgba, visible


def pair_labels(part: pd.DataFrame, layer_names: list[str], layer_names_b: list[str] | None = None) -> list[str]:
    """The x labels of a comparison's rows: A's layer name, or ``A's ↔ B's`` where the rows have a ``layer_b``
    (models of different depth, each with its own layer names)."""
    names_a = _layer_labels(part["layer"], layer_names)
    if "layer_b" not in part.columns:
        return names_a
    return [f"{a} ↔ {b}" for a, b in zip(names_a, _layer_labels(part["layer_b"], layer_names_b or []), strict=True)]


def paired_cka_curve(summary: pd.DataFrame, layer_names: list[str], layer_names_b: list[str] | None = None,
                     ) -> go.Figure:
    """Per layer, CKA(A's layer l, B's layer l) with its jackknife interval, one line per compared model, on a
    fixed 0-1 axis (CKA's range: no zooming into noise). Models of different depth: each point at its pair of
    layers (:func:`pair_labels`)."""
    fig = go.Figure()
    for i, (name, part) in enumerate(summary.groupby("model_b", sort=False)):
        colour = COLOURS[i % len(COLOURS)]
        names = pair_labels(part, layer_names, layer_names_b)
        fig.add_trace(go.Scatter(x=names + names[::-1], y=list(part["cka_ci_high"]) + list(part["cka_ci_low"])[::-1],
                                 fill="toself", fillcolor=rgba(colour, 0.15), line={"width": 0}, hoverinfo="skip",
                                 mode="lines", showlegend=False))
        fig.add_trace(go.Scatter(x=names, y=part["cka"], name=visible(name), mode="lines+markers",
                                 line={"color": colour}, hovertemplate="%{x}: CKA %{y:.4f}<extra></extra>"))
    fig.update_layout(title="CKA of the paired layers of both models (95% jackknife interval)", height=380,
                      yaxis={"range": [0, 1.02], "title": "linear CKA"}, margin={"t": 60, "b": 10},
                      legend={"orientation": "h", "y": -0.2})
    return fig


def aligned_map(coords: pd.DataFrame, names: tuple[str, str], texts: dict[int, str], lines: list[int]) -> go.Figure:
    """One layer's shared 2-D map of one pair: A's points and B's (the pair's rows split by position, A's first:
    :func:`analysis.compare.run.pair_coords`; never by name, which a model compared with itself shares), with a
    line from A to B for the examples in ``lines``."""
    from analysis.compare.run import pair_coords

    fig = go.Figure()
    a, b = pair_coords(coords)
    for i, (side, name, part) in enumerate((("A", names[0], a), ("B", names[1], b))):
        fig.add_trace(go.Scattergl(x=part["x"], y=part["y"], mode="markers", name=f"{side}: {visible(name)}",
                                   marker={"size": 6, "color": COLOURS[i], "opacity": 0.7},
                                   text=[plain(texts.get(int(j), "")) for j in part["example_id"]],
                                   hovertemplate="%{text}<extra></extra>"))
    position = {int(j): k for k, j in enumerate(a["example_id"])}
    xs, ys = [], []
    for j in lines:
        k = position[int(j)]
        xs += [a["x"].iat[k], b["x"].iat[k], None]
        ys += [a["y"].iat[k], b["y"].iat[k], None]
    if lines:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": "#888", "width": 1}, hoverinfo="skip",
                                 name="moved most (A to B)"))
    fig.update_layout(height=520, margin={"t": 30, "b": 10}, legend={"orientation": "h", "y": -0.1},
                      xaxis={"title": "PC 1 of A's vectors and B's rotated onto A's"}, yaxis={"title": "PC 2"})
    return fig


def _layer_labels(layers, layer_names: list[str]) -> list[str]:
    return [layer_names[int(v)] if int(v) < len(layer_names) else str(int(v)) for v in layers]


def epoch_colours(n: int) -> list[str]:
    """``n`` colours along Viridis, first epoch dark to last epoch light-green (an order, not categories)."""
    from plotly.colors import sample_colorscale

    return sample_colorscale("Viridis", [0.85 * i / max(n - 1, 1) for i in range(n)])


def paired_accuracy_curves(summary: pd.DataFrame, prefix: str, layer_names: list[str], title: str,
                           colours: list[str] | None = None, layer_names_b: list[str] | None = None) -> go.Figure:
    """Per layer, A's accuracy (``{prefix}_accuracy_a``, black, its interval ``{prefix}_ci_low_a``/``_high_a``
    shaded) and each compared model's (``..._b``, one line per ``model_b``), on a fixed 0-1 axis. Rows where a
    side is blank are left out of that side's line. With a ``{prefix}_majority_baseline`` column: the accuracy of
    always predicting the most frequent class (:func:`analysis.core.scores.majority_baseline`), dotted, what the
    probe is to be read against. Models of different depth: each point at its pair of layers (:func:`pair_labels`)."""
    fig = go.Figure()
    groups = list(summary.groupby("model_b", sort=False))
    colours = colours or [COLOURS[i % len(COLOURS)] for i in range(len(groups))]

    def add(part, side, name, colour, dash=None):
        part = part[part[f"{prefix}_accuracy_{side}"].notna()]
        if part.empty:
            return
        x = pair_labels(part, layer_names, layer_names_b)
        fig.add_trace(go.Scatter(x=x + x[::-1], y=list(part[f"{prefix}_ci_high_{side}"])
                                 + list(part[f"{prefix}_ci_low_{side}"])[::-1], fill="toself", mode="lines",
                                 fillcolor=rgba(colour, 0.12) if colour.startswith("#") else colour.replace(
                                     "rgb", "rgba").replace(")", ", 0.12)"), line={"width": 0},
                                 hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(x=x, y=part[f"{prefix}_accuracy_{side}"], mode="lines+markers", name=visible(name),
                                 line={"color": colour, "dash": dash},
                                 hovertemplate="%{x}: %{y:.4f}<extra>" + plain(name) + "</extra>"))

    if groups:
        first = groups[0][1]
        add(first, "a", f"A: {first['model_a'].iloc[0]}", "#222222", "dash")
    for (name, part), colour in zip(groups, colours, strict=False):
        add(part, "b", name, colour)
    if groups and f"{prefix}_majority_baseline" in summary.columns:
        first = groups[0][1]
        fig.add_trace(go.Scatter(x=pair_labels(first, layer_names, layer_names_b),
                                 y=first[f"{prefix}_majority_baseline"], mode="lines", name="majority class",
                                 line={"color": "#888888", "dash": "dot", "width": 1},
                                 hovertemplate="always the most frequent class: %{y:.4f}<extra></extra>"))
    fig.update_layout(title=title, height=380, yaxis={"range": [0, 1.02], "title": "accuracy (95% Wilson)"},
                      margin={"t": 60, "b": 10}, legend={"orientation": "h", "y": -0.2})
    return fig


def epoch_curves(summary: pd.DataFrame, column: str, layer_names: list[str], title: str, y_title: str,
                 band: tuple[str, str] | None = None) -> go.Figure:
    """One line per epoch (``epoch`` column) of ``column`` per layer, coloured from the first epoch to the last;
    ``band``: the columns of its interval, shaded. A fixed 0-1 axis."""
    fig = go.Figure()
    epochs = sorted(summary["epoch"].unique())
    for epoch, colour in zip(epochs, epoch_colours(len(epochs)), strict=True):
        part = summary[summary["epoch"] == epoch]
        x = _layer_labels(part["layer"], layer_names)
        if band is not None:
            fig.add_trace(go.Scatter(x=x + x[::-1], y=list(part[band[1]]) + list(part[band[0]])[::-1],
                                     fill="toself", fillcolor=colour.replace("rgb", "rgba").replace(")", ", 0.1)"),
                                     line={"width": 0}, hoverinfo="skip", mode="lines", showlegend=False))
        fig.add_trace(go.Scatter(x=x, y=part[column], mode="lines+markers", name=f"epoch {epoch}",
                                 line={"color": colour},
                                 hovertemplate=f"epoch {epoch}, " + "%{x}: %{y:.4f}<extra></extra>"))
    fig.update_layout(title=title, height=380, yaxis={"range": [0, 1.02], "title": y_title},
                      margin={"t": 60, "b": 10}, legend={"orientation": "h", "y": -0.2})
    return fig


def duplication_sweep(table: pd.DataFrame) -> go.Figure:
    """Final-layer reconstruction accuracy against how many of the first layers are duplicated
    (:func:`analysis.tasks.duplication.sweep`'s table: ``duplicated``, ``final_layer_accuracy``)."""
    fig = go.Figure(go.Scatter(x=table["duplicated"], y=table["final_layer_accuracy"], mode="lines+markers"))
    fig.update_layout(title="Final-layer reconstruction accuracy vs duplicated layers", height=360,
                      xaxis={"title": "duplicated layers k", "dtick": 1}, yaxis={"title": "accuracy", "range": [0, 1]})
    return fig
