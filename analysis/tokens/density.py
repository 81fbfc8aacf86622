"""A layer's token map as a density image rasterised on the server (issue 29 item 3, the fallback renderer), with
hover on a random sample of the points.

A million points are too many for a browser chart (Plotly's WebGL scatter slows to a crawl well before that) and
the WebGPU map (Embedding Atlas) needs a browser with WebGPU. So the server counts the points per pixel with
datashader (``Canvas.points`` + ``count``: numba-compiled, one pass over the coordinates) and sends one image:
each pixel's shade is its count, on a log scale (``log``) or histogram-equalised (``eq_hist``: every shade level
holds about as many pixels, so both the dense core and the sparse fringe stay readable). Empty pixels are
transparent. A random sample of the rows (``sample_rows``) is drawn over it as ordinary Plotly points, which carry
the hover text, the colours (token, word, position, label, UPOS) and the box/lasso selection; the density itself
has no colour by category: it is counts.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pandas as pd

HOWS = {"log": "log of the count per pixel", "eq_hist": "histogram-equalised counts (each shade level covers about "
        "as many pixels)"}
SHADES = ["#b7cde6", "#08306b"]  # light to dark blue: the sample's colours stay visible on top
_COMPILED: set = set()  # dtypes whose aggregation numba has compiled in this process
_LOCK = threading.Lock()
OTHER = "other"
TOP_CATEGORIES = 10
WIDTH, HEIGHT, MIN_ALPHA = 640, 480, 120  # pixels of the density image; the opacity of a pixel holding one point
# one colour per frequent category: no blue (the density's hue), no orange (the search's rings), no grey ("other")
CATEGORY_COLOURS = ["#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#000000", "#e6ab02",
                    "#1b9e77", "#7b3294"]


@dataclasses.dataclass
class Density:
    """``counts[i, j]``: the points in pixel row ``i`` (``i = 0`` at the *lowest* y) and column ``j`` (``j = 0``
    at the lowest x) of a ``width x height`` grid over ``x_range x y_range``; ``image``: the shaded RGBA image
    (PIL, top row = highest y, as drawn); ``seconds``: the aggregation and shading time."""

    counts: np.ndarray
    image: object
    x_range: tuple[float, float]
    y_range: tuple[float, float]
    how: str
    points: int
    seconds: float
    compile_seconds: float = 0.0  # numba's one-time compilation, before the timed aggregation (first map only)


def extent(coords: np.ndarray, pad: float = 0.02) -> tuple[tuple[float, float], tuple[float, float]]:
    """The x and y ranges holding every finite point, widened by ``pad`` of their span on each side (a zero span
    becomes one unit wide)."""
    out = []
    for axis in (0, 1):
        v = np.asarray(coords[:, axis], dtype=np.float64)
        v = v[np.isfinite(v)]
        lo, hi = (float(v.min()), float(v.max())) if len(v) else (0.0, 0.0)
        span = hi - lo
        if span <= 0:
            lo, hi, span = lo - 0.5, hi + 0.5, 1.0
        out.append((lo - pad * span, hi + pad * span))
    return out[0], out[1]


def warm_up(dtype=np.float32) -> float:
    """Have numba compile datashader's counting and shading for ``dtype`` (once per process; seconds, more on a
    busy machine): the seconds it took now (0 when already done). A page can call it on a thread before the first
    map is asked for; :func:`rasterise` calls it and waits for a compilation under way."""
    dtype = np.dtype(dtype)
    with _LOCK:
        if dtype in _COMPILED:
            return 0.0
        import datashader as ds
        import datashader.transfer_functions as tf

        t0 = time.perf_counter()
        warm = pd.DataFrame({"x": np.zeros(2, dtype), "y": np.ones(2, dtype)})
        small = ds.Canvas(plot_width=WIDTH, plot_height=HEIGHT, x_range=(0.0, 1.0), y_range=(0.0, 1.0)).points(
            warm, "x", "y", ds.count())  # the map's own size and shading: a smaller canvas left 0.7 s to compile
        for shading in HOWS:
            tf.shade(small, cmap=SHADES, how=shading, min_alpha=MIN_ALPHA).to_pil()
        _COMPILED.add(dtype)
        return time.perf_counter() - t0


def rasterise(coords: np.ndarray, width: int = WIDTH, height: int = HEIGHT, how: str = "log",
              x_range: tuple[float, float] | None = None, y_range: tuple[float, float] | None = None) -> Density:
    """The density image of ``coords`` (``(rows, 2)``, any float dtype, memory-mapped is fine) on a ``width x
    height`` pixel grid; the ranges default to :func:`extent`."""
    import datashader as ds
    import datashader.transfer_functions as tf

    if how not in HOWS:
        raise ValueError(f"unknown shading '{how}': choose one of {', '.join(HOWS)}")
    coords = np.asarray(coords)
    compile_seconds = warm_up(coords.dtype)
    t0 = time.perf_counter()
    if x_range is None or y_range is None:
        xr, yr = extent(coords)
        x_range, y_range = x_range or xr, y_range or yr
    frame = pd.DataFrame({"x": coords[:, 0], "y": coords[:, 1]})
    canvas = ds.Canvas(plot_width=width, plot_height=height, x_range=x_range, y_range=y_range)
    agg = canvas.points(frame, "x", "y", agg=ds.count())
    image = tf.shade(agg, cmap=SHADES, how=how, min_alpha=MIN_ALPHA)
    counts = np.asarray(agg.values)
    return Density(counts, image.to_pil(), tuple(map(float, x_range)), tuple(map(float, y_range)), how,
                   int(counts.sum()), time.perf_counter() - t0, compile_seconds)


def sample_rows(rows: int, size: int, seed: int = 0) -> np.ndarray:
    """``size`` distinct rows of ``rows`` drawn at random (all of them when there are fewer), sorted."""
    if rows <= size:
        return np.arange(rows)
    return np.sort(np.random.default_rng(seed).choice(rows, size=size, replace=False))


def categories(values: pd.Series, top: int = TOP_CATEGORIES) -> pd.Series:
    """``values`` as text with all but the ``top`` most frequent replaced by :data:`OTHER` (empty values too)."""
    text = values.astype(str).where(values.astype(str) != "", OTHER)
    keep = text[text != OTHER].value_counts().index[:top]
    return text.where(text.isin(keep), OTHER)


def map_figure(density: Density, points: pd.DataFrame, colour: str | None = None,
               highlight: pd.DataFrame | None = None, title: str = "", x_title: str = "PC 1",
               y_title: str = "PC 2"):
    """The density image under the sample's points. ``points``: columns ``x``, ``y``, ``row``, ``hover`` and the
    ``colour`` column (numbers: a colour scale; text: one trace per category, :func:`categories`); ``highlight``:
    more points (``x``, ``y``, ``row``, ``hover``) drawn on top as rings (a text search's matches). Every point's
    ``customdata`` is its token row, so a selection names rows."""
    import plotly.graph_objects as go

    from analysis.core.figures import plain

    fig = go.Figure()
    (x0, x1), (y0, y1) = density.x_range, density.y_range
    fig.add_layout_image(source=density.image, xref="x", yref="y", x=x0, y=y1, sizex=x1 - x0, sizey=y1 - y0,
                         sizing="stretch", layer="below", opacity=1.0)

    def trace(frame, name, **marker):
        return go.Scattergl(x=frame["x"], y=frame["y"], mode="markers", name=name, customdata=frame["row"],
                            text=frame["hover"], hovertemplate="%{text}<extra></extra>",
                            marker={"size": 4, "opacity": 0.75, **marker})

    if colour is None or colour not in points:
        fig.add_trace(trace(points, "sample", color="#d62728"))
    elif pd.api.types.is_numeric_dtype(points[colour]):
        fig.add_trace(trace(points, "sample", color=points[colour], colorscale="Viridis", showscale=True,
                            colorbar={"title": plain(colour), "thickness": 12}))
    else:
        cats = categories(points[colour])
        order = [c for c in cats.value_counts().index if c != OTHER] + ([OTHER] if (cats == OTHER).any() else [])
        palette = CATEGORY_COLOURS
        for i, cat in enumerate(order):
            part = points[cats == cat]
            fig.add_trace(trace(part, plain(cat), color="#9a9a9a" if cat == OTHER else palette[i % len(palette)]))
    if highlight is not None and len(highlight):
        fig.add_trace(go.Scattergl(x=highlight["x"], y=highlight["y"], mode="markers", name="search matches",
                                   customdata=highlight["row"], text=highlight["hover"],
                                   hovertemplate="%{text}<extra></extra>",
                                   marker={"size": 9, "color": "rgba(0,0,0,0)",
                                           "line": {"color": "#ff7f0e", "width": 2}}))
    fig.update_layout(title=title, height=620, margin={"l": 50, "r": 20, "t": 50, "b": 50}, dragmode="lasso",
                      legend={"itemsizing": "constant", "title": plain(colour) if colour else None},
                      plot_bgcolor="white")
    fig.update_xaxes(range=[x0, x1], title=x_title, showgrid=False, zeroline=False)
    fig.update_yaxes(range=[y0, y1], title=y_title, showgrid=False, zeroline=False)
    return fig
