"""Plotly figures for the analyses. Plain functions of results: no streamlit, usable in notebooks."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def accuracy_curve(runs: dict[str, pd.DataFrame], layer_names: dict[str, list[str]] | None = None,
                   title: str = "Reconstruction accuracy by layer") -> go.Figure:
    """Token accuracy per layer (solid) and the sentence mean with its 95% CI (dashed, shaded) for each run.

    ``runs`` maps a label (e.g. a model name) to a ``layers`` table (:data:`LAYER_COLUMNS`).
    """
    fig = go.Figure()
    for i, (label, layers) in enumerate(runs.items()):
        colour = COLOURS[i % len(COLOURS)]
        x = layers["layer"].tolist()
        names = (layer_names or {}).get(label) or [str(v) for v in x]
        fig.add_trace(go.Scatter(
            x=x + x[::-1], y=layers["ci_high"].tolist() + layers["ci_low"].tolist()[::-1], fill="toself",
            fillcolor=_rgba(colour, 0.15), line={"width": 0}, hoverinfo="skip", showlegend=False,
            legendgroup=label))
        fig.add_trace(go.Scatter(
            x=x, y=layers["sentence_mean"], mode="lines", line={"color": colour, "dash": "dash"},
            name=f"{label}: sentence mean ± 95% CI", legendgroup=label, customdata=np.c_[names],
            hovertemplate="%{customdata[0]}: sentence mean %{y:.3f}<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=x, y=layers["accuracy"], mode="lines+markers", line={"color": colour}, name=f"{label}: token accuracy",
            legendgroup=label, customdata=np.c_[names, layers["correct"], layers["tokens"]],
            hovertemplate="%{customdata[0]}: %{y:.3f} (%{customdata[1]} of %{customdata[2]} tokens)<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="layer (0 = embeddings)", yaxis_title="accuracy",
                      yaxis={"range": [0, 1.02]}, xaxis={"dtick": 1}, hovermode="x unified",
                      legend={"orientation": "h", "y": -0.2}, margin={"t": 50, "b": 10})
    return fig


def token_heatmap(tokens: pd.DataFrame, layer_names: list[str], title: str = "") -> go.Figure:
    """Layer x token heat map for one text: colour = probability of the input token; hover = top-k.

    ``tokens`` holds the per-token rows of one text (columns of :data:`TOKEN_COLUMNS`).
    """
    positions = sorted(tokens["position"].unique())
    layers = sorted(tokens["layer"].unique())
    grid = tokens.pivot(index="layer", columns="position", values="prob").reindex(index=layers, columns=positions)
    first = tokens[tokens["layer"] == layers[0]].set_index("position").reindex(positions)
    labels = [f"{p}: {t}" for p, t in zip(positions, first["input_token"].astype(str), strict=True)]
    hover = tokens.assign(text=[
        f"input <b>{html.escape(str(r.input_token))}</b> · predicted <b>{html.escape(str(r.predicted_token))}</b>"
        f"<br>p(input) {r.prob:.3f} · rank {r.rank}<br>top: "
        + ", ".join(f"{html.escape(str(t))} {p:.2f}" for t, p in zip(r.top_tokens, r.top_probs, strict=True))
        for r in tokens.itertuples()
    ]).pivot(index="layer", columns="position", values="text").reindex(index=layers, columns=positions)
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy(), x=labels, y=[layer_names[i] for i in layers], text=hover.to_numpy(),
        hovertemplate="%{y}<br>%{text}<extra></extra>", colorscale="Viridis", zmin=0, zmax=1,
        colorbar={"title": "p(input token)"}))
    fig.update_layout(title=title, xaxis_title="token", yaxis_title="layer", margin={"t": 50, "b": 10},
                      yaxis={"autorange": True}, height=max(300, 40 * len(layers) + 150))
    return fig


def mismatch_html(tokens: pd.DataFrame, layer_names: list[str]) -> str:
    """An HTML table of one text's predicted tokens per layer, wrong ones highlighted (all text escaped)."""
    rows = []
    for layer, group in tokens.groupby("layer", sort=True):
        cells = []
        for r in group.sort_values("position").itertuples():
            token = html.escape(str(r.predicted_token))
            title = html.escape(f"input: {r.input_token}", quote=True)
            style = "" if r.correct else "background:#fdd;color:#a00;border-radius:3px;padding:0 2px"
            cells.append(f'<span title="{title}" style="{style}">{token}</span>')
        rows.append(f"<tr><td style='white-space:nowrap;padding-right:1em'>{html.escape(layer_names[layer])}</td>"
                    f"<td>{' '.join(cells)}</td></tr>")
    return "<table style='font-family:monospace;font-size:0.9em'>" + "".join(rows) + "</table>"
