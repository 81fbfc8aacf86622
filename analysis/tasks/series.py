"""``series``: one per-layer analysis over an ordered series of checkpoints (:mod:`analysis.series`): series.csv,
each checkpoint's own files under ``checkpoints/<NN>-<label>/`` and run.json.

The analyses, each the single-checkpoint task's own run (so the first and last checkpoints' rows are those of
``layerlens probe|atlas|structure|heads stats`` on the same models):

- ``probe``: reconstruction accuracy per layer (``accuracy``, and ``sentence_mean`` with its bootstrap interval);
- ``atlas``: separability (``probe_accuracy`` with its interval, ``silhouette``) and the linear CKA of each layer to
  the same layer of the **last** checkpoint on the same rows (``cka_to_final``, jackknife interval);
- ``structure``: every probe metric (``upos accuracy``, ``distance uuas``, ...) with its interval, and each label
  task's ``selectivity`` (accuracy minus its control task's);
- ``heads``: each head's mean attention entropy (``head H entropy``, t interval) and their mean per layer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from pydantic import Field

from analysis.core.csvout import to_csv
from analysis.core.entry import FolderEntry
from analysis.core.inputs import InputError
from analysis.core.options import Dtype, Options, batch_size_field, path, path_fields
from analysis.core.task import Context, QuietContext, Result, RunRecord, Task, layer_rows
from analysis.series import table
from analysis.series.checkpoints import Checkpoint
from analysis.tasks.registry import TASKS

log = logging.getLogger(__name__)
# the names of the tasks that run across checkpoints (Task.series_name), as a literal for the CLI's choices at import
# time (the registry imports this module); tests/integration/test_series.py holds it equal to seriesable()
ANALYSES = ("probe", "atlas", "structure", "heads")


class SeriesOptions(Options):
    """Which analysis, which checkpoints, its inputs, and where the models run."""

    analysis: Literal[ANALYSES] = Field(title="analysis", description="the per-layer analysis run at every "  # type: ignore[valid-type]
                                        "checkpoint: probe, atlas, structure or heads")
    checkpoints: str = Field(min_length=1, json_schema_extra=path("models"),
                             title="checkpoints", description="the series: job:N (its saved epochs), "
                             "a folder of checkpoints (ordered by the step in their names), MODEL@rev1,rev2,... (hub "
                             "revisions) or A,B,C")
    input: Path | None = Field(None, json_schema_extra=path("data"),
                               title="input", description="probe, heads: texts (.txt, .csv, .tsv, .jsonl); "
                               "atlas: labelled rows")
    train: Path | None = Field(None, json_schema_extra=path("data"),
                               title="train treebank", description="structure: the CoNLL-U file probes train on")
    test: Path | None = Field(None, json_schema_extra=path("data"),
                              title="test treebank", description="structure: the CoNLL-U file they are scored on")
    text_column: str = Field("text", min_length=1, title="text column")
    label_column: str = Field("label", min_length=1, title="label column")
    max_rows: int = Field(2_000, ge=1, json_schema_extra={"browser_max": 100_000},
                          title="row limit", description="refuse inputs with more rows than this")
    max_epochs: int | None = Field(None, ge=1, json_schema_extra={"browser_max": 1000},
                                   title="structure: probe epochs", description="structure: the probes' "
                                   "epoch limit (default: the analysis's own)")
    device: str = Field("auto", title="device")
    dtype: Dtype = Field("auto", title="dtype")
    allow_pickle: bool = Field(False, title="allow pickle")
    batch_size: int = batch_size_field()


class SeriesRun(Result):
    def __init__(self, series, folders: dict[str, Path], facts: dict):
        self.series, self.folders, self.facts = series, folders, facts

    def write(self, out: Path) -> list[str]:
        to_csv(self.series, out / "series.csv")
        for name, folder in self.folders.items():  # plain files only, no link followed
            FolderEntry(folder).copy_to(out / "checkpoints" / name)
        RunRecord("series", self.facts).write(out)
        return ["series.csv", "checkpoints", "run.json"]

    def shown(self):
        last = self.series[self.series["checkpoint"] == self.series["checkpoint"].iloc[-1]] if len(self.series) \
            else self.series
        return last.drop(columns=["interval_low", "interval_high"]).head(40)

    def summary(self) -> str:
        counts = self.series.groupby("metric", sort=False).size()
        return (f"{self.series['checkpoint'].nunique()} checkpoints x {self.series['layer'].nunique()} layers; "
                f"metrics: {', '.join(counts.index)}\n" + super().summary())


def _model(point: Checkpoint, options: SeriesOptions) -> dict:
    return {"model": point.model, "revision": point.revision, "head_from": point.head_from, "device": options.device,
            "dtype": options.dtype, "allow_pickle": options.allow_pickle, "batch_size": options.batch_size}


def seriesable() -> dict:
    """``{name: task}`` of every registered task that runs across checkpoints (``Task.series_name``): what
    ``--analysis`` chooses from (:mod:`analysis.tasks.registry`)."""
    return {task.series_name: task for task in TASKS.values() if task.series_name}


def _need(options: SeriesOptions, task) -> None:
    missing = [n for n in task.series_inputs if getattr(options, n) is None]
    if missing:
        raise InputError(f"series --analysis {options.analysis} needs " + " and ".join(f"--{n}" for n in missing))


def analysis_options(options: SeriesOptions, point: Checkpoint):
    """The single-checkpoint task and its options at ``point`` (the task's ``series_options``)."""
    task = seriesable()[options.analysis]
    return task, task.series_options(_model(point, options), options)


def metrics(analysis: str, point: Checkpoint, folder: Path) -> list[dict]:
    """The long rows of ``analysis``'s files at ``point`` (the task's ``layer_metrics``), named by the checkpoint."""
    return _named(point, seriesable()[analysis].layer_metrics(folder))


def _named(point: Checkpoint, rows: list[dict]) -> list[dict]:
    """Long rows (:func:`analysis.core.task.layer_rows`) as series.csv's: the checkpoint, its step, the interval."""
    return [{"checkpoint": point.label, "step": point.step, "layer": r["layer"], "metric": r["metric"],
             "value": r["value"], "interval": table.interval_text(r["low"], r["high"]), "interval_low": r["low"],
             "interval_high": r["high"]} for r in rows]


def cka_to_final(options: SeriesOptions, points: list[Checkpoint], ctx: Context) -> list[dict]:
    """Each checkpoint's layers against the same layers of the last checkpoint, on the atlas's rows (the atlas's
    cached sentence vectors: :func:`analysis.core.vectors.representations`)."""
    import pandas as pd

    from analysis.core.cka import paired_cka
    from analysis.core.inputs import read_file
    from analysis.core.vectors import representations
    from models.loading import load_model

    data = read_file(options.input, options.text_column, label_column=options.label_column)
    reps = []
    for i, point in enumerate(points):
        _, atlas_options = analysis_options(options, point)
        loaded = load_model(atlas_options.spec())
        array, _ = representations(loaded, data, atlas_options.pooling, atlas_options.max_length, options.batch_size)
        reps.append(array)
        ctx.progress("CKA to the last checkpoint", i + 1, len(points))
    layers = list(range(reps[-1].shape[0]))
    return [row for point, array in zip(points, reps, strict=True)
            for row in _named(point, layer_rows(pd.DataFrame(paired_cka(array, reps[-1], layers)), "cka_to_final",
                                                "cka", "ci_low", "ci_high"))]


class Series(Task):
    name = "series"
    help = ("series: one per-layer analysis (probe, atlas, structure, heads) over an ordered series of checkpoints "
            "(a job's epochs, a folder, hub revisions), each checkpoint cached: series.csv")
    writes = "the series writes series.csv, checkpoints/<NN>-<label>/ (each checkpoint's files), run.json"
    Options = SeriesOptions
    model_flags = False
    example = {"analysis": "probe", "checkpoints": "tests/data/series", "input": "analysis/data/demo_sentiment.csv"}
    page = "pages/12_Across_checkpoints.py"
    unit = "checkpoint"

    def run(self, options: SeriesOptions, ctx: Context) -> SeriesRun:
        from analysis.series.checkpoints import check_one_model, parse

        _need(options, seriesable()[options.analysis])
        from analysis.training.runs import recorded_head

        points = parse(options.checkpoints, recorded_head)
        identity = check_one_model(points)
        ctx.output()
        parts, folders, reused = [], {}, []
        for i, point in enumerate(points):
            task, single = analysis_options(options, point)
            # the inputs enter the key by their content (the series' data options), the weights by theirs: the
            # single task's path options are left out of its options, derived from its schema's marks
            key_options = single.model_dump(mode="json", exclude={"device", "revision", *path_fields(type(single))})
            entry = table.cached(options.analysis, key_options, [getattr(options, name) for name, kind in
                                                                 path_fields(SeriesOptions).items() if kind == "data"],
                                 point)
            if (why := entry.damage()) is None:
                reused.append(point.label)
            else:
                if entry.directory.exists() or entry.directory.is_symlink():
                    log.warning("series cache entry of %s at %s: %s; computed again", options.analysis,
                                point.label, why)
                with entry.writing({"checkpoint": point.label, "model": point.model,
                                    "revision": point.revision}) as folder:
                    task.run(single, QuietContext(folder)).write(folder)
            folder = entry.directory
            parts.append(metrics(options.analysis, point, folder))
            folders[f"{i:02d}-{_safe(point.label)}"] = folder
            ctx.progress(f"{options.analysis} at each checkpoint", i + 1, len(points))
        if options.analysis == "atlas":
            parts.append(cka_to_final(options, points, ctx))
        series = table.long_table(parts)
        facts = {"analysis": options.analysis, "checkpoints": [vars(p) for p in points], "reused": reused,
                 "identity": {"architecture": list(identity["architecture"]), "tokenizer": identity["tokenizer"]},
                 "options": options.model_dump(mode="json"), "columns": table.COLUMNS,
                 **({"coords": "each checkpoint's atlas runs on every layer (layers=all), so its coords.csv holds "
                               "layer 0, one point for every row with cls pooling (zeros), which a single atlas "
                               "run's default layers (-6:) leave out"} if options.analysis == "atlas" else {}),
                 "undefined": "a blank value: the analysis leaves it undefined there (cka_to_final: a layer whose "
                              "vectors are constant over the rows, such as [CLS] at the embeddings with cls "
                              "pooling); a blank interval: the analysis gives none for that metric"}
        if reused:
            ctx.log(f"note: {len(reused)} of {len(points)} checkpoints read from the cache ({', '.join(reused)})")
        return SeriesRun(series, folders, facts)


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)[:60]
