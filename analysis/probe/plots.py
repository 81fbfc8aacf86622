"""The reconstruction probe's figures: the accuracy curve per layer (with its baselines), the divergence
curves, and the per-token heatmap and mismatch view (Kao et al. 2020, Fig. 2)."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.core.figures import COLOURS, DEPTH_TITLES, depth, plain, rgba, run_layer_names


def on_layer_axis(layers: pd.DataFrame) -> pd.DataFrame:
    """``layers`` with ``x``, where its rows sit on the layer axis: a layer's output at the layer, its attention half
    (a ``half`` column, issue 36) half a layer before it, between the layer's input and its output."""
    half = layers["half"] == "attention" if "half" in layers else False
    return layers.assign(x=layers["layer"] - 0.5 * half)


def accuracy_curve(runs: dict[str, pd.DataFrame], layer_names: dict[str, list[str]] | None = None,
                   title: str = "Reconstruction accuracy by layer",
                   positions: dict[str, list[float]] | None = None, relative: bool = False) -> go.Figure:
    """Token accuracy per layer (solid) and the sentence mean with its 95% percentile-bootstrap interval over
    sentences (dashed, shaded) for each run.

    ``runs`` maps a label (e.g. a model name) to a ``layers`` table (:data:`LAYER_COLUMNS`) and ``layer_names``
    to its own model's layer names (the hover's). Each run sits at its own layer indices, or with ``relative``
    at ``layer / L`` (:func:`depth`). ``positions`` optionally places a run's layers on another run's axis (a
    duplicated model's original layers at their last copy, :func:`analysis.duplication.plan.aligned_positions`);
    only then, or when every run has the same layers, do the ticks carry layer names.
    """
    fig = go.Figure()
    runs = {label: on_layer_axis(layers) for label, layers in runs.items()}
    placed = {label for label in runs if (positions or {}).get(label)}
    axis_names = {tuple(run_layer_names(layer_names, label, layers["layer"])) for label, layers in runs.items()
                  if label not in placed}
    for i, (label, every) in enumerate(runs.items()):
        colour = COLOURS[i % len(COLOURS)]
        halves = (every["x"] % 1 != 0).to_numpy()  # attention halves (issue 36): own markers and legend entry
        layers = every[~halves]
        every_name = np.asarray(run_layer_names(layer_names, label, every["layer"]), dtype=object)  # one per row
        names = list(every_name[~halves])
        if label in placed:  # on the axis of the run that is not placed
            x = depth(positions[label], len(next(iter(axis_names), names)), relative)
        else:
            x = depth(layers["x"], int(every["layer"].max()) + 1, relative)
        if halves.any():
            half = every[halves]
            fig.add_trace(go.Scatter(
                x=depth(half["x"], int(every["layer"].max()) + 1, relative), y=half["accuracy"], mode="markers",
                marker={"color": colour, "symbol": "diamond-open", "size": 10, "line": {"width": 2}},
                name=f"{plain(label)}: attention half (token accuracy)", legendgroup=label,
                customdata=np.c_[[n if "half" in n else f"{n} attention half" for n in every_name[halves]],
                                 half["correct"], half["tokens"]],
                hovertemplate="%{customdata[0]}: %{y:.3f} (%{customdata[1]} of %{customdata[2]} tokens)"
                              "<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=x + x[::-1], y=layers["ci_high"].tolist() + layers["ci_low"].tolist()[::-1], fill="toself", mode="lines",
            fillcolor=rgba(colour, 0.15), line={"width": 0}, hoverinfo="skip", showlegend=False,
            legendgroup=label))
        fig.add_trace(go.Scatter(
            x=x, y=layers["sentence_mean"], mode="lines", line={"color": colour, "dash": "dash"},
            name=f"{plain(label)}: sentence mean, 95% bootstrap CI", legendgroup=label, customdata=np.c_[names],
            hovertemplate="%{customdata[0]}: sentence mean %{y:.3f}<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=x, y=layers["accuracy"], mode="lines+markers", line={"color": colour},
            name=f"{plain(label)}: token accuracy",
            legendgroup=label, customdata=np.c_[names, layers["correct"], layers["tokens"]],
            hovertemplate="%{customdata[0]}: %{y:.3f} (%{customdata[1]} of %{customdata[2]} tokens)<extra></extra>"))
    shared = list(next(iter(axis_names))) if len(axis_names) == 1 else []
    if relative:
        axis = {"range": [-0.03, 1.03]}
    elif any("←" in n for n in shared) and not any("half" in r for r in runs.values()):
        # one duplicated model's axis: ticks say "new ← source", as the title says
        axis = {"tickvals": list(range(len(shared))), "ticktext": shared}
    else:  # models of different depth: each at its own indices, its own names in the hover
        axis = {"dtick": 1}
    fig.update_layout(title=title, xaxis_title=DEPTH_TITLES[relative], yaxis_title="accuracy",
                      yaxis={"range": [0, 1.02]}, xaxis=axis, hovermode="x unified",
                      legend={"orientation": "h", "y": -0.2}, margin={"t": 50, "b": 10})
    return fig


def divergence_curves(runs: dict[str, pd.DataFrame], layer_names: dict[str, list[str]] | None = None,
                      relative: bool = False) -> go.Figure:
    """Per layer, KL to the final layer's distribution (nats, left) and top-1 agreement with the final layer
    (right, 0..1) for each run that has them (``kl_to_final``, ``agreement``: the raw head and a tuned lens),
    each at its own layer indices or, with ``relative``, at ``layer / L``."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("KL to the final layer (nats; 0 = reads as the final layer)",
                                                        "top-1 agreement with the final layer"))
    for i, (label, layers) in enumerate(runs.items()):
        if "kl_to_final" not in layers:
            continue
        colour = COLOURS[i % len(COLOURS)]
        layers = on_layer_axis(layers)  # a lens of both halves: each attention half at l - 0.5
        states = int(layers["layer"].max()) + 1
        own = run_layer_names(layer_names, label, range(states))
        names = np.c_[[own[int(layer)] + (" attention half" if x % 1 else "")
                       for layer, x in zip(layers["layer"], layers["x"], strict=True)]]
        x = depth(layers["x"], states, relative)
        for col, column in ((1, "kl_to_final"), (2, "agreement")):
            fig.add_trace(go.Scatter(x=x, y=layers[column], mode="lines+markers", name=plain(label),
                                     line={"color": colour}, legendgroup=label, showlegend=col == 1,
                                     customdata=names, hovertemplate=f"%{{customdata[0]}}: {column.replace('_', ' ')} "
                                     "%{y:.3f}<extra>" + plain(label) + "</extra>"), row=1, col=col)
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    fig.update_xaxes(title=DEPTH_TITLES[relative], **({} if relative else {"dtick": 1}))
    fig.update_layout(height=340, legend={"orientation": "h", "y": -0.25}, margin={"t": 40, "b": 10})
    return fig


def by_state(tokens: pd.DataFrame) -> pd.DataFrame:
    """Per-token rows whose ``layer`` is the index of the state read (into the result's ``layer_names``): with a
    ``half`` column (the attention halves read) layer ``l``'s attention half is state ``2l - 1``, its output
    ``2l``."""
    if "half" not in tokens:
        return tokens
    return tokens.assign(layer=2 * tokens["layer"] - (tokens["half"] == "attention"))


def token_heatmap(tokens: pd.DataFrame, layer_names: list[str], title: str = "") -> go.Figure:
    """Layer x token heat map for one text: colour = probability of the input token; hover = top-k.

    ``tokens`` holds the per-token rows of one text (columns of :data:`TOKEN_COLUMNS`).
    """
    tokens = by_state(tokens)
    positions = sorted(tokens["position"].unique())
    layers = sorted(tokens["layer"].unique())
    grid = tokens.pivot(index="layer", columns="position", values="prob").reindex(index=layers, columns=positions)
    first = tokens[tokens["layer"] == layers[0]].set_index("position").reindex(positions)
    labels = [f"{p}: {plain(t)}" for p, t in zip(positions, first["input_token"].astype(str), strict=True)]
    hover = tokens.assign(text=[
        f"input <b>{plain(r.input_token)}</b> · predicted <b>{plain(r.predicted_token)}</b>"
        f"<br>p(input) {r.prob:.3f} · rank {r.rank}<br>top: "
        + ", ".join(f"{plain(t)} {p:.2f}" for t, p in zip(r.top_tokens, r.top_probs, strict=True))
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
    for layer, group in by_state(tokens).groupby("layer", sort=True):
        cells = []
        for r in group.sort_values("position").itertuples():
            token = html.escape(str(r.predicted_token))
            title = html.escape(f"input: {r.input_token}", quote=True)
            style = "" if r.correct else "background:#fdd;color:#a00;border-radius:3px;padding:0 2px"
            cells.append(f'<span title="{title}" style="{style}">{token}</span>')
        rows.append(f"<tr><td style='white-space:nowrap;padding-right:1em'>{html.escape(layer_names[layer])}</td>"
                    f"<td>{' '.join(cells)}</td></tr>")
    return "<table style='font-family:monospace;font-size:0.9em'>" + "".join(rows) + "</table>"
