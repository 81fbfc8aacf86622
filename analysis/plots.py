"""Plotly figures for the analyses. Plain functions of results: no streamlit, usable in notebooks."""

from __future__ import annotations

import html
import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


# characters that are invisible or reorder what follows: C0/C1 controls, line/paragraph separators and the
# bidirectional marks, embeddings, overrides and isolates (U+202E shows "evil" as "live"); joiners are kept
INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def visible(text) -> str:
    """``text`` with every :data:`INVISIBLE` character written out as its ``\\uXXXX`` escape, so that a label
    shows what was typed and cannot hide or reorder characters; everything else is kept as it is."""
    return INVISIBLE.sub(lambda m: f"\\u{ord(m[0]):04x}", str(text))


def plain(text) -> str:
    """Text from the data or the user (a class label, a token, a model name) as Plotly shows it: exactly as
    typed, with :func:`visible` controls. ``&``, ``<`` and ``>`` are escaped, so ``<a href>`` or ``<b>`` in a
    label is shown, never rendered as a link or bold. Quotes stay as they are: Plotly's text decodes only
    ``&lt;``, ``&gt;``, ``&amp;``, a few named and the numeric entities, so ``&quot;`` would be shown as those
    six characters."""
    return html.escape(visible(text), quote=False)


DEPTH_TITLES = {False: "layer (0 = embeddings)",
                True: "relative depth (layer / L: 0 = embeddings, 1 = last layer)"}


def depth(layers, states: int, relative: bool = False) -> list[float]:
    """Where hidden states ``layers`` of a model with ``states`` hidden states (``L + 1``) sit on a layer axis:
    their own indices, or with ``relative`` their relative depth ``layer / L`` (0..1), so that models of
    different depth can be compared."""
    layers = [int(v) for v in layers]
    return [v / max(states - 1, 1) for v in layers] if relative else layers


def _names(layer_names, label: str, layers) -> list[str]:
    """Run ``label``'s own layer names (its model's, :func:`models.anatomy.layer_name`), else the indices."""
    return list((layer_names or {}).get(label) or [str(int(v)) for v in layers])


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


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
    placed = {label for label in runs if (positions or {}).get(label)}
    axis_names = {tuple(_names(layer_names, label, layers["layer"])) for label, layers in runs.items()
                  if label not in placed}
    for i, (label, layers) in enumerate(runs.items()):
        colour = COLOURS[i % len(COLOURS)]
        names = _names(layer_names, label, layers["layer"])
        if label in placed:  # on the axis of the run that is not placed
            x = depth(positions[label], len(next(iter(axis_names), names)), relative)
        else:
            x = depth(layers["layer"], len(names), relative)
        fig.add_trace(go.Scatter(
            x=x + x[::-1], y=layers["ci_high"].tolist() + layers["ci_low"].tolist()[::-1], fill="toself", mode="lines",
            fillcolor=_rgba(colour, 0.15), line={"width": 0}, hoverinfo="skip", showlegend=False,
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
    elif any("←" in n for n in shared):  # one duplicated model's axis: ticks say "new ← source", as the title says
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
        own = _names(layer_names, label, layers["layer"])
        names, x = np.c_[own], depth(layers["layer"], len(own), relative)
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


def token_heatmap(tokens: pd.DataFrame, layer_names: list[str], title: str = "") -> go.Figure:
    """Layer x token heat map for one text: colour = probability of the input token; hover = top-k.

    ``tokens`` holds the per-token rows of one text (columns of :data:`TOKEN_COLUMNS`).
    """
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


# --- layer atlas --------------------------------------------------------------------------------------------

WEBGL_ABOVE = 2000  # points per chart above which scatter plots use WebGL (same look, far faster to draw)


def label_colours(labels) -> dict[str, str]:
    """One colour per label, the same in every chart (sorted labels, Plotly's qualitative palette)."""
    from plotly.colors import qualitative

    palette = qualitative.Plotly + qualitative.Dark24
    return {label: palette[i % len(palette)] for i, label in enumerate(sorted(map(str, set(labels))))}


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
        names = _names(layer_names, label, sep["layer"])
        x = depth(sep["layer"], len(names), relative)
        names = [names[v] for v in sep["layer"]]
        low, high = sep["probe_ci_low"], sep["probe_ci_high"]
        fig.add_trace(go.Scatter(x=x + x[::-1], y=high.tolist() + low.tolist()[::-1], fill="toself", mode="lines",
                                 fillcolor=_rgba(colour, 0.15), line={"width": 0}, hoverinfo="skip",
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


def cka_heatmap(cka: np.ndarray, layer_names: list[str], title: str = "Linear CKA between layers",
                column_names: list[str] | None = None, x_title: str = "", y_title: str = "") -> go.Figure:
    """Layer x layer similarity (rows ``layer_names``, columns ``column_names`` or the same); undefined cells
    (a constant layer) are left blank."""
    fig = go.Figure(go.Heatmap(z=cka, x=column_names or layer_names, y=layer_names, zmin=0, zmax=1,
                               colorscale="Viridis", hovertemplate="%{y} vs %{x}: CKA %{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, height=480, yaxis={"autorange": "reversed", "title": y_title},
                      xaxis={"title": x_title}, margin={"t": 60, "b": 10})
    return fig


# --- fine-tuning -------------------------------------------------------------------------------------------

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
