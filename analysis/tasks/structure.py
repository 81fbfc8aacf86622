"""``structure``: what each layer knows about linguistic structure on UD treebanks (label probes with control
tasks, MDL, structural probes; ``docs/structure.md``): probes.csv, mdl.csv, summary.csv, trees.jsonl, run.json."""

from __future__ import annotations

from pathlib import Path

from analysis.core.inputs import InputError
from analysis.core.task import Context, ReadingOptions, Result, Task, layer_rows
from analysis.structure.options import StructureInputs, StructureOptions

OUTPUTS = "probes.csv, mdl.csv, summary.csv, trees.jsonl, run.json"


class StructureTaskOptions(StructureOptions, StructureInputs, ReadingOptions):
    """The model block, the treebanks and labelled set (:class:`StructureInputs`, a job's too) and the analysis's
    knobs (:class:`StructureOptions`)."""


class StructureRun(Result):
    def __init__(self, result, info: dict):
        self.result, self.info = result, info

    def write(self, out: Path) -> list[str]:
        from analysis.structure.output import FILES, write_outputs

        write_outputs(self.result, out, self.info)
        return list(FILES)

    def shown(self):
        return self.result.summary

    def done_line(self, shown_out: str, written: list[str]) -> str:
        return f"wrote {shown_out}: {OUTPUTS}"


class Structure(Task):
    name = "structure"
    help = ("linguistic structure per layer: UPOS and relation probes with control tasks, MDL, structural probes "
            "on UD treebanks")
    writes = f"the analysis writes {OUTPUTS}"
    Options = StructureTaskOptions
    example = {"train": "tests/data/ud_tiny_train.conllu", "test": "tests/data/ud_tiny_test.conllu",
               "max_epochs": 2}
    page = "pages/6_Linguistic_structure.py"
    series_name, series_what, series_inputs = "structure", "UPOS/DEPREL probes, selectivity and UUAS", ("train",
                                                                                                        "test")

    def series_options(self, model: dict, series) -> StructureTaskOptions:
        extra = {"max_epochs": series.max_epochs} if series.max_epochs else {}
        return StructureTaskOptions(**model, train=str(series.train), test=str(series.test), **extra)

    def layer_metrics(self, folder: Path) -> list[dict]:
        """Every probe metric (``upos accuracy``, ``distance uuas``, ...) with its interval, and each label task's
        ``selectivity`` (accuracy minus its control task's)."""
        import pandas as pd

        probes = pd.read_csv(folder / "probes.csv")
        out = []
        for (task, metric), part in probes.groupby(["task", "metric"], sort=False):
            out += layer_rows(part, f"{task} {metric}", "value", "ci_low", "ci_high")
            if metric == "accuracy" and part["selectivity"].notna().any():
                out += layer_rows(part, f"{task} selectivity", "selectivity")
        return out

    def run(self, options: StructureTaskOptions, ctx: Context) -> StructureRun | None:
        from analysis.core.parallel import ranks_for
        from analysis.core.treebank import read_conllu
        from models.loading import load_model

        analysis = StructureOptions.from_dict(options.to_dict())
        for name in ("train", "test"):
            if not Path(getattr(options, name)).is_file():
                raise InputError(f"--{name} {getattr(options, name)}: no such file (give a CoNLL-U treebank, .conllu "
                                 "or .conllu.gz)")
        train = read_conllu(Path(options.train), analysis.max_sentences)
        test = read_conllu(Path(options.test), analysis.max_sentences)
        labelled = None
        if options.label_data is not None:
            from analysis.core.inputs import read_file

            labelled = read_file(options.label_data, options.text_column, options.pair_column,
                                 label_column=options.label_column)
        ranks = ranks_for(options.device)
        loaded = load_model(options.spec(ranks.device_for(options.device)))
        if ranks.is_main:
            ctx.output()
        return self.compute(loaded, (train, test, labelled), options, ctx, ranks)

    def compute(self, loaded, data, options: StructureTaskOptions, ctx: Context, ranks=None) -> StructureRun | None:
        """The analysis of ``data`` (the train and test treebanks, read, and the labelled set or None) on
        ``loaded``; None in a launcher's helper process (its share of the word vectors)."""
        from analysis.core.parallel import ONE
        from analysis.structure.output import run_info
        from analysis.structure.run import run_structure

        train, test, labelled = data
        ranks, analysis = ranks or ONE, StructureOptions.from_dict(options.to_dict())
        extra = {"labelled": labelled, "label_pooling": options.label_pooling}
        if not ranks.is_main:  # a helper process: its share of the word vectors; the main process does the rest
            run_structure(loaded, train, test, analysis, ranks=ranks, **extra)
            return None
        note = f" ({ranks.count} processes)" if ranks.count > 1 else ""
        result = run_structure(loaded, train, test, analysis, ranks=ranks, **extra,
                               progress=lambda stage, done, total: ctx.progress(stage + note, done, total))
        for name in ("train", "test"):
            info = result.info[name]
            if info["dropped_too_long"] + info["dropped_no_subword"]:
                ctx.log(f"note: {name}: dropped {info['dropped_too_long']} sentence(s) longer than the model's "
                        f"{result.info['max_tokens']} tokens (special tokens included) and "
                        f"{info['dropped_no_subword']} with a word that has no subword, of {info['sentences']} (ids "
                        "in run.json)")
        ctx.log(f"word vector: {result.info['word_vector_text']}")
        ctx.log(f"summary intervals: {result.info['summary_interval']}")
        return StructureRun(result, run_info(result, loaded, ranks.count,
                                             options.label_data if options.label_data else None))
