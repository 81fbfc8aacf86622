"""The series' figures: a layer x checkpoint heat map of one metric (checkpoints in series order)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from analysis.core.figures import plain


def heatmap(series: pd.DataFrame, metric: str) -> go.Figure:
    """``metric``'s value at every layer (rows) and checkpoint (columns, in the order of ``series``)."""
    part = series[series["metric"] == metric]
    order = list(dict.fromkeys(part["checkpoint"]))
    grid = part.pivot_table(index="layer", columns="checkpoint", values="value", aggfunc="first")[order]
    labels = [plain(c) for c in order]
    fig = go.Figure(go.Heatmap(z=grid.to_numpy(), x=labels, y=grid.index.tolist(), colorscale="Viridis",
                               hovertemplate="layer %{y}, %{x}: %{z:.4f}<extra></extra>"))
    fig.update_layout(title=f"{plain(metric)} by layer and checkpoint", xaxis_title="checkpoint (in series order)",
                      yaxis_title="layer (0 = embeddings)", height=420, margin={"t": 60, "b": 10})
    fig.update_xaxes(type="category")
    fig.update_yaxes(dtick=1)
    return fig
