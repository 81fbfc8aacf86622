"""A finished run as ONE self-contained HTML file (``docs/report.md``).

The file holds the run's figures (plotly.js inlined once in the head, every figure drawn by ``Plotly.newPlot`` from
its JSON, MathJax off, no logo link, no topojson URL), the first rows of each table, every small file embedded as a
``data:`` URI download, the model and its fingerprint, the options, the versions and the command line that
reproduces the run (:mod:`analysis.report.command`). It asks no host for anything: no ``src``/``href`` names one, and
the page's Content-Security-Policy allows no connection, remote script, style, font or image, so a file opened from
a mail attachment stays silent. Every text from the data (tokens, labels, file names, option values, column names) is
HTML-escaped with its invisible characters written out (:func:`analysis.core.figures.visible`); the strings inside
figures are escaped by Plotly's JSON (``<``, ``>`` and ``/`` as ``\\u`` escapes).

Large runs are cut, and the report says where: at most ``max_rows`` rows per table, files over ``max_embed_bytes``
(and any beyond four times that in all) are not embedded, links are listed and never followed. The file states its
own size, computed after assembling (:func:`_sized`)."""

from __future__ import annotations

import base64
import datetime
import html
import json
import secrets
from pathlib import Path

from analysis.core.inputs import InputError
from analysis.core.task import read_run
from analysis.report.files import TABLE_SUFFIXES, RunFile, read_table, run_files

EMBEDDED = {".csv": "text/csv", ".tsv": "text/tab-separated-values", ".json": "application/json",
            ".jsonl": "application/x-ndjson", ".txt": "text/plain", ".conllu": "text/plain",
            ".parquet": "application/vnd.apache.parquet"}
TOTAL_EMBED = 4  # all embedded files together: at most this many times the per-file cap
MAX_TABLES = 30  # tables shown (each one's first rows)
MAX_COLUMNS = 40  # columns shown per table
MAX_CELL = 300  # characters shown per cell
MAX_VALUE = 4000  # characters shown per fact (the whole value is in run.json)
MAX_RUN_JSON_SHOWN = 200_000  # run.json shown whole (in a closed section) up to this many bytes
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "showSendToCloud": False, "topojsonURL": "",
                 "typesetMath": False}
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "
       "font-src data:; connect-src 'none'; media-src 'none'; frame-src 'none'; worker-src 'none'; "
       "base-uri 'none'; form-action 'none'")
NO_OPTIONS = '<p class="muted">run.json has no options object: the options are among the facts below.</p>'
STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:2rem auto;
max-width:1200px;padding:0 1rem;color:#222;line-height:1.45}
h1{font-size:1.6rem}h2{font-size:1.25rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
h3{font-size:1.05rem}pre,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85rem}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;font-size:.85rem;margin:.4rem 0}th,td{border:1px solid #ddd;padding:.2rem .45rem;
text-align:left;vertical-align:top}thead th{background:#f0f0f0}.scroll{overflow-x:auto}
.note{color:#8a4b00}.muted{color:#666}.figure{margin:1rem 0 2rem}
"""


def esc(text) -> str:
    """Text from the data as HTML: invisible and reordering characters written out, then escaped."""
    from analysis.core.figures import visible

    return html.escape(visible(text), quote=True)


def esc_lines(text: str) -> str:
    """:func:`esc` of each line of ``text`` (its line breaks kept, for a ``<pre>``)."""
    return "\n".join(esc(line) for line in text.split("\n"))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit:,} more characters)"


def size_text(size: int) -> str:
    """``4.2 MB``, ``812.0 kB``, ``640 bytes``."""
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.1f} kB" if size >= 1e3 else f"{size} bytes"


def _value(value) -> str:
    if isinstance(value, (dict, list)):
        return f"<pre>{esc_lines(_cut(json.dumps(value, indent=1, ensure_ascii=False, default=str), MAX_VALUE))}</pre>"
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # as run.json has it: null, true, false
    return esc(_cut(str(value), MAX_VALUE))


def _facts(facts: dict) -> str:
    if not facts:
        return '<p class="muted">none recorded</p>'
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{_value(v)}</td></tr>" for k, v in facts.items())
    return f'<div class="scroll"><table>{rows}</table></div>'


def _note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


# --- sections -------------------------------------------------------------------------------------------------


def _model(record: dict) -> str:
    spec = record.get("model_spec") if isinstance(record.get("model_spec"), dict) else {}
    options = record.get("options") if isinstance(record.get("options"), dict) else {}
    name = spec.get("name") or (record["model"] if isinstance(record.get("model"), str) else None) or \
        options.get("model")
    fingerprint = record.get("fingerprint") or spec.get("fingerprint")
    parts = [f"<p>Model: <code>{esc(name)}</code></p>" if name else _note("run.json names no model")]
    parts.append(f"<p>Fingerprint: <code>{esc(fingerprint)}</code></p>" if fingerprint else
                 '<p class="muted">Fingerprint: not recorded in this run.json</p>')
    if record.get("precision") is not None:
        parts.append(f"<p>Precision: {_value(record['precision'])}</p>")
    if spec:
        parts.append("<h3>Model spec</h3>" + _facts(spec))
    return "".join(parts)


def _command(command: tuple[str, list[str]]) -> str:
    line, notes = command
    state = ("exact, as far as run.json records the run" if not notes else "approximate: see the notes")
    items = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return (f"<pre>{esc(line)}</pre><p>This command line is {state}. OUT_DIR: a new folder for the outputs.</p>"
            + (f'<ul class="note">{items}</ul>' if items else ""))


def _figures(figures: list) -> tuple[str, int]:
    parts, drawn = [], 0
    for i, (title, fig) in enumerate(figures):
        heading = f"<h3>{esc(title)}</h3>"
        if isinstance(fig, (str, BaseException)):
            parts.append(f'<div class="figure">{heading}{_note(str(fig))}</div>')
            continue
        from plotly.basedatatypes import BaseFigure

        if not isinstance(fig, BaseFigure):  # only Plotly's own HTML goes into the page unescaped
            note = _note(f"not drawn: {type(fig).__name__} is not a Plotly figure")
            parts.append(f'<div class="figure">{heading}{note}</div>')
            continue
        try:
            height = getattr(getattr(fig, "layout", None), "height", None) or 450
            body = fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False, config=PLOTLY_CONFIG,
                               div_id=f"figure-{i}", default_height=f"{int(height)}px", default_width="100%")
        except Exception as exc:  # noqa: BLE001 - a figure that cannot be written is a note, not a failed report
            parts.append(f'<div class="figure">{heading}{_note(f"not drawn: {type(exc).__name__}: {exc}")}</div>')
            continue
        drawn += 1
        parts.append(f'<div class="figure">{heading}{body}</div>')
    if not parts:
        parts.append('<p class="muted">This run has no figure here: its tables are below.</p>')
    return "".join(parts), drawn


def _cell(value):
    from analysis.core.figures import visible

    return _cut(visible(value), MAX_CELL) if isinstance(value, str) else value


def _table(file: RunFile, max_rows: int, whole: bool) -> str:
    import pandas as pd

    try:
        frame, total = read_table(file, None if whole else max_rows)
    except Exception as exc:  # noqa: BLE001 - an unreadable table is said, the rest of the report stays
        return _note(f"{file.rel} could not be read as a table: {type(exc).__name__}: {str(exc)[:300]}")
    notes = []
    if frame.shape[1] > MAX_COLUMNS:
        notes.append(f"the first {MAX_COLUMNS} of its {frame.shape[1]} columns")
        frame = frame.iloc[:, :MAX_COLUMNS]
    head = frame.head(max_rows)
    columns = [head.iloc[:, i] if pd.api.types.is_numeric_dtype(head.iloc[:, i]) else head.iloc[:, i].map(_cell)
               for i in range(head.shape[1])]
    shown = pd.concat(columns, axis=1, ignore_index=True) if columns else head
    shown.columns = [_cell(str(c)) for c in head.columns]
    rows = (f"all {total:,} rows" if total is not None and total <= max_rows else
            f"the first {len(shown):,} of {total:,} rows" if total is not None else
            f"the first {len(shown):,} rows")
    table = shown.to_html(escape=True, index=False, na_rep="", border=0,
                          float_format=lambda x: f"{x:.6g}")
    return (f"<h3>{esc(file.rel)}</h3><p class=\"muted\">{esc(', '.join([rows, *notes]))}</p>"
            f'<div class="scroll">{table}</div>')


def _tables(files: list[RunFile], max_rows: int, max_embed_bytes: int) -> str:
    tables = [f for f in files if f.suffix in TABLE_SUFFIXES and not f.link]
    parts = [_table(f, max_rows, whole=f.size <= max_embed_bytes and f.suffix != ".parquet")
             for f in tables[:MAX_TABLES]]
    if len(tables) > MAX_TABLES:
        parts.append(_note(f"{len(tables) - MAX_TABLES} more tables are not shown (at most {MAX_TABLES}); they are "
                           "in the run folder"))
    return "".join(parts) or '<p class="muted">This run folder has no table.</p>'


def _downloads(files: list[RunFile], cut: bool, max_embed_bytes: int) -> str:
    rows, total = [], 0
    budget = TOTAL_EMBED * max_embed_bytes
    for f in files:
        name, size = esc(f.rel), size_text(f.size)
        mime = EMBEDDED.get(f.suffix)
        if f.special:
            status = _note("not a plain file (a FIFO, a device or a socket): not read, not embedded")
        elif f.link:
            status = _note("a link: not followed, not embedded")
        elif mime is None:
            status = f'<span class="muted">not embedded ({esc(f.suffix or "no suffix")} files are not); it is in the ' \
                     "run folder</span>"
        elif f.size > max_embed_bytes:
            status = _note(f"{f.rel}: {size}, not embedded (over {size_text(max_embed_bytes)}); it is in the run "
                           "folder")
        elif total + f.size > budget:
            status = _note(f"{f.rel}: {size}, not embedded (the embedded files would pass "
                           f"{size_text(budget)} in all); it is in the run folder")
        else:
            try:
                data = f.path.read_bytes()
            except OSError as exc:
                status = _note(f"could not be read: {exc.strerror or exc}")
            else:
                total += len(data)
                download = esc(f.rel.replace("/", "_"))
                href = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
                status = f'<a download="{download}" href="{href}">download {name}</a>'
        rows.append(f"<tr><td><code>{name}</code></td><td>{esc(size)}</td><td>{status}</td></tr>")
    listed = (f"<table><thead><tr><th>file</th><th>size</th><th>in this report</th></tr></thead><tbody>"
              f"{''.join(rows)}</tbody></table>")
    more = _note("the run folder holds more files than are listed here") if cut else ""
    return f'<div class="scroll">{listed}</div>{more}'


def _run_json(run_dir: Path) -> str:
    path = Path(run_dir) / "run.json"
    text = path.read_text(encoding="utf-8")
    if len(text.encode("utf-8")) > MAX_RUN_JSON_SHOWN:
        return _note(f"run.json is {size_text(path.stat().st_size)}: not shown here (it is in the run folder and "
                     "among the downloads when small enough)")
    return f"<details><summary>run.json, whole</summary><pre>{esc_lines(text)}</pre></details>"


# --- the page -------------------------------------------------------------------------------------------------


def _sized(page: str, token: str) -> str:
    """``page`` with ``token`` replaced by the page's own size in bytes (UTF-8): the smallest padding ``n`` with
    ``len(text(base + n)) <= n``, the text padded with spaces to ``n`` so the stated size is the real one."""
    if page.count(token) != 1:
        raise RuntimeError("the report's size placeholder is not unique")
    base = len(page.encode("utf-8")) - len(token.encode("utf-8"))
    for n in range(1, 200):
        size = base + n
        text = f"{size_text(size)} ({size:,} bytes)"
        if len(text) <= n:
            return page.replace(token, text.ljust(n))
    raise RuntimeError("the report's size could not be stated")  # pragma: no cover - text is far under 200


def build_report(run_dir: Path, figures: list | None = None, max_rows: int = 50, max_embed_bytes: int = 5_000_000,
                 command: tuple[str, list[str]] | None = None) -> str:
    """The HTML report of the run folder ``run_dir`` (module docstring).

    ``figures``: ``(title, plotly figure)`` pairs (a ``str`` or an exception in place of a figure is shown as a
    note); None draws the generic ones (:func:`analysis.report.figures.layer_figures`). ``command``: ``(command
    line, notes)`` (:func:`analysis.report.command.command_line` with the task's schema); None rebuilds it without
    a schema. A folder without a readable ``run.json`` is an :class:`InputError` of one line."""
    from analysis.core.versions import LAYERLENS_VERSION
    from analysis.report.command import command_line

    if max_rows < 1 or max_embed_bytes < 0:
        raise InputError(f"max_rows must be at least 1 and max_embed_bytes at least 0, got {max_rows} and "
                         f"{max_embed_bytes}")
    run_dir = Path(run_dir)
    record = read_run(run_dir)
    files, cut = run_files(run_dir)
    if figures is None:
        from analysis.report.figures import layer_figures

        figures = layer_figures(run_dir)
    if command is None:
        command = command_line(record)
    task = str(record.get("task") or "unknown task")
    figure_html, drawn = _figures(list(figures))
    token = f"@@REPORT-SIZE-{secrets.token_hex(16)}@@"
    options = record.get("options") if isinstance(record.get("options"), dict) else {}
    facts = {k: v for k, v in record.items() if k not in ("task", "versions", "options", "model_spec")}
    versions = record.get("versions") if isinstance(record.get("versions"), dict) else {}
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    script = ""
    if drawn:
        from plotly.offline import get_plotlyjs

        script = f'<script type="text/javascript">/* plotly.js, inlined once */{get_plotlyjs()}</script>'
    body = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>LayerLens report: {esc(task)} run {esc(run_dir.name)}</title>
<style>{STYLE}</style>
{script}
</head><body>
<h1>LayerLens report: {esc(task)}</h1>
<p>Run folder <code>{esc(run_dir.name)}</code>; written {esc(now)} by LayerLens {esc(LAYERLENS_VERSION)}.
This file: <span id="report-size">{token}</span>. It is self-contained: it loads nothing from any host
(plotly.js is inside it), so it opens offline and can be sent as one attachment.</p>
<h2>Model</h2>{_model(record)}
<h2>Reproduce</h2>{_command(command)}
<h2>Figures</h2>{figure_html}
<h2>Tables</h2><p class="muted">At most {max_rows:,} rows of each table are shown.</p>
{_tables(files, max_rows, max_embed_bytes)}
<h2>Files</h2><p class="muted">Files up to {esc(size_text(max_embed_bytes))} each (text tables, JSON and Parquet) are
embedded whole: the links save them from this file.</p>{_downloads(files, cut, max_embed_bytes)}
<h2>Options</h2>{_facts(options) if options else NO_OPTIONS}
<h2>Facts</h2>{_facts(facts)}
<h2>Versions</h2>{_facts(versions)}
<h2>run.json</h2>{_run_json(run_dir)}
</body></html>
"""
    return _sized(body, token)


def write_report(run_dir: Path, out: Path, **kw) -> int:
    """Write :func:`build_report` of ``run_dir`` to the file ``out`` (a temporary file beside it renamed into
    place: whole or absent); its size in bytes, the size the report states."""
    from analysis.core.staging import write_atomic

    out = Path(out)
    if out.is_dir():
        raise InputError(f"{out} is a folder: give the report's file name, e.g. {out / 'report.html'}")
    data = build_report(run_dir, **kw).encode("utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda tmp: tmp.write_bytes(data))
    return len(data)
