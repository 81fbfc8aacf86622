"""The layer atlas' figures: every layer's 2-D sentence map coloured by class, prediction or correctness (Song et
al. 2020 Fig. 2), and the separability curve per layer (Sun et al. 2019 Tab. 3)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.core.figures import COLOURS, DEPTH_TITLES, WEBGL_ABOVE, depth, label_colours, plain, rgba, run_layer_names

CORRECT_NAMES = {True: "right", False: "wrong"}


LEGEND_TITLES = {"label": "class", "prediction": "predicted class", "correct": "prediction correct"}


def atlas_grid(coords: pd.DataFrame, texts: dict[int, str], layer_names: list[str], title: str = "",
               columns: int = 3, colour_by: str = "label",
               explained: dict[int, tuple[float, float] | None] | None = None) -> go.Figure:
    """Small multiples: one 2-D scatter per layer of ``coords`` (layer, example_id, x, y, label), coloured by
    label with shared colours; hover shows the example id, label and text (``texts[example_id]``). Panels are
    titled with ``layer_names`` (the names of the model the coordinates come from). ``explained``: per layer,
    the share of the variance on each PCA axis (``AtlasResult.info["explained_variance"]``), written on the
    panel's axes as ``PC1 (23.4%)``; None for a layer with no variance (a constant one) or a method without."""
    from plotly.subplots import make_subplots

    layers = list(dict.fromkeys(coords["layer"]))
    rows = -(-len(layers) // columns)
    fig = make_subplots(rows=rows, cols=min(columns, len(layers)), horizontal_spacing=0.04, vertical_spacing=0.08,
                        subplot_titles=[layer_names[i] for i in layers])
    colours = (label_colours(coords[colour_by]) if colour_by != "correct" else
               {"right": "#2ca02c", "wrong": "#d62728"})
    webgl = coords["layer"].eq(layers[0]).sum() > WEBGL_ABOVE
    scatter = go.Scattergl if webgl else go.Scatter
    for n, layer in enumerate(layers):
        part = coords[coords["layer"] == layer]
        for label, group in part.groupby(part[colour_by].map(CORRECT_NAMES.get if colour_by == "correct" else str),
                                         sort=True):
            hover = [plain(texts.get(i, "")[:120]) for i in group["example_id"]]
            template = f"<b>{plain(label)}</b> · row %{{customdata[0]}}<br>%{{customdata[1]}}<extra></extra>"
            fig.add_trace(scatter(
                x=group["x"], y=group["y"], mode="markers", name=plain(label), legendgroup=label, showlegend=n == 0,
                marker={"color": colours[label], "size": 5 if webgl else 6, "opacity": 0.75},
                customdata=np.c_[group["example_id"], hover], hovertemplate=template),
                row=n // columns + 1, col=n % columns + 1)
        if ratio := (explained or {}).get(layer):
            where = {"row": n // columns + 1, "col": n % columns + 1}
            fig.update_xaxes(title={"text": f"PC1 ({100 * ratio[0]:.1f}%)", "font": {"size": 11}, "standoff": 2},
                             **where)
            fig.update_yaxes(title={"text": f"PC2 ({100 * ratio[1]:.1f}%)", "font": {"size": 11}, "standoff": 2},
                             **where)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False)
    fig.update_layout(title=title, height=300 * rows + 80, margin={"t": 80, "b": 10, "l": 10, "r": 10},
                      legend={"itemsizing": "constant", "title": {"text": LEGEND_TITLES[colour_by]}})
    return fig


def separability_curve(runs: dict[str, pd.DataFrame], layer_names: dict[str, list[str]] | None = None,
                       relative: bool = False) -> go.Figure:
    """Linear-probe accuracy (mean over folds; shaded: the 95% Wilson interval of the pooled out-of-fold
    accuracy, inside [0, 1]) with the majority-class baseline (dotted), and silhouette per layer, one colour
    per run. Hover: the layer's name (``layer_names[run]``: each run's own model's), std over folds and
    macro-F1. Each run sits at its own layer indices, or with ``relative`` at ``layer / L`` (:func:`depth`)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.6, 0.4],
                        subplot_titles=["probe accuracy (band: 95% Wilson; dotted: majority class)",
                                        "silhouette (euclidean)"])
    for i, (label, sep) in enumerate(runs.items()):
        colour = COLOURS[i % len(COLOURS)]
        names = run_layer_names(layer_names, label, sep["layer"])
        x = depth(sep["layer"], len(names), relative)
        names = [names[v] for v in sep["layer"]]
        low, high = sep["probe_ci_low"], sep["probe_ci_high"]
        fig.add_trace(go.Scatter(x=x + x[::-1], y=high.tolist() + low.tolist()[::-1], fill="toself", mode="lines",
                                 fillcolor=rgba(colour, 0.15), line={"width": 0}, hoverinfo="skip",
                                 showlegend=False, legendgroup=label), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=sep["probe_accuracy"], mode="lines+markers", name=plain(label),
                                 legendgroup=label,
                                 line={"color": colour}, customdata=np.c_[names, sep["probe_accuracy_std"],
                                                                          sep["probe_macro_f1"], low, high],
                                 hovertemplate="%{customdata[0]}: accuracy %{y:.3f} (std over folds "
                                               "%{customdata[1]:.3f}; 95% interval %{customdata[3]:.3f}–"
                                               "%{customdata[4]:.3f}), macro-F1 %{customdata[2]:.3f}"
                                               "<extra>" + plain(label) + "</extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=sep["majority_baseline"], mode="lines", legendgroup=label, showlegend=False,
                                 line={"color": colour, "dash": "dot", "width": 1},
                                 hovertemplate="majority class: %{y:.3f}<extra>" + plain(label) + "</extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=sep["silhouette"], mode="lines+markers", name=plain(label), legendgroup=label,
                                 showlegend=False, line={"color": colour}, customdata=np.c_[names],
                                 hovertemplate="%{customdata[0]}: silhouette %{y:.3f}<extra>" + plain(label)
                                               + "</extra>"), row=2, col=1)
    fig.update_xaxes(**({"range": [-0.03, 1.03]} if relative else {"dtick": 1}))
    fig.update_yaxes(range=[0, 1.02], row=1, col=1)
    values = [v for sep in runs.values() for v in sep["silhouette"] if np.isfinite(v)]
    low, high = min([-0.1, *values]), max([0.1, *values])  # silhouette is in [-1, 1]: never zoom into noise
    fig.update_yaxes(range=[low - 0.02, high + 0.02], row=2, col=1)
    fig.update_xaxes(title_text=DEPTH_TITLES[relative], row=2, col=1)
    fig.update_layout(title="Separability by layer", height=480, legend={"orientation": "h", "y": -0.15},
                      margin={"t": 60, "b": 10})
    return fig
