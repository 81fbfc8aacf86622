"""The classifier lens's figures: accuracy and agreement by layer with their intervals and the majority baseline,
the KL to the final distribution, the decision-layer histogram and one example's class probabilities by layer.
Each takes runs by name, so two classifiers (e.g. a cls job and an attention-pooling job) share one figure."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from analysis.core.figures import COLOURS, plain, rgba


def _band(fig, x, low, high, colour, name):
    fig.add_trace(go.Scatter(x=list(x) + list(x)[::-1], y=list(high) + list(low)[::-1], fill="toself", mode="lines",
                             fillcolor=rgba(colour, 0.15), line={"width": 0}, hoverinfo="skip", showlegend=False,
                             legendgroup=name))


def accuracy_curves(runs: dict[str, pd.DataFrame]) -> go.Figure:
    """Per run (``layers.csv`` by name): accuracy (solid) and agreement with the final prediction (dotted) by layer,
    95% Wilson bands, and the majority baseline (grey dashes)."""
    fig = go.Figure()
    for i, (name, layers) in enumerate(runs.items()):
        colour, label = COLOURS[i % len(COLOURS)], plain(name)
        if "accuracy" in layers:
            _band(fig, layers["layer"], layers["accuracy_low"], layers["accuracy_high"], colour, label)
            fig.add_trace(go.Scatter(x=layers["layer"], y=layers["accuracy"], name=f"{label}: accuracy",
                                     mode="lines+markers", line={"color": colour}, legendgroup=label))
            fig.add_trace(go.Scatter(x=layers["layer"], y=layers["majority_baseline"], name=f"{label}: majority "
                                     "baseline", mode="lines", line={"color": "#999999", "dash": "dash"},
                                     legendgroup=label))
        fig.add_trace(go.Scatter(x=layers["layer"], y=layers["agreement"], name=f"{label}: agreement with the final "
                                 "prediction", mode="lines+markers", line={"color": colour, "dash": "dot"},
                                 legendgroup=label))
    fig.update_layout(title="Each layer read through the classifier's own head", yaxis_range=[0, 1.02],
                      xaxis_title="layer (0 = embeddings)", yaxis_title="share of examples", height=470,
                      legend={"orientation": "h", "yanchor": "top", "y": -0.22}, margin={"t": 60, "b": 130})
    fig.update_xaxes(dtick=1)
    return fig


def kl_curves(runs: dict[str, pd.DataFrame]) -> go.Figure:
    """Per run: the mean KL divergence of each layer's class distribution from the final one (nats)."""
    fig = go.Figure()
    for i, (name, layers) in enumerate(runs.items()):
        fig.add_trace(go.Scatter(x=layers["layer"], y=layers["kl_to_final"], name=plain(name), mode="lines+markers",
                                 line={"color": COLOURS[i % len(COLOURS)]}))
    fig.update_layout(title="KL(final || layer), mean over examples", xaxis_title="layer (0 = embeddings)",
                      yaxis_title="nats", height=380, margin={"t": 60, "b": 60})
    fig.update_xaxes(dtick=1)
    return fig


def decision_histogram(runs: dict[str, pd.DataFrame], num_layers: int) -> go.Figure:
    """Per run (``examples.csv`` by name): how many examples are decided at each layer (the first layer from which
    the prediction is the final one and stays so)."""
    fig = go.Figure()
    for i, (name, examples) in enumerate(runs.items()):
        counts = examples["decision_layer"].value_counts().reindex(range(num_layers + 1), fill_value=0)
        fig.add_trace(go.Bar(x=counts.index, y=counts.values, name=plain(name), marker_color=COLOURS[i % len(COLOURS)]))
    fig.update_layout(title="Decision layer of each example", barmode="group", height=380, margin={"t": 60, "b": 60},
                      xaxis_title="decision layer (the prediction is final from here on)",
                      yaxis_title="examples")
    fig.update_xaxes(dtick=1)
    return fig


def probability_columns(examples: pd.DataFrame) -> dict[int, list[str]]:
    """layer -> its ``p_l<layer>_<class>`` columns, in class order."""
    out: dict[int, list[str]] = {}
    for column in examples.columns:
        if column.startswith("p_l"):
            layer = int(column[3:].split("_", 1)[0])
            out.setdefault(layer, []).append(column)
    return dict(sorted(out.items()))


def example_figure(examples: pd.DataFrame, position: int, classes: list[str]) -> go.Figure:
    """One example's probability of each class at each layer; the title names its label, prediction and decision
    layer."""
    row = examples.iloc[position]
    columns = probability_columns(examples)
    fig = go.Figure()
    for c, name in enumerate(classes):
        fig.add_trace(go.Scatter(x=list(columns), y=[row[cols[c]] for cols in columns.values()], name=plain(name),
                                 mode="lines+markers"))
    fig.add_vline(x=int(row["decision_layer"]), line={"color": "#999999", "dash": "dash"},
                  annotation_text="decision layer")
    said = (f"label {plain(row['label'])}, " if "label" in row else "") + f"predicted {plain(row['prediction'])}"
    fig.update_layout(title=f"Row {int(row['row'])} ({said}, decided at layer {int(row['decision_layer'])})",
                      yaxis_range=[0, 1.02], xaxis_title="layer (0 = embeddings)", yaxis_title="probability",
                      height=380, margin={"t": 60, "b": 60})
    fig.update_xaxes(dtick=1)
    return fig
