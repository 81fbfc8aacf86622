"""``compare``: checkpoints layer by layer on the same rows (:mod:`analysis.compare`, ``docs/compare.md``):
cka_cross.csv, layer_summary.csv, movers.csv, coords_aligned.csv, run.json. Two or more models (``--model``, given
once per model), a fine-tuning job's epochs against its base (``--job N``) or a sweep group's jobs against the model
they started from (``--group G``). A ``job:N`` among the models, the job and the group are looked up in the job
store through the run's context, and resolved by the one resolver of a second model
(:func:`analysis.tasks.modelref.resolve`), so the tables name a job by its label."""

from __future__ import annotations

from pathlib import Path

from analysis.compare.options import COMPARE_FLAGS, CompareConfig, CompareInputs
from analysis.core.inputs import InputError
from analysis.core.task import Context, Result, RunRecord, Task

FILES = ("cka_cross.csv", "layer_summary.csv", "movers.csv", "coords_aligned.csv")
SHOWN = ("layer", "layer_b", "cka", "cka_ci_low", "cka_ci_high", "mean_movement", "neighbours_mostly_changed",
         "probe_accuracy_a", "probe_accuracy_b", "mcnemar_p", "recon_accuracy_a", "recon_accuracy_b", "recon_change",
         "recon_mcnemar_p")


class CompareOptions(CompareConfig, CompareInputs):
    """The models, jobs or group compared and the rows (:class:`CompareInputs`), and the comparison's knobs
    (:class:`CompareConfig`)."""


class CompareRun(Result):
    def __init__(self, result):
        self.result = result

    def write(self, out: Path) -> list[str]:
        from analysis.core.csvout import to_csv

        r = self.result
        for name, table in zip(FILES, (r.cka_cross, r.layer_summary, r.movers, r.coords), strict=True):
            to_csv(table, Path(out) / name)
        RunRecord("compare", r.info).write(out)
        return [*FILES, "run.json"]

    def summary(self) -> str:
        s = self.result.layer_summary
        shown = [c for c in SHOWN if c in s.columns]
        lines = []
        for name, part in s.groupby("model_b", sort=False):
            lines += [f"{part['model_a'].iloc[0]} vs {name}",
                      part[shown].to_string(index=False, float_format=lambda x: f"{x:.4f}")]
        return "\n".join(lines)

    def done_line(self, shown_out: str, written: list[str]) -> str:
        lines = []
        for p in self.result.info.get("layer_pairs", []):
            if p["left_out_a"] or p["left_out_b"]:
                by = "relative depth" if p["pairing"] == "relative" else p["pairing"]
                lines.append(f"note: {p['model_b']}: layers paired by {by} (depths {p['depths'][0]} and "
                             f"{p['depths'][1]}); left out: "
                             + "; ".join(f"{side}'s {', '.join(map(str, p[f'left_out_{side.lower()}']))}"
                                         for side in "AB" if p[f"left_out_{side.lower()}"])
                             + " (cka_cross.csv has every pair)")
        if self.result.info.get("few_rows"):
            lines.append(f"note: {self.result.info['few_rows']}")
        return "\n".join([*lines, f"wrote {shown_out}/" + ", ".join(written)])


class Compare(Task):
    name = "compare"
    help = ("compare checkpoints layer by layer on the same rows: CKA, probe accuracy, the examples that moved most, "
            "aligned maps")
    writes = "compare writes " + ", ".join([*FILES, "run.json"])
    Options = CompareOptions
    model_flags = False  # its models are a list (--model given once per model)
    hidden = ("revision",)
    flags = {name: flag for name, flag in COMPARE_FLAGS.items() if flag != f"--{name.replace('_', '-')}"}
    page = "pages/7_Compare_checkpoints.py"
    example = {"model": ["demo", "random:demo"], "data": "analysis/data/demo_sentiment.csv"}

    def run(self, options: CompareOptions, ctx: Context) -> CompareRun:
        from analysis.compare.checks import check_rows
        from analysis.tasks.comparing import compare

        modes = [flag for flag, given in (("--model", options.model), ("--job", options.job is not None),
                                          ("--group", options.group)) if given]
        if len(modes) > 1:
            raise InputError(f"give one of --model (twice or more), --job or --group, not {' and '.join(modes)}")
        if not modes or (options.model and len(options.model) < 2):
            raise InputError("give --model at least twice: the reference first, then the checkpoints to compare with "
                             "it (or --job N for a job's epochs, --group G for a sweep)")
        if options.bootstrap is not None:
            ctx.log("note: --bootstrap is ignored: the CKA interval is a delete-one jackknife over the rows now (no "
                    "resamples)")
        config = CompareConfig.from_dict(options.to_dict())
        if options.job is not None:
            return CompareRun(self._epochs(options, config, ctx))
        extra: dict = {}
        if options.group:
            specs, names, data, extra = self._group(options, ctx)
        else:
            if options.data is None:
                raise InputError("--data FILE is required: the rows both models read")
            from analysis.tasks.modelref import resolve

            refs = [resolve(name, options.model[0], ctx.job, head_from=options.head_from) for name in options.model]
            specs, names = [_spec(ref, options) for ref in refs], [ref.label for ref in refs]
            data = read_rows(options, ctx)
        check_rows(data, config.folds, config.debiased)  # before any model is loaded
        models = [_load(spec, options) for spec in specs]
        result = compare(models, data, config, ctx.progress, names)
        result.info |= extra
        return CompareRun(result)

    @staticmethod
    def _epochs(options: CompareOptions, config: CompareConfig, ctx: Context):
        """``--job N``: the job's epochs against its base (:mod:`analysis.tasks.epochs`)."""
        from analysis.tasks.epochs import compare_epochs
        from analysis.training.runs import job_run

        if options.data is not None:
            raise InputError("--job compares the vectors each epoch saved for the job's validation rows: give no "
                             "--data")
        if options.pooling != "cls":
            raise InputError("a job's epochs kept only the [CLS] vectors: --pooling cls (the default)")
        job = ctx.job(options.job)
        run = job_run(job.artifacts, job.config, job.metrics, job.label)
        base = _load(run.base_spec(options.device), options)
        spec = run.checkpoint_spec(options.device)
        checkpoint = _load(spec, options) if spec is not None and options.reconstruction else None
        result = compare_epochs(base, run, config, checkpoint, ctx.progress)
        result.info["job"] = job.id
        return result

    @staticmethod
    def _group(options: CompareOptions, ctx: Context):
        """``--group G``: ``(specs, names, rows, info)``: the model the group's jobs started from, then each finished
        job's fine-tuned model; the rows of ``--data``, else the first job's held-out rows."""
        from analysis.tasks.modelref import resolve_group
        from analysis.training.finetune import held_out_rows
        from analysis.training.options import resolve
        from models.spec import ModelSpec

        jobs, where = ctx.jobs()
        found = resolve_group(jobs, options.group, where)
        done = list(found.members)
        base = resolve(done[0].config).spec()
        specs = [ModelSpec(base.name, revision=base.revision, device=options.device, dtype=options.dtype,
                           allow_pickle=options.allow_pickle)]
        names = [base.name]
        for ref in found.refs(head_from=options.head_from):
            specs.append(_spec(ref, options))
            names.append(ref.label)
        if options.data is not None:
            rows, where = read_rows(options, ctx), str(options.data)
        else:
            rows, where = held_out_rows(resolve(done[0].config), done[0].artifacts)
            ctx.log(f"note: rows: {where} (job #{done[0].id}); jobs whose held-out rows differ may have trained on "
                    "some of them: give --data to choose")
        if found.skipped:
            ctx.log(f"note: group '{options.group}': jobs {', '.join(map(str, found.skipped))} not compared (not "
                    "finished, or no checkpoint)")
        return specs, names, rows, {"group": options.group, "jobs": [j.id for j in done], "rows_are": where}


def _spec(ref, options: CompareOptions):
    """The model a resolved reference names (:class:`analysis.tasks.modelref.ModelRef`: a model, ``random`` or
    ``job:N``, job N's fine-tuned encoder read by the MLM head it started from, or ``head_from``'s), on the options'
    device and dtype."""
    from models.spec import ModelSpec

    return ModelSpec(ref.name, device=options.device, dtype=options.dtype, allow_pickle=options.allow_pickle,
                     head_from=ref.head_from)


def _load(spec, options: CompareOptions):
    """``spec`` loaded; one without an MLM head of its own gets ``head_from``'s when given."""
    import dataclasses

    from models.loading import load_model

    loaded = load_model(spec)
    if loaded.mlm_head is None and options.head_from and options.reconstruction:
        loaded = load_model(dataclasses.replace(spec, head_from=options.head_from))
    return loaded


def read_rows(options: CompareOptions, ctx: Context):
    """The rows of ``data`` (with labels when the label column is there; said when not)."""
    from analysis.core.inputs import read_file

    try:
        data = read_file(options.data, options.text_column, options.pair_column, label_column=options.label_column)
    except InputError as exc:  # no label column (or a .txt file): compare without labels, and say so
        if options.label_column not in str(exc) and "label" not in str(exc):
            raise
        data = read_file(options.data, options.text_column, options.pair_column)
        ctx.log(f"note: no '{options.label_column}' column: comparing without labels (no probe columns)")
    for note in data.notes():
        ctx.log(f"note: {note}")
    return data
