"""``report``: a finished run folder as one self-contained HTML file (:mod:`analysis.report`, ``docs/report.md``).

The report technique assembles the page and draws the generic figures; this task adds what only the task layer may
do: each task's own figures, drawn by its technique's ``plots`` functions from the files the run wrote
(:func:`figures_for`), and the options schema of the task that ran, from which the command line is rebuilt
(:func:`command_for`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pydantic import Field

from analysis.core.inputs import InputError
from analysis.core.options import Options, path
from analysis.core.task import Context, Result, Task
from analysis.report.figures import MAX_TABLE_BYTES, failed, layer_figures
from analysis.tasks.registry import TASKS

MAX_MAP_POINTS = 2000  # points per layer of an atlas map drawn in the report (above: WebGL, left to the dashboard)
MAX_LAYER = 1000  # a layer number above this in a run's table is not a model's: its figure is a note


def _depth(highest) -> int:
    """The number of layers a figure spans, from the highest layer a table really holds (never a number of
    run.json's alone), refused above :data:`MAX_LAYER` (a crafted table would make the figure's work grow)."""
    highest = int(highest)
    if not 0 <= highest <= MAX_LAYER:
        raise ValueError(f"layer {highest:,} is not a model's layer (at most {MAX_LAYER:,})")
    return highest


def _label(record: dict) -> str:
    from models.spec import short_name

    spec = record.get("model_spec") if isinstance(record.get("model_spec"), dict) else {}
    name = spec.get("name") or (record["model"] if isinstance(record.get("model"), str) else None)
    return short_name(name) if name else str(record.get("task") or "run")


def _names(record: dict, index: int | None = None) -> list[str] | None:
    names = record.get("layer_names")
    if index is not None and isinstance(names, list) and names and isinstance(names[0], list):
        names = names[index] if index < len(names) else None
    return [str(n) for n in names] if isinstance(names, list) and all(isinstance(n, str) for n in names) else None


# --- each task's figures: (file, title, build(table, record) -> figure | [(title, figure)] | None) ---------------


def _accuracy(layers, record):
    from analysis.probe.plots import accuracy_curve, divergence_curves

    label = _label(record)
    runs = ({f"{label} ({lens})": part.drop(columns="lens") for lens, part in layers.groupby("lens", sort=False)}
            if "lens" in layers.columns else {label: layers})
    names = _names(record)
    layer_names = {run: names for run in runs} if names else None
    out = [("Reconstruction accuracy by layer", accuracy_curve(runs, layer_names))]
    if "kl_to_final" in layers.columns:
        out.append(("KL to the final layer and top-1 agreement with it", divergence_curves(runs, layer_names)))
    return out


def _separability(sep, record):
    from analysis.atlas.plots import separability_curve

    label, names = _label(record), _names(record)
    return separability_curve({label: sep}, {label: names} if names else None)


def _cka(frame, record):
    from analysis.core.figures import cka_heatmap, plain

    frame = frame.set_index(frame.columns[0])
    return cka_heatmap(frame.to_numpy(dtype=float), [plain(i) for i in frame.index],
                       column_names=[plain(c) for c in frame.columns])


def _maps(coords, record):
    from analysis.atlas.plots import atlas_grid

    per_layer = int(coords.groupby("layer").size().max()) if len(coords) else 0
    if per_layer > MAX_MAP_POINTS:
        return f"not drawn here: {per_layer:,} points per layer (over {MAX_MAP_POINTS:,}); the dashboard draws it"
    names = _names(record) or [str(i) for i in range(_depth(coords["layer"].max()) + 1)]
    return atlas_grid(coords, {}, names)


def _task_curves(probes, record):
    from analysis.structure.plots import task_curves

    return task_curves(probes)


def _ablation(ablation, record):
    """Both of the page's charts: the accuracy at the layer whose units are zeroed (Dalvi et al.'s measure) and at
    the last layer (what the ablation does downstream)."""
    from analysis.neurons.plots import ablation_curves

    return [("Accuracy with units ablated, at the layer whose units are zeroed", ablation_curves(ablation)),
            ("Accuracy with units ablated, at the last layer", ablation_curves(ablation, "final_accuracy"))]


def _paired_cka(summary, record):
    from analysis.compare.plots import paired_cka_curve

    names = _names(record, 0) or [str(i) for i in range(_depth(summary["layer"].max()) + 1)]
    return paired_cka_curve(summary, names, _names(record, 1))


def _statistics(heads, record):
    from analysis.heads.plots import TITLES, statistic_heatmap

    return [(TITLES[s], statistic_heatmap(heads, s)) for s in ("entropy", "cls", "sep", "previous", "distance")
            if s in heads.columns]


def _head_map(clusters, record):
    from analysis.heads.plots import head_map

    return head_map(clusters)


def _relations(relations, record):
    from analysis.heads.plots import relations_figure

    return relations_figure(relations)


def _importance(importance, record):
    from analysis.heads.plots import importance_heatmap

    return importance_heatmap(importance)


def _pruning(pruning, record):
    from analysis.heads.plots import pruning_curve

    return pruning_curve(pruning)


def _geometry(table, record):
    from analysis.tokens.plots import geometry_figure

    return geometry_figure(table)


def _history(metrics, record):
    from analysis.training.plots import history_chart

    history = metrics.get("history") if isinstance(metrics, dict) else None
    return history_chart(history) if history else None


def _lens_layers(layers, record):
    from analysis.classifier_lens.plots import accuracy_curves, kl_curves

    label = _label(record)
    return [("Each layer through the classifier's head", accuracy_curves({label: layers})),
            ("KL to the final distribution", kl_curves({label: layers}))]


def _decisions(examples, record):
    from analysis.classifier_lens.plots import decision_histogram

    highest = _depth(examples["decision_layer"].max())  # the table's own; run.json's depth only where it fits
    layers = record.get("layers")
    depth = layers if isinstance(layers, int) and highest <= layers <= MAX_LAYER else highest
    return decision_histogram({_label(record): examples}, depth)


def _heatmaps(series, record):
    from analysis.series.plots import heatmap

    return [(f"{metric} by layer and checkpoint", heatmap(series, metric, str(record.get("analysis") or "")))
            for metric in list(dict.fromkeys(series["metric"]))[:MAX_HEATMAPS]]


MAX_HEATMAPS = 12
OWN_FIGURES_ONLY = {"series"}  # its checkpoints' own tables are in checkpoints/: their generic charts are noise
Build = Callable[[object, dict], object]
FIGURES: dict[str, list[tuple[str, str, Build]]] = {
    "probe": [("layers.csv", "Reconstruction accuracy by layer", _accuracy)],
    "atlas": [("separability.csv", "Separability by layer", _separability),
              ("cka.csv", "Linear CKA between layers", _cka), ("coords.csv", "Sentence maps by layer", _maps)],
    "structure": [("probes.csv", "Probes by layer", _task_curves)],
    "neurons": [("ablation.csv", "Accuracy with units ablated, by layer", _ablation)],
    "compare": [("layer_summary.csv", "CKA of the paired layers", _paired_cka)],
    "finetune": [("metrics.json", "Training history", _history)],
    "heads stats": [("heads.csv", "Head statistics", _statistics),
                    ("clusters.csv", "Heads clustered by behaviour", _head_map)],
    "heads parse": [("relations.csv", "Heads as parsers", _relations)],
    "heads importance": [("importance.csv", "Head importance", _importance),
                         ("pruning.csv", "Pruning curve", _pruning)],
    "tokens geometry": [("geometry.csv", "Token geometry by layer", _geometry)],
    "lens classifier": [("layers.csv", "The classifier lens by layer", _lens_layers),
                        ("examples.csv", "Decision layers", _decisions)],
    "series": [("series.csv", "Layer x checkpoint", _heatmaps)],
}
# tables a task's own figures stand for (no generic chart of them): per-token rows, per-sentence maps
SUMMARISED = {"probe": {"decoded.csv", "tokens.parquet", "tokens_tuned.parquet"}, "neurons": {"ranking.csv"},
              "compare": {"coords_aligned.csv", "cka_cross.csv"}, "tokens geometry": {"rogue_dims.csv"}}


def _read(path: Path):
    if path.suffix == ".json":
        return json.loads(path.read_text(encoding="utf-8"))
    import pandas as pd

    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def figures_for(run_dir: Path, record: dict) -> list[tuple[str, object]]:
    """``(title, plotly figure or note)`` of the run in ``run_dir`` (``record``: its run.json): its task's own
    figures (:data:`FIGURES`), then the generic ones of every other table with a ``layer`` column
    (:func:`analysis.report.figures.layer_figures`). A figure that raises is a note naming the error, and its table
    gets the generic charts instead."""
    run_dir = Path(run_dir)
    task = str(record.get("task") or "")
    out: list[tuple[str, object]] = []
    used = set(SUMMARISED.get(task, ()))
    for file, title, build in FIGURES.get(task, ()):
        path = run_dir / file
        if not path.is_file() or path.is_symlink():
            continue
        if path.stat().st_size > MAX_TABLE_BYTES:
            used.add(file)
            out.append((title, f"not drawn here: {file} is over {MAX_TABLE_BYTES / 1e6:.0f} MB"))
            continue
        try:
            made = build(_read(path), record)
        except Exception as exc:  # noqa: BLE001 - a figure that cannot be made is a note, not a failed report
            out.append(failed(title, exc))  # and its table gets the generic charts instead
            continue
        used.add(file)
        if made is None:
            continue
        out += made if isinstance(made, list) else [(title, made)]
    if task in OWN_FIGURES_ONLY:
        return out
    try:
        out += layer_figures(run_dir, skip=used)
    except Exception as exc:  # noqa: BLE001
        out.append(failed("generic charts", exc))
    return out




def command_for(record: dict) -> tuple[str, list[str]]:
    """The command line that reproduces ``record``'s run (:func:`analysis.report.command.command_line`), with the
    options schema of its task where the task is registered (or is ``finetune``)."""
    from analysis.report.command import command_line

    task = str(record.get("task") or "")
    if task in TASKS and task != "report":
        registered = TASKS[task]
        return command_line(record, registered.Options, registered.flags, registered.hidden)
    if task == "finetune":
        from analysis.training.options import FinetuneOptions

        return command_line(record, FinetuneOptions, hidden=tuple(PLACEMENT))
    return command_line(record)


PLACEMENT = ("backend", "slurm_partition", "slurm_time", "slurm_gpus", "num_processes")


class ReportOptions(Options):
    """What the report reads and writes, and how much of the run it embeds."""

    run_dir: Path = Field(json_schema_extra=path("store"),
                          title="run folder", description="a finished run's folder (its --out), with its run.json")
    out: Path = Field(json_schema_extra=path("output"), title="report file", description="the .html file to write")
    max_rows: int = Field(50, ge=1, le=10_000, title="rows per table", description="rows of each table shown")
    max_embed_mb: float = Field(5.0, ge=0, le=1000, title="largest embedded file (MB)", description="files up to "
                                "this size are embedded for download; larger ones are named, not embedded")


class ReportResult(Result):
    """The report's HTML; :meth:`write_file` writes it to a file, :meth:`write` as ``report.html`` into a folder."""

    def __init__(self, html: str, target: Path | None = None):
        self.html, self.target, self.size = html, target, None

    def write_file(self, path: Path) -> int:
        """Write the report to ``path`` (a temporary file beside it renamed into place); its size in bytes."""
        from analysis.core.staging import write_atomic

        data = self.html.encode("utf-8")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda tmp: tmp.write_bytes(data))
        self.size = len(data)
        return self.size

    def write(self, out: Path) -> list[str]:
        self.write_file(Path(out) / "report.html")
        return ["report.html"]

    def done_line(self, shown_out: str, written: list[str]) -> str:
        size = self.size if self.size is not None else len(self.html.encode("utf-8"))
        return f"wrote {shown_out}/{written[0] if written else 'report.html'} ({size / 1e6:.1f} MB)"


class Report(Task):
    name = "report"
    help = "report: a finished run folder as one self-contained HTML file (figures, tables, files, how to rerun it)"
    writes = "the report writes report.html"
    Options = ReportOptions
    model_flags = False  # it reads a run folder, not a model
    positional = ("run_dir",)
    output_file = True
    page = None  # its door on the pages: the report button of every page with a finished result (ui/report.py)
    example = {"run_dir": "runs/probe", "out": "report.html"}
    unit = "file"

    def run(self, options: ReportOptions, ctx: Context) -> ReportResult:
        from analysis.core.task import read_run
        from analysis.report.html import build_report

        run_dir, out = options.run_dir.expanduser().resolve(), options.out.expanduser().resolve()
        if out == run_dir or out.is_dir():
            raise InputError(f"--out {options.out} is a folder: give the report's file name (e.g. report.html)")
        record = read_run(options.run_dir)
        figures = figures_for(options.run_dir, record)
        for title, figure in figures:
            if isinstance(figure, str) and figure.startswith("not drawn"):
                ctx.log(f"note: {title}: {figure}")
        html = build_report(options.run_dir, figures=figures, max_rows=options.max_rows,
                            max_embed_bytes=int(options.max_embed_mb * 1_000_000), command=command_for(record))
        return ReportResult(html, options.out)
