"""Fine-tuning's figures: the training history per epoch, and a pooling head's weight over the layers per example
and on average."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.core.figures import COLOURS, plain

HISTORY_SERIES = (("train_loss", "train loss (epoch mean)", "y"), ("val_loss", "validation loss", "y"),
                  ("val_accuracy", "validation accuracy", "y2"), ("val_macro_f1", "validation macro-F1", "y2"))


def history_chart(history: list[dict]) -> go.Figure:
    """Per-epoch training and validation loss (left axis, dashed) and validation accuracy / macro-F1 (right
    axis). After a single epoch there are no lines to draw: the four points are markers set side by side
    around the epoch (equal losses or scores would otherwise hide each other), on an axis one epoch wide."""
    epochs = [h["epoch"] for h in history]
    one = len(epochs) == 1
    fig = go.Figure()
    for n, (key, name, axis) in enumerate(HISTORY_SERIES):
        x = [e + (n - 1.5) * 0.12 for e in epochs] if one else epochs
        fig.add_trace(go.Scatter(x=x, y=[h[key] for h in history], name=name, yaxis=axis,
                                 mode="markers" if one else "lines+markers", customdata=epochs,
                                 hovertemplate=f"{name}, epoch %{{customdata}}: %{{y:.3f}}<extra></extra>",
                                 marker={"size": 10 if one else 6,
                                         "symbol": ["circle", "square", "diamond", "triangle-up"][n]},
                                 line={"color": COLOURS[n], "dash": "dash" if axis == "y" else None}))
    xaxis = ({"title": "epoch", "tickvals": epochs, "range": [epochs[0] - 0.5, epochs[0] + 0.5]} if one
             else {"title": "epoch", "dtick": 1})
    fig.update_layout(xaxis=xaxis, yaxis={"title": "loss"},
                      yaxis2={"title": "score", "overlaying": "y", "side": "right", "range": [0, 1.02],
                              "tickmode": "linear", "dtick": 0.2, "showgrid": False},
                      height=320, margin={"t": 30, "b": 10}, legend={"orientation": "h", "y": -0.25})
    return fig


def layer_weight_heatmap(weights: pd.DataFrame, labels: pd.Series, layer_names: list[str]) -> go.Figure:
    """Examples (rows, grouped by label: a tick per group, a line between groups) x layers: each example's
    learned layer weights. The colour scale is anchored at 0 and reaches max(2/L, the largest weight) for L
    pooled layers, so weights near the uniform 1/L sit mid-scale instead of spreading noise over every colour."""
    cols = [c for c in weights.columns if c.startswith("layer_")]
    order = np.argsort(labels.astype(str).to_numpy(), kind="stable")
    w, lab = weights[cols].to_numpy()[order], labels.astype(str).to_numpy()[order]
    shown = np.array([plain(v) for v in lab], dtype=object)
    ids = weights["example_id"].to_numpy()[order]
    top = max(2 / len(cols), float(w.max()) if w.size else 0.0)
    fig = go.Figure(go.Heatmap(z=w, x=[layer_names[int(c.split("_")[1])] for c in cols], y=list(range(len(w))),
                               colorscale="Viridis", zmin=0, zmax=top, colorbar={"title": "weight"},
                               customdata=np.c_[ids, shown][:, None, :].repeat(len(cols), 1),
                               hovertemplate="row %{customdata[0]} (%{customdata[1]}) · %{x}: %{z:.3f}"
                                             "<extra></extra>"))
    groups = list(dict.fromkeys(lab))
    starts = [int(np.argmax(lab == g)) for g in groups]
    ends = [start + int((lab == g).sum()) for start, g in zip(starts, groups, strict=True)]
    for end in ends[:-1]:
        fig.add_hline(y=end - 0.5, line={"color": "white", "width": 2})
    fig.update_layout(title=f"Layer weights per example (colour 0–{top:.2g}; uniform {1 / len(cols):.2g})",
                      yaxis={"title": "examples", "tickvals": [(s + e - 1) / 2 for s, e in zip(starts, ends,
                                                                                                 strict=True)],
                             "ticktext": [plain(g) for g in groups], "autorange": "reversed"}, height=460,
                      margin={"t": 50, "b": 10})
    return fig


def mean_weight_lines(frames: dict[str, pd.DataFrame], layer_names: list[str], title: str,
                      colours: dict[str, str] | None = None) -> go.Figure:
    """One line per key (a class, an epoch): the mean weight of each layer; ``colours`` by key (a class's
    colour from :func:`label_colours`)."""
    fig = go.Figure()
    for key, frame in frames.items():
        cols = [c for c in frame.columns if c.startswith("layer_")]
        fig.add_trace(go.Scatter(x=[layer_names[int(c.split("_")[1])] for c in cols], y=frame[cols].mean(),
                                 mode="lines+markers", name=plain(key),
                                 line={"color": (colours or {}).get(str(key))}))
    fig.update_layout(title=title, yaxis={"title": "mean weight", "rangemode": "tozero"}, height=360,
                      margin={"t": 50, "b": 10})
    return fig


def confusion_matrix(matrix: list[list[int]], names: list[str]) -> go.Figure:
    """A run's confusion matrix (rows: the true class, columns: the predicted one), each cell's count written in it."""
    fig = go.Figure(go.Heatmap(z=matrix, x=names, y=names, colorscale="Blues", zmin=0, texttemplate="%{z}",
                               hovertemplate="true %{y} · predicted %{x}: %{z}<extra></extra>"))
    fig.update_layout(title="Confusion matrix", xaxis_title="predicted", yaxis_title="true",
                      yaxis={"autorange": "reversed"}, height=300, margin={"t": 40, "b": 10})
    return fig


def runs_compared(table: pd.DataFrame) -> go.Figure:
    """Finished runs side by side: accuracy (with its 95% Wilson interval where the run recorded one: ``accuracy
    low``/``accuracy high``; a k-fold run's mean has none), the majority-class baseline and macro-F1 per run
    (``job``, ``head`` and those columns of the jobs page's comparison table)."""
    x = [f"#{r.job} {r.head}" for r in table.itertuples()]

    def error(metric):
        if metric != "accuracy" or "accuracy low" not in table:
            return None
        low, high = (pd.to_numeric(table[c], errors="coerce") for c in ("accuracy low", "accuracy high"))
        return {"type": "data", "symmetric": False, "array": (high - table["accuracy"]).tolist(),
                "arrayminus": (table["accuracy"] - low).tolist(), "visible": True}

    fig = go.Figure([go.Bar(name=m + (" (95% interval)" if m == "accuracy" else ""), x=x, y=table[m],
                            error_y=error(m)) for m in ("accuracy", "majority class", "macro_f1")])
    fig.update_layout(barmode="group", yaxis={"range": [0, 1]}, height=320, margin={"t": 30})
    return fig
