"""``heads stats|parse|importance|view``: what every attention head does (:mod:`analysis.heads`; ``docs/heads.md``
and the README describe every file written). Four tasks, one options schema each (:mod:`analysis.heads.options`),
and the ``heads`` job kind (:data:`KIND`), whose JSON is an action and that action's options: it runs the same
task, and a cancelled job keeps what it computed (``LAYERLENS_HOME/cache/heads_progress``) for the same options
submitted again to go on from."""

from __future__ import annotations

from pathlib import Path

from analysis.core.inputs import InputError
from analysis.core.task import Context, ReadingOptions, Result, RunRecord, Task, complete_record, layer_rows
from analysis.heads.options import (
    HeadsImportanceOptions,
    HeadsJobOptions,
    HeadsParseOptions,
    HeadsStatsOptions,
    HeadsViewOptions,
)
from analysis.tasks.kind import JobContext, TaskKind

PAGE = "pages/9_Attention_heads.py"
RESUME = "heads_progress"  # the folder under LAYERLENS_HOME/cache where a cancelled job keeps its sums
COLUMN = {"text_column": "--column"}  # the flag users have always typed


class HeadsRun(Result):
    """An action's tables (:class:`analysis.heads.actions.Output`), its ``run.json`` facts and the lines the CLI
    prints after its table."""

    def __init__(self, action: str, output, facts: dict, said: tuple[str, ...] = ()):
        self.action, self.output, self.facts, self.said = action, output, facts, said

    def write(self, out: Path) -> list[str]:
        self.output.write(Path(out))
        RunRecord(f"heads {self.action}", self.facts).write(out)
        return [*self.output.files, "run.json"]

    def summary(self) -> str:
        return self.output.shown.to_string(index=False, float_format=lambda x: f"{x:.3f}")

    def done_line(self, shown_out: str, written: list[str]) -> str:
        return "\n".join([*self.said, f"wrote {shown_out}: {', '.join(written)}"])


def _options(options) -> dict:
    """``run.json``'s options: the action's own (the model block is ``model_spec``)."""
    return options.model_dump(mode="json", exclude=set(ReadingOptions.model_fields))


def _facts(action: str, options, output, source: str) -> dict:
    """``run.json``: the action, the model, the options, the input read and what the engine adds."""
    return {"action": action, **output.model, "options": _options(options), source: str(getattr(options, source)),
            **output.info}


def _notes(info: dict, ctx: Context) -> None:
    if info.get("truncated"):
        ctx.log(f"note: {info['truncated']} text(s) cut to the model's limit")
    if info.get("dropped_too_long") or info.get("dropped_no_subword"):
        ctx.log(f"note: left out {info['dropped_too_long']} sentence(s) over the model's limit and "
                f"{info['dropped_no_subword']} with a word without subwords")


class HeadsTask(Task):
    """An action of ``layerlens heads``: its job is a ``heads`` job of that action (:data:`KIND`)."""

    kind = "heads"
    page = PAGE
    opened_on = (PAGE, "open it under 'A finished job'")

    def job_config(self, values: dict) -> dict:
        return {"kind": "heads", "action": self.name.split()[1], **values}


class HeadsStats(HeadsTask):
    name = "heads stats"
    help = "per-head statistics over a corpus (Clark et al. 2019 §3) and the head map (§6)"
    writes = "heads stats writes heads.csv, clusters.csv, run.json"
    Options = HeadsStatsOptions
    flags = COLUMN
    example = {"input": "tests/data/ud_tiny_train.conllu", "cluster_tokens": 16}
    unit = "sentence"
    series_name, series_what, series_inputs = "heads", "attention entropy of every head", ("input",)

    def series_options(self, model: dict, series) -> HeadsStatsOptions:  # no head map across checkpoints
        return HeadsStatsOptions(**model, input=str(series.input), text_column=series.text_column,
                                 limit=series.max_rows, clusters=False)

    def layer_metrics(self, folder: Path) -> list[dict]:
        """Each head's mean attention entropy (``head H entropy``, t interval) and their mean per layer."""
        import pandas as pd

        heads = pd.read_csv(folder / "heads.csv")
        out = []
        for head, part in heads.groupby("head"):
            out += layer_rows(part, f"head {head} entropy", "entropy", "entropy_low", "entropy_high")
        return out + layer_rows(heads.groupby("layer", as_index=False)["entropy"].mean(), "mean head entropy",
                                "entropy")

    def run(self, options: HeadsStatsOptions, ctx: Context) -> HeadsRun:
        from analysis.heads import actions
        from analysis.heads.model import load_eager

        source = actions.read_corpus(options.input, options.text_column, options.limit)
        loaded = load_eager(options.spec())
        output = actions.stats(loaded, source, clusters=options.clusters, cluster_tokens=options.cluster_tokens,
                               seed=options.seed, batch_size=options.batch_size, progress=ctx.progress,
                               should_stop=ctx.should_stop, resume=ctx.keep(RESUME))
        _notes(output.info, ctx)
        return HeadsRun("stats", output, _facts("stats", options, output, "input"))


class HeadsParse(HeadsTask):
    name = "heads parse"
    help = "heads as dependency parsers on a UD treebank (Clark §4.2) and their attention trees' UUAS"
    writes = "heads parse writes relations.csv, head_accuracies.csv, uuas.csv, run.json"
    Options = HeadsParseOptions
    example = {"treebank": "tests/data/ud_tiny_test.conllu", "min_count": 2}
    unit = "sentence"

    def run(self, options: HeadsParseOptions, ctx: Context) -> HeadsRun:
        from analysis.heads import actions
        from analysis.heads.model import load_eager

        treebank = actions.read_treebank(options.treebank, options.limit)
        loaded = load_eager(options.spec())
        output = actions.parse(loaded, treebank, options.wanted(), batch_size=options.batch_size,
                               progress=ctx.progress, should_stop=ctx.should_stop, resume=ctx.keep(RESUME),
                               reading=options.reading, symmetry=options.tree, min_count=options.min_count)
        _notes(output.info, ctx)
        best = output.info["best_tree"]
        said = [f"best attention tree (chosen on the selection split): layer {best['layer']} head {best['head']}, "
                f"held-out UUAS {best['uuas']:.3f} (selection {best['selection_uuas']:.3f})"]
        if left := output.info["relations_under_min_count"]:
            said.append(f"{len(left)} relation(s) with fewer than {options.min_count} words in a split left out: "
                        f"{', '.join(list(left)[:8])}{' ...' if len(left) > 8 else ''}")
        return HeadsRun("parse", output, _facts("parse", options, output, "treebank"), tuple(said))


class HeadsImportance(HeadsTask):
    name = "heads importance"
    help = "head importance and the pruning curve (Michel et al. 2019)"
    writes = "heads importance writes importance.csv, pruning.csv, run.json"
    Options = HeadsImportanceOptions
    flags = COLUMN
    exclusive = ("data", "input")
    example = {"input": "analysis/data/demo_sentiment.csv", "limit": 12, "steps": 2, "random_orders": 1}
    unit = "pass"

    def run(self, options: HeadsImportanceOptions, ctx: Context) -> HeadsRun:
        """The MLM loss of the model's own MLM head on ``input``, or on the labelled set ``data`` the loss of the
        model's own sequence-classification head, or, for a fine-tuning job's encoder (``job:N``), of that job's
        classifier (its pooling head on its encoder: :func:`analysis.tasks.recipes.job_classifier_importance`)."""
        from analysis.heads import actions
        from analysis.training.runs import classifier_checkpoint

        if (options.data is None) == (options.input is None):
            raise InputError("give either --input (texts: the MLM loss) or --data (a labelled set: a classifier's "
                             "loss)")
        checkpoint = classifier_checkpoint(options.spec().resolved().source) if options.data else None
        if checkpoint is not None:
            output = self._job_classifier(options, checkpoint, ctx)
        else:  # a labelled set's classifier is read on the CPU (actions.importance)
            output = actions.importance(
                options.spec(), texts=options.input, data=options.data, column=options.text_column,
                label_column=options.label_column, pair_column=options.pair_column, limit=options.limit,
                batch_size=options.batch_size, mask_prob=options.mask_prob, seed=options.seed, steps=options.steps,
                drop=options.drop, progress=ctx.progress, should_stop=ctx.should_stop, resume=ctx.keep(RESUME),
                random_orders=options.random_orders)
        _notes(output.info, ctx)
        said = (f"{output.model['model']}: base accuracy {output.info['base_accuracy']:.4f}; with half the heads "
                f"masked (least important first) {actions.at_fraction(output.files['pruning.csv'], 0.5):.4f}",)
        return HeadsRun("importance", output, _facts("importance", options, output,
                                                     "data" if options.data else "input"), said)

    @staticmethod
    def _job_classifier(options: HeadsImportanceOptions, checkpoint: Path, ctx: Context):
        from analysis.core.inputs import read_file
        from analysis.heads import actions
        from analysis.tasks.recipes import job_classifier_importance

        path = Path(options.data).expanduser()
        if not path.is_file():
            raise InputError(f"--data {path}: no such file")
        data = read_file(path, options.text_column, options.pair_column, options.limit,
                         label_column=options.label_column)
        result = job_classifier_importance(checkpoint, data, f"'{options.model}'", batch_size=options.batch_size,
                                           steps=options.steps, drop=options.drop, progress=ctx.progress,
                                           should_stop=ctx.should_stop, seeds=tuple(range(options.random_orders)))
        model = {"model": options.model, "model_spec": {"checkpoint": str(checkpoint)}, "load_seconds": None}
        return actions.importance_output(result, actions.LOSSES["job"], model)


class ViewRun(Result):
    """One sentence's attention (:class:`analysis.heads.view.HeadView`), a second model's beside it when compared."""

    def __init__(self, view, arrays: dict, layer: int | None, head: int | None, facts: dict):
        self.view, self.arrays, self.layer, self.head, self.facts = view, arrays, layer, head, facts

    def write(self, out: Path) -> list[str]:
        import numpy as np
        import pandas as pd

        from analysis.core.csvout import to_csv
        from analysis.heads.view import head_rows

        view = self.view
        np.savez_compressed(Path(out) / "attention.npz", attention=view.attention, ids=np.asarray(view.ids),
                            tokens=np.asarray(view.tokens, dtype=str), **self.arrays)
        written = ["attention.npz"]
        if self.layer is not None:
            to_csv(pd.DataFrame(head_rows(view, self.layer, self.head)), Path(out) / "attention.csv")
            written.append("attention.csv")
        RunRecord("heads view", self.facts).write(out)
        return [*written, "run.json"]

    def summary(self) -> str:
        return " ".join(self.view.tokens)

    def done_line(self, shown_out: str, written: list[str]) -> str:
        v = self.view
        return f"{v.layers} layers x {v.heads} heads x {len(v.tokens)} x {len(v.tokens)} tokens; wrote {shown_out}: " \
               + ", ".join(written)


class HeadsView(HeadsTask):
    name = "heads view"
    help = "one sentence's attention, every layer and head (bertviz's head view as arrays)"
    writes = "heads view writes attention.npz, run.json (attention.csv with --layer)"
    Options = HeadsViewOptions
    example = {"text": "the cat sat on the mat .", "layer": 1}
    unit = "model"

    def run(self, options: HeadsViewOptions, ctx: Context) -> ViewRun:
        from analysis.heads.actions import model_facts
        from analysis.heads.model import check_head, load_eager
        from analysis.heads.view import compare_views, head_view
        from analysis.tasks.modelref import resolve
        from models.spec import ModelSpec

        if options.head is not None and options.layer is None:
            raise InputError("--head needs --layer (the head's attention layer, 1-based)")
        loaded = load_eager(options.spec())
        if options.layer is not None:
            check_head(loaded.model, options.layer, options.head or 0)
        arrays, extra = {}, {}
        if options.compare:  # random: this model's architecture with random weights (job:N: resolved by the door)
            ref = resolve(options.compare, loaded.spec.name, lambda job_id: None)
            other = load_eager(ModelSpec(ref.name, device=options.device, dtype=options.dtype,
                                         allow_pickle=options.allow_pickle))  # attention needs no MLM head
            both = compare_views(loaded, other, options.text)
            view = both.a
            arrays = {"attention_compared": both.b.attention, "difference": both.difference}
            extra = {"compared": {"ref": options.compare, "model": ref.name, "label": ref.label}}
        else:
            view = head_view(loaded, options.text)
        facts = {"action": "view", **model_facts(loaded), "options": _options(options), **view.info(),
                 **extra}
        return ViewRun(view, arrays, options.layer, options.head, facts)


TASKS = {task.name.split()[1]: task for task in (HeadsStats(), HeadsParse(), HeadsImportance(), HeadsView())}


class HeadsKind(TaskKind):
    """The ``heads`` job kind (:mod:`jobs.kinds`): ``{"kind": "heads", "action": ..., <that action's options>}``
    (:class:`analysis.heads.options.HeadsJobOptions`), run by the action's task with a job's context, so a job
    writes the files and ``run.json`` the CLI writes for the same options. Checked at submit: the options, the
    action's one input (read whole as the job will read it: a malformed line is refused now) and the model's
    config. Cancel stops it at its next progress report; what it computed is kept (:data:`RESUME`)."""

    LABELS = {"stats": "head statistics", "parse": "heads as parsers", "importance": "head importance",
              "view": "attention view"}
    UNITS = {"attention": "sentences", "importance": "batches", "pruning": "passes", "layers": "layers"}

    def __init__(self):
        super().__init__(TASKS["stats"])  # its job:N resolved as any heads task's (the four share the model block)
        self.NAME, self.OPTIONS = "heads", HeadsJobOptions
        self.__name__ = __name__  # the module that defines the kind (jobs.kinds lists kinds by module)

    def label(self, config: dict) -> str:
        """What the store and the pages call the job's work."""
        return self.LABELS.get(str(config.get("action")), "attention heads")

    def _read(self, options: HeadsJobOptions):
        """The action's input as the job reads it (a refusal now rather than a failed job)."""
        from analysis.core.inputs import read_file
        from analysis.heads import actions

        name, path = options.source()
        if name == "treebank":
            return actions.read_treebank(path, options.limit, "treebank")
        if name == "data":
            if not Path(path).expanduser().is_file():
                raise InputError(f"labelled set {path}: no such file")
            return read_file(Path(path).expanduser(), options.text_column, options.pair_column, options.limit,
                             label_column=options.label_column)
        if name == "text":
            return None
        source = actions.read_corpus(path, options.text_column, options.limit, "input")
        if options.action == "importance" and not hasattr(source, "texts"):
            raise InputError(f"importance reads texts (the MLM loss) or a labelled set, not a treebank: {path}")
        return source

    def validate(self, config: dict, browser, model_config) -> tuple[dict, str]:
        """(the options to store, with ``kind``, the device the job will run on); a refusal is an
        :class:`InputError`, a ``ModelLoadError`` or a ``ValueError`` whose message says why (``browser``: the
        browser's check of the options, applied before anything is read)."""
        options = self.options(config)
        if browser:
            options = browser(options)
        try:
            self._read(options)
        except OSError as exc:
            raise InputError(str(exc)) from None
        options.for_action()
        spec = options.spec().resolved()
        model_config(spec)
        device = "cpu" if options.action == "importance" and options.data else spec.device
        return {"kind": self.NAME, **options.to_dict()}, device

    def run(self, config: dict, out: Path, control) -> dict:
        """The action's task on the job's options, reporting to the job; its files and ``run.json`` in ``out``.
        Returns the job's metrics: the files and what ``run.json`` says beside them."""
        options = self.options(config)
        control.listen()
        name, path = options.source()
        control.log(f"heads {options.action} of {options.model} on {path}")
        result = JobContext(out, control).run(TASKS[options.action], options.for_action())
        info = result.facts
        if said := self.note({"action": options.action, **info}):  # the words the jobs table shows, in the log too
            control.log(said)
        files = result.write(out)
        complete_record(out, options.for_action())
        control.log(f"wrote {', '.join(files)}")
        return {"kind": self.NAME, "action": options.action, "files": files[:-1],
                **{k: v for k, v in info.items() if k in ("base_accuracy", "best_tree", "layers", "heads",
                                                          "resumed_after")}}

    def stage(self, progress: dict) -> str:
        """``attention: 120 of 300 sentences · 40% of the job``: where a running heads job is."""
        p = progress or {}
        if not p:
            return ""
        name = p.get("stage", "")
        return (f"{name}: {p.get('step', 0)} of {p.get('total_steps', '?')} {self.UNITS.get(name, 'steps')} · "
                f"{p.get('fraction', 0):.0%} of the job")

    @staticmethod
    def note(metrics: dict) -> str:
        """``resumed after 4 passes ...`` when the job went on from a cancelled job's resume file."""
        done = (metrics or {}).get("resumed_after")
        if not done:
            return ""
        unit = "passes (the gate gradients, then scored sets of masked heads)" \
            if metrics.get("action") == "importance" else "sentences summed"
        return f"resumed after {done} {unit} of an earlier job"


KIND = HeadsKind()
