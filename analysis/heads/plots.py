"""The attention-heads figures (Plotly, plain functions of the engine's results; no streamlit): one head's
token-to-token attention as a heat map (bertviz's head view as a matrix), all heads of a layer as small multiples
(its model view), two models' maps side by side with their difference, the layer x head heat map of any statistic
of heads.csv, the head map (clusters.csv), the relations' best heads against their baselines, importance and the
pruning curve.

Token axes are positions (``tickvals``) labelled with the tokens (``ticktext``): a sentence repeats tokens, and a
categorical axis would merge them. Layers are 1-based attention layers, heads 0-based, as in the CSV files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.core.figures import plain
from analysis.heads.stats import STATISTICS
from analysis.heads.view import HeadView

TITLES = {"entropy": "mean attention entropy (nats)", "uniform_entropy": "entropy of uniform attention (nats)",
          "cls": "share of attention to [CLS] (the start token)", "sep": "share of attention to [SEP] (the separator)",
          "punct": "share of attention to punctuation", "self": "share of attention to the token itself",
          "previous": "share of attention to the previous token", "next": "share of attention to the next token",
          "distance": "mean attention distance (tokens)"}
SHARES = {"cls", "sep", "punct", "self", "previous", "next"}


def _token_axis(tokens: list[str], axis: dict | None = None) -> dict:
    return {"tickvals": list(range(len(tokens))), "ticktext": [plain(t) for t in tokens], "tickangle": -60,
            "tickfont": {"size": 10 if len(tokens) <= 40 else 7}, **(axis or {})}


def _hover(tokens: list[str]) -> np.ndarray:
    """``(n, n, 2)`` customdata: the attending and the attended token of every cell."""
    t = np.asarray([plain(x) for x in tokens], dtype=object)
    return np.stack(np.broadcast_arrays(t[:, None], t[None, :]), -1)


def attention_heatmap(weights: np.ndarray, tokens: list[str], title: str, diverging: bool = False) -> go.Figure:
    """One ``(n, n)`` map: row = attending token (from), column = attended token (to). Weights on the fixed 0..1
    scale of :func:`layer_heads`' small multiples, so a head reads the same in both views."""
    n = len(tokens)
    scale = {"colorscale": "RdBu", "zmid": 0, "reversescale": True} if diverging else \
        {"colorscale": "Blues", "zmin": 0, "zmax": 1}
    fig = go.Figure(go.Heatmap(z=weights, x=list(range(n)), y=list(range(n)), customdata=_hover(tokens), **scale,
                               hovertemplate="%{customdata[0]} → %{customdata[1]}: %{z:.3f}<extra></extra>"))
    size = min(760, max(360, 22 * n + 160))
    fig.update_layout(title=title, height=size, margin={"t": 60, "b": 10},
                      xaxis=_token_axis(tokens, {"title": "attended token (to)", "side": "bottom"}),
                      yaxis=_token_axis(tokens, {"title": "attending token (from)", "autorange": "reversed",
                                                 "tickangle": 0}))
    return fig


def head_heatmap(view: HeadView, layer: int, head: int) -> go.Figure:
    """bertviz's head view as a matrix: head ``head`` of attention layer ``layer``."""
    return attention_heatmap(view.head(layer, head), view.tokens,
                             f"{plain(view.model)}: layer {layer}, head {head} (row: attending token)")


def layer_heads(view: HeadView, layer: int, columns: int = 4) -> go.Figure:
    """bertviz's model view for one layer: every head's map as a small multiple, one shared colour scale."""
    view.head(layer, 0)  # range check
    heads, n = view.heads, len(view.tokens)
    columns = min(columns, heads)
    rows = -(-heads // columns)
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=[f"head {h}" for h in range(heads)],
                        horizontal_spacing=0.03, vertical_spacing=0.06 if rows > 1 else 0.1)
    hover = _hover(view.tokens)
    for h in range(heads):
        fig.add_trace(go.Heatmap(z=view.attention[layer - 1, h], x=list(range(n)), y=list(range(n)),
                                 customdata=hover, coloraxis="coloraxis", name=f"head {h}",
                                 hovertemplate=f"head {h}: " + "%{customdata[0]} → %{customdata[1]}: %{z:.3f}"
                                 "<extra></extra>"), row=h // columns + 1, col=h % columns + 1)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    fig.update_layout(title=f"{plain(view.model)}: every head of layer {layer} (rows attend to columns)",
                      coloraxis={"colorscale": "Blues", "cmin": 0, "cmax": 1}, height=max(320, 230 * rows),
                      margin={"t": 70, "b": 10})
    return fig


def compared_heads(a: HeadView, b: HeadView, layer: int, head: int) -> go.Figure:
    """One head of two models on the same tokens, and their difference (second minus first)."""
    first, second = a.head(layer, head), b.head(layer, head)
    tokens, n = a.tokens, len(a.tokens)
    diff = second - first
    bound = float(max(np.abs(diff).max(), 1e-9))
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.06, subplot_titles=[
        plain(a.model)[:40], plain(b.model)[:40], "difference (second − first)"])
    hover = _hover(tokens)
    for col, (z, extra) in enumerate(((first, {"coloraxis": "coloraxis"}), (second, {"coloraxis": "coloraxis"}),
                                      (diff, {"coloraxis": "coloraxis2"})), start=1):
        fig.add_trace(go.Heatmap(z=z, x=list(range(n)), y=list(range(n)), customdata=hover, **extra,
                                 hovertemplate="%{customdata[0]} → %{customdata[1]}: %{z:.3f}<extra></extra>"),
                      row=1, col=col)
        fig.update_xaxes(_token_axis(tokens), row=1, col=col)
        fig.update_yaxes(_token_axis(tokens, {"autorange": "reversed", "tickangle": 0, "showticklabels": col == 1}),
                         row=1, col=col)
    fig.update_layout(title=f"Layer {layer}, head {head}: the same sentence through two models",
                      coloraxis={"colorscale": "Blues", "cmin": 0, "cmax": 1,
                                 "colorbar": {"x": 0.63, "len": 0.8, "title": "weight"}},
                      coloraxis2={"colorscale": "RdBu", "reversescale": True, "cmin": -bound, "cmax": bound,
                                  "colorbar": {"x": 1.0, "len": 0.8, "title": "Δ"}},
                      height=min(640, max(380, 14 * n + 200)), margin={"t": 70, "b": 10})
    return fig


def _grid(frame: pd.DataFrame, column: str) -> tuple[np.ndarray, list[int], list[int]]:
    layers, heads = sorted(frame["layer"].unique()), sorted(frame["head"].unique())
    z = frame.pivot(index="layer", columns="head", values=column).reindex(index=layers, columns=heads)
    return z.to_numpy(dtype=float), [int(x) for x in layers], [int(x) for x in heads]


def statistic_heatmap(heads: pd.DataFrame, statistic: str, title: str | None = None,
                      diverging: bool = False) -> go.Figure:
    """Layer x head heat map of one column of heads.csv (hover: its 95% interval when the table has it)."""
    if statistic not in heads.columns:
        raise ValueError(f"heads.csv has no column '{statistic}'")
    z, layers, head_ids = _grid(heads, statistic)
    low, high = f"{statistic}_low", f"{statistic}_high"
    if low in heads.columns and high in heads.columns:
        custom = np.stack([_grid(heads, low)[0], _grid(heads, high)[0]], -1)
        hover = "layer %{y}, head %{x}: %{z:.3f} [%{customdata[0]:.3f}, %{customdata[1]:.3f}]<extra></extra>"
    else:
        custom, hover = None, "layer %{y}, head %{x}: %{z:.3f}<extra></extra>"
    values = z[np.isfinite(z)]
    top = float(np.abs(values).max()) if values.size else 0.0
    if diverging:  # symmetric around 0; a map of zeros (a model against itself) on -1 .. 1, not on nano-ticks
        scale = {"colorscale": "RdBu", "zmin": -(top or 1.0), "zmax": top or 1.0, "reversescale": True}
    elif statistic in SHARES:
        scale = {"colorscale": "Viridis", "zmin": 0, "zmax": 1}
    elif values.size and values.min() == values.max():  # one value everywhere: a scale from 0 that includes it
        scale = {"colorscale": "Viridis", "zmin": min(float(values.min()), 0.0), "zmax": max(float(values.max()), 0.0)
                 or 1.0}
    else:
        scale = {"colorscale": "Viridis"}
    fig = go.Figure(go.Heatmap(z=z, x=head_ids, y=layers, customdata=custom, hovertemplate=hover, **scale))
    fig.update_layout(title=title or TITLES.get(statistic, statistic), height=max(260, 34 * len(layers) + 130),
                      xaxis={"title": "head", "dtick": 1}, yaxis={"title": "layer", "dtick": 1,
                                                                  "autorange": "reversed"},
                      margin={"t": 60, "b": 10})
    return fig


def head_map(clusters: pd.DataFrame) -> go.Figure:
    """The heads in 2-D (MDS of their mean Jensen-Shannon distances; clusters.csv), coloured by layer."""
    labels = [f"L{int(layer)}-H{int(head)}" for layer, head in zip(clusters["layer"], clusters["head"], strict=True)]
    fig = go.Figure(go.Scatter(
        x=clusters["x"], y=clusters["y"], mode="markers+text" if len(clusters) <= 64 else "markers", text=labels,
        textposition="top center", textfont={"size": 9},
        marker={"color": clusters["layer"], "colorscale": "Viridis", "size": 11, "showscale": True,
                "colorbar": {"title": "layer", "dtick": 1}, "line": {"width": 0.5, "color": "#333"}},
        hovertemplate="%{text}<br>x %{x:.3f}, y %{y:.3f}<extra></extra>"))
    fig.update_layout(title="Heads clustered by behaviour (MDS of the mean Jensen-Shannon distance between their "
                      "attention)", height=520, xaxis={"title": "MDS 1"},
                      yaxis={"title": "MDS 2", "scaleanchor": "x", "scaleratio": 1}, margin={"t": 60, "b": 10})
    return fig


def relations_figure(relations: pd.DataFrame, direction: str = "dependent_to_head") -> go.Figure:
    """Per relation (relations.csv, one direction): the best head's accuracy with its 95% Wilson interval, and
    the best fixed-offset baseline on the same words. Relations sorted by the best head's accuracy."""
    rows = relations[relations["direction"] == direction].sort_values("accuracy")
    names = [plain(r) for r in rows["relation"]]
    best = [f"L{int(layer)}-H{int(head)}" for layer, head in zip(rows["layer"], rows["head"], strict=True)]
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=rows["accuracy"], y=names, mode="markers", name="chosen head, held-out",
        marker={"size": 10, "color": "#1f77b4"},
        error_x={"type": "data", "symmetric": False, "array": rows["high"] - rows["accuracy"],
                 "arrayminus": rows["accuracy"] - rows["low"]},
        customdata=np.stack([best, rows["count"], rows["low"], rows["high"]], -1),
        hovertemplate="%{y}: %{customdata[0]} %{x:.3f} [%{customdata[2]:.3f}, %{customdata[3]:.3f}], "
        "%{customdata[1]} words<extra></extra>"))
    if "selection_accuracy" in rows:
        fig.add_trace(go.Scatter(
            x=rows["selection_accuracy"], y=names, mode="markers", name="chosen head on the selection split",
            marker={"size": 9, "color": "#1f77b4", "symbol": "circle-open"}, customdata=rows["selection_count"],
            hovertemplate="%{y}: %{x:.3f} on the %{customdata} selection words (where it was chosen)"
            "<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=rows["baseline_accuracy"], y=names, mode="markers", name="chosen fixed offset",
        marker={"symbol": "x", "size": 9, "color": "#d62728"}, customdata=rows["baseline_offset"],
        hovertemplate="%{y}: offset %{customdata:+d}: %{x:.3f}<extra></extra>"))
    arrow = "dependent → its head" if direction == "dependent_to_head" else "head → its dependent"
    fig.update_layout(title=f"Heads as parsers ({arrow}): the chosen head per relation vs the chosen fixed offset",
                      height=max(300, 24 * len(rows) + 140), xaxis={"title": "accuracy", "range": [0, 1.02]},
                      yaxis={"title": ""}, margin={"t": 60, "b": 10}, legend={"orientation": "h", "y": -0.12})
    return fig


def importance_heatmap(importance: pd.DataFrame, column: str = "normalized") -> go.Figure:
    """Layer x head heat map of importance.csv's ``normalized`` (or ``importance``) column."""
    titles = {"normalized": "Head importance E|dL(x)/dξ| (Michel Eq. 2), normalised per layer (l2)",
              "importance": "Head importance E|dL(x)/dξ| (Michel Eq. 2, raw)"}
    fig = statistic_heatmap(importance, column, titles.get(column, column))
    fig.update_traces(colorscale="Magma", reversescale=True, zmin=0, zmax=None)
    return fig


def pruning_curve(pruning: pd.DataFrame, metric: str = "accuracy") -> go.Figure:
    """pruning.csv: the score as heads are masked in increasing importance, against the random orders' mean and
    range (min to max over the seeds)."""
    fig = go.Figure()
    ordered = pruning[pruning["order"] == "importance"].sort_values("fraction")
    random = pruning[pruning["order"] == "random"].groupby("fraction")["accuracy"].agg(["mean", "min", "max"])
    if len(random):
        seeds = pruning.loc[pruning["order"] == "random", "seed"].nunique()
        fig.add_trace(go.Scatter(x=list(random.index) + list(random.index[::-1]),
                                 y=list(random["max"]) + list(random["min"][::-1]), fill="toself", mode="lines",
                                 line={"width": 0}, fillcolor="rgba(127,127,127,0.25)", hoverinfo="skip",
                                 name=f"random orders: range ({seeds} seeds)"))
        fig.add_trace(go.Scatter(x=random.index, y=random["mean"], mode="lines+markers", name="random orders: mean",
                                 line={"color": "#7f7f7f", "dash": "dash"},
                                 hovertemplate="%{x:.0%} masked: %{y:.3f}<extra>random mean</extra>"))
    fig.add_trace(go.Scatter(x=ordered["fraction"], y=ordered["accuracy"], mode="lines+markers",
                             name="least important first", line={"color": "#1f77b4"},
                             customdata=ordered["masked"],
                             hovertemplate="%{x:.0%} (%{customdata} heads) masked: %{y:.3f}<extra></extra>"))
    fig.update_layout(title="Pruning curve: least important heads first<br>vs random orders", height=420,
                      xaxis={"title": "share of heads masked", "tickformat": ".0%"}, yaxis={"title": metric},
                      margin={"t": 60, "b": 10}, legend={"orientation": "h", "y": -0.2})
    return fig


__all__ = ["STATISTICS", "attention_heatmap", "compared_heads", "head_heatmap", "head_map", "importance_heatmap",
           "layer_heads", "pruning_curve", "relations_figure", "statistic_heatmap"]
