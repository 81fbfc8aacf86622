"""The figures any run folder gets, whatever its task: for each table with a ``layer`` column, one line chart per
numeric column against the layer (its ``_low``/``_high`` columns drawn as a band). The task layer
(:mod:`analysis.tasks.report`) adds each task's own figures and passes the tables it drew so they are not drawn
twice. A figure that cannot be made is a note naming the error, never a failed report."""

from __future__ import annotations

from pathlib import Path

from analysis.report.files import TABLE_SUFFIXES, read_table, run_files

MAX_FIGURES = 12  # generic charts per report
MAX_GROUPS = 8  # a text column with at most this many values: one line per value
MAX_TABLE_BYTES = 20_000_000  # tables read whole for a figure
SKIPPED = {"layer", "layer_b", "head", "seed", "fold", "row", "index", "position", "unit", "dim"}  # indices


def failed(title: str, exc: BaseException) -> tuple[str, str]:
    """The note shown in place of a figure that raised ``exc``."""
    return title, f"not drawn: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")


def _numeric(frame) -> list[str]:
    import pandas as pd

    columns = []
    for column in frame.columns:
        name = str(column)
        if name in SKIPPED or name.endswith("_id") or not pd.api.types.is_numeric_dtype(frame[column]) or \
                pd.api.types.is_bool_dtype(frame[column]) or not frame[column].notna().any():
            continue
        if name.endswith(("_low", "_high")) and name.rsplit("_", 1)[0] in frame.columns:
            continue  # drawn as its column's band
        columns.append(column)
    return columns


def _groups(frame):
    """A text column that splits the rows into lines (at most :data:`MAX_GROUPS` values, one row per layer in each),
    or None."""
    import pandas as pd

    for column in frame.columns:
        text = pd.api.types.is_string_dtype(frame[column]) or pd.api.types.is_object_dtype(frame[column])
        try:
            if text and 1 < frame[column].nunique() <= MAX_GROUPS and \
                    not frame.duplicated([column, "layer"]).any():
                return column
        except TypeError:  # a column of lists (a parquet's top-k): no grouping by it
            continue
    return None


def layer_chart(frame, column, title: str):
    """``column`` of ``frame`` against ``layer``: one line (a band from ``column_low``/``column_high``), one per
    value of a grouping text column, or the mean of each layer's rows (said in the title)."""
    import plotly.graph_objects as go

    from analysis.core.figures import COLOURS, plain, rgba

    frame = frame[frame["layer"].notna()]
    group = None if not frame["layer"].duplicated().any() else _groups(frame)
    if frame["layer"].duplicated().any() and group is None:
        frame = frame.groupby("layer", as_index=False)[[c for c in (column, f"{column}_low", f"{column}_high")
                                                        if c in frame.columns]].mean()
        title += " (mean of each layer's rows)"
    fig = go.Figure()
    parts = [(None, frame)] if group is None else list(frame.groupby(group, sort=True))
    for i, (name, part) in enumerate(parts):
        part = part.sort_values("layer")
        colour = COLOURS[i % len(COLOURS)] if len(parts) <= len(COLOURS) else None
        x = part["layer"].tolist()
        low, high = f"{column}_low", f"{column}_high"
        if low in part.columns and high in part.columns and colour:
            fig.add_trace(go.Scatter(x=x + x[::-1], y=part[high].tolist() + part[low].tolist()[::-1], fill="toself",
                                     mode="lines", line={"width": 0}, fillcolor=rgba(colour, 0.15),
                                     hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(x=x, y=part[column], mode="lines+markers", line={"color": colour} if colour else {},
                                 name=plain(column if name is None else f"{group} = {name}")))
    fig.update_layout(title=plain(title), xaxis_title="layer", yaxis_title=plain(column), height=360,
                      showlegend=group is not None, margin={"t": 60, "b": 10})
    fig.update_xaxes(dtick=1 if frame["layer"].nunique() <= 30 else None)
    return fig


def layer_figures(run_dir: Path, skip=(), limit: int = MAX_FIGURES) -> list[tuple[str, object]]:
    """``(title, figure or note)`` for each numeric column of each table of ``run_dir`` that has a ``layer`` column,
    except the tables named (relative paths) in ``skip``; at most ``limit`` charts."""
    import pandas as pd

    out: list[tuple[str, object]] = []
    files, _ = run_files(run_dir)
    for file in files:
        if file.link or file.suffix not in TABLE_SUFFIXES or file.rel in skip:
            continue
        if file.size > MAX_TABLE_BYTES:
            continue
        try:
            frame, _ = read_table(file)
        except Exception as exc:  # noqa: BLE001 - a table that cannot be read is a note, not a failed report
            out.append(failed(file.rel, exc))
            continue
        if "layer" not in frame.columns or not pd.api.types.is_numeric_dtype(frame["layer"]):
            continue
        for column in _numeric(frame):
            if len(out) >= limit:
                out.append(("more charts", f"more numeric columns were not drawn (at most {limit} generic charts); "
                            "their tables are below"))
                return out
            title = f"{file.rel}: {column} by layer"
            try:
                out.append((title, layer_chart(frame, column, title)))
            except Exception as exc:  # noqa: BLE001
                out.append(failed(title, exc))
    return out
