"""The series' figures: a layer x checkpoint heat map of one metric (checkpoints in series order)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from analysis.core.figures import plain


def heatmap(series: pd.DataFrame, metric: str, analysis: str = "") -> go.Figure:
    """``metric``'s value at every layer (rows) and checkpoint (columns, in the order of ``series``) of
    ``analysis`` (named in the title). The colours span the values' own range, said under the map."""
    part = series[series["metric"] == metric]
    order = list(dict.fromkeys(part["checkpoint"]))
    grid = part.pivot_table(index="layer", columns="checkpoint", values="value", aggfunc="first")[order]
    labels = [plain(c) for c in order]
    values = grid.to_numpy(dtype=float)
    fig = go.Figure(go.Heatmap(z=values, x=labels, y=grid.index.tolist(), colorscale="Viridis",
                               colorbar={"title": {"text": plain(metric)}},
                               hovertemplate="layer %{y}, %{x}: %{z:.4f}<extra></extra>"))
    span = (f"colours from {pd.Series(values.ravel()).min():.4g} to {pd.Series(values.ravel()).max():.4g}"
            if pd.notna(values).any() else "no defined value")
    what = f"{plain(analysis)}: " if analysis else ""
    fig.update_layout(title=f"{what}{plain(metric)} by layer and checkpoint ({span})",
                      xaxis_title="checkpoint (in series order)", yaxis_title="layer (0 = embeddings)", height=440,
                      margin={"t": 60, "b": 70})
    fig.update_xaxes(type="category")
    fig.update_yaxes(dtick=1)
    return fig
