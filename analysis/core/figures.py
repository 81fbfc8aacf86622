"""What every technique's figures share: the colours, the text escapers (:func:`visible`, :func:`plain`), the layer
axis (:func:`depth`), class colours and the layer x layer CKA heatmap. Figures are plain functions of results (no
streamlit, usable in notebooks); each technique's own are in its ``plots`` module."""

from __future__ import annotations

import html
import re

import numpy as np
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
    layers = [float(v) if float(v) % 1 else int(v) for v in layers]  # an attention half sits at layer - 0.5
    return [v / max(states - 1, 1) for v in layers] if relative else layers


def run_layer_names(layer_names, label: str, layers) -> list[str]:
    """Run ``label``'s own layer names (its model's, :func:`models.anatomy.layer_name`), else the indices."""
    return list((layer_names or {}).get(label) or [str(int(v)) for v in layers])


def rgba(hex_colour: str, alpha: float) -> str:
    """A ``#rrggbb`` colour as CSS ``rgba(...)`` with opacity ``alpha`` (bands behind their lines)."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


# --- layer atlas --------------------------------------------------------------------------------------------

WEBGL_ABOVE = 2000  # points per chart above which scatter plots use WebGL (same look, far faster to draw)


def label_colours(labels) -> dict[str, str]:
    """One colour per label, the same in every chart (sorted labels, Plotly's qualitative palette)."""
    from plotly.colors import qualitative

    palette = qualitative.Plotly + qualitative.Dark24
    return {label: palette[i % len(palette)] for i, label in enumerate(sorted(map(str, set(labels))))}


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


