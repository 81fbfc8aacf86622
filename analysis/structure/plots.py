"""Plotly figures of a linguistic-structure run: per-task curves over layers (interval band, majority baseline,
position baseline, control task) and a sentence's gold tree above the distance probe's predicted tree."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.core.figures import plain

TITLES = {("upos", "accuracy"): "UPOS accuracy", ("deprel", "accuracy"): "DEPREL accuracy<br>(edge probe)",
          ("distance", "uuas"): "UUAS<br>(distance probe)", ("depth", "root_acc"): "root accuracy<br>(depth probe)",
          ("upos", "macro_f1"): "UPOS macro-F1", ("deprel", "macro_f1"): "DEPREL macro-F1",
          ("distance", "spearman"): "distance Spearman", ("depth", "spearman"): "norm Spearman",
          ("label", "accuracy"): "task label accuracy<br>(sentence probe)"}


def task_curves(probes: pd.DataFrame, metrics=("accuracy", "uuas", "root_acc"), reference: pd.DataFrame | None = None,
                reference_name: str = "random weights") -> go.Figure:
    """One panel per task: the score per layer with its 95% band, the majority baseline, the position baseline
    (UUAS: the right-branching chain; root accuracy: the commonest root position) and the control task;
    with ``reference`` (another run's ``probes.csv``, e.g. the same architecture with random weights), its scores
    as a grey line."""
    panels = [(t, m) for t in dict.fromkeys(probes.task) for m in metrics
              if ((probes.task == t) & (probes.metric == m)).any()]
    fig = make_subplots(rows=1, cols=max(len(panels), 1), subplot_titles=[TITLES.get(p, " ".join(p)) for p in panels])
    for c, (task, metric) in enumerate(panels, 1):
        rows = probes[(probes.task == task) & (probes.metric == metric)].sort_values("layer")
        first = c == 1
        fig.add_trace(go.Scatter(x=list(rows.layer) + list(rows.layer[::-1]),
                                 y=list(rows.ci_high) + list(rows.ci_low[::-1]), fill="toself", line_width=0,
                                 mode="lines",  # plotly's default for < 20 points adds stray markers
                                 fillcolor="rgba(31,119,180,0.2)", name="95% interval", legendgroup="ci",
                                 showlegend=first, hoverinfo="skip"), 1, c)
        fig.add_trace(go.Scatter(x=rows.layer, y=rows.value, mode="lines+markers", name="probe",
                                 line_color="#1f77b4", legendgroup="probe", showlegend=first), 1, c)
        if rows.majority_baseline.notna().any():
            fig.add_trace(go.Scatter(x=rows.layer, y=rows.majority_baseline, mode="lines", name="majority baseline",
                                     line=dict(color="grey", dash="dot"), legendgroup="base", showlegend=first), 1, c)
        if "position_baseline" in rows and rows.position_baseline.notna().any():
            fig.add_trace(go.Scatter(x=rows.layer, y=rows.position_baseline, mode="lines", name="position baseline",
                                     line=dict(color="#8c564b", dash="dashdot"), legendgroup="position",
                                     showlegend=not any(t.name == "position baseline" for t in fig.data)), 1, c)
        if rows.control.notna().any():
            fig.add_trace(go.Scatter(x=rows.layer, y=rows.control, mode="lines+markers", name="control task",
                                     line=dict(color="#d62728", dash="dash"), legendgroup="control",
                                     showlegend=first), 1, c)
        if reference is not None:
            ref = reference[(reference.task == task) & (reference.metric == metric)].sort_values("layer")
            if len(ref):
                fig.add_trace(go.Scatter(x=ref.layer, y=ref.value, mode="lines+markers", name=reference_name,
                                         line=dict(color="#7f7f7f"), marker_symbol="x", legendgroup="reference",
                                         showlegend=first), 1, c)
        fig.update_xaxes(title_text="layer", dtick=1, row=1, col=c)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_layout(height=380, margin=dict(t=70, b=40), legend=dict(orientation="h", y=-0.2))
    return fig


def _arcs(fig, edges, y0: float, sign: int, colour: str, name: str, dash: str | None = None) -> None:
    first = True
    for a, b in edges:
        lo, hi = min(a, b), max(a, b)
        xs = [lo + (hi - lo) * t / 20 for t in range(21)]
        height = 0.3 + 0.25 * (hi - lo)
        ys = [y0 + sign * height * 4 * (x - lo) * (hi - x) / max((hi - lo) ** 2, 1) for x in xs]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=colour, dash=dash), name=name,
                                 legendgroup=name, showlegend=first, hoverinfo="skip"))
        first = False


def sentence_trees(record: dict, layer: str) -> go.Figure:
    """The sentence's words on a line; gold arcs (UD, dependent to head, punctuation included) above, the
    distance probe's predicted edges at ``layer`` below (green where they are gold edges, red where not)."""
    words = record["words"]
    fig = go.Figure()
    gold = [(d, h) for d, h in record["gold_arcs"] if h]
    _arcs(fig, gold, 0.15, 1, "#1f77b4", "gold tree")
    shown = record["layers"].get(layer, {})
    scored = {tuple(sorted(e)) for e in shown.get("gold_edges", [])}
    pred = [tuple(e) for e in shown.get("predicted_edges", [])]
    _arcs(fig, [e for e in pred if tuple(sorted(e)) in scored], -0.15, -1, "#2ca02c", "predicted, in gold")
    _arcs(fig, [e for e in pred if tuple(sorted(e)) not in scored], -0.15, -1, "#d62728", "predicted, not in gold",
          "dash")
    fig.add_trace(go.Scatter(x=list(range(1, len(words) + 1)), y=[0] * len(words), mode="text",
                             text=[plain(w) for w in words], textfont_size=14, showlegend=False,
                             hovertext=[f"{plain(w)} ({u})" for w, u in zip(words, record["upos"], strict=True)],
                             hoverinfo="text"))
    root = next((d for d, h in record["gold_arcs"] if h == 0), None)
    if root:
        fig.add_annotation(x=root, y=0.12, text="root", showarrow=False, yanchor="bottom", font_size=10)
    uuas = shown.get("uuas")
    fig.update_layout(height=380, margin=dict(t=40, b=10), title=f"layer {layer}" + (
        f" · UUAS {uuas:.2f} (punctuation excluded)" if uuas is not None else ""),
        xaxis=dict(visible=False), yaxis=dict(visible=False), legend=dict(orientation="h"))
    return fig


def upos_across_layers(record: dict) -> pd.DataFrame:
    """A word per row: its gold UPOS and the UPOS probe's tag at each layer kept in the record."""
    frame = pd.DataFrame({"word": record["words"], "gold": record["upos"]})
    for layer, got in sorted(record["layers"].items(), key=lambda kv: int(kv[0])):
        if "predicted_upos" in got:
            frame[f"layer {layer}"] = got["predicted_upos"]
    return frame
