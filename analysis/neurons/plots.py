"""The neurons' figures: accuracy by layer with the top k, the bottom k and k random units ablated."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

STYLES = {"none": ("no ablation", "#444444", "solid"), "top": ("top k zeroed", "#d62728", "solid"),
          "bottom": ("bottom k zeroed", "#2ca02c", "dash"), "random": ("k random zeroed (mean of draws)", "#1f77b4",
                                                                       "dot")}


def ablation_curves(ablation: pd.DataFrame, column: str = "accuracy", title: str = "") -> go.Figure:
    """Accuracy (``column``) by layer for each kind of ablation, with 95% Wilson intervals (the random draws: their
    mean, with their range as the bar), and the majority-class baseline."""
    fig = go.Figure()
    low, high = ("ci_low", "ci_high") if column == "accuracy" else ("final_ci_low", "final_ci_high")
    for kind, (name, colour, dash) in STYLES.items():
        rows = ablation[ablation["ablated"] == kind]
        if rows.empty:
            continue
        if kind == "random":
            by = rows.groupby("layer")[column]
            mean = by.mean()
            fig.add_trace(go.Scatter(x=mean.index, y=mean.values, name=name, mode="lines+markers",
                                     line={"color": colour, "dash": dash},
                                     error_y={"type": "data", "symmetric": False, "array": (by.max() - mean).values,
                                              "arrayminus": (mean - by.min()).values}))
            continue
        fig.add_trace(go.Scatter(x=rows["layer"], y=rows[column], name=name, mode="lines+markers",
                                 line={"color": colour, "dash": dash},
                                 error_y={"type": "data", "symmetric": False, "array": rows[high] - rows[column],
                                          "arrayminus": rows[column] - rows[low]}))
    majority = ablation["majority"].iloc[0] if len(ablation) else None
    if majority is not None:
        fig.add_hline(y=majority, line={"color": "#999999", "dash": "dash"},
                      annotation_text="majority class", annotation_position="bottom right")
    fig.update_layout(title=title, xaxis_title="hidden state whose units are zeroed (0 = embeddings)",
                      yaxis_title="held-out accuracy", yaxis_range=[0, 1.02],
                      legend={"orientation": "h", "yanchor": "top", "y": -0.22}, height=470,
                      margin={"t": 60, "b": 130})
    fig.update_xaxes(dtick=1)
    return fig
