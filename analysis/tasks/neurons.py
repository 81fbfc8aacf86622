"""``neurons``: each layer's units ranked by a probe's weights and the top k ablated (Dalvi et al. 2019):
ranking.csv, ablation.csv and run.json."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from analysis.core.csvout import to_csv
from analysis.core.options import label_column, path, text_column
from analysis.core.task import Context, ReadingOptions, Result, RunRecord, Task
from analysis.neurons.options import NeuronsConfig


class NeuronsOptions(NeuronsConfig, ReadingOptions):
    """The model block, a labelled file and the technique's knobs (:class:`analysis.neurons.options.NeuronsConfig`)."""

    data: Path = Field(json_schema_extra=path("data"),
                       title="labelled rows", description="labelled rows: .csv, .tsv or .jsonl")
    text_column: str = text_column()
    label_column: str = label_column()
    max_rows: int = Field(20_000, ge=1, json_schema_extra={"browser_max": 100_000},
                          title="row limit", description="refuse more rows than this")


class NeuronsRun(Result):
    def __init__(self, result, facts: dict):
        self.result, self.facts = result, facts

    def write(self, out: Path) -> list[str]:
        to_csv(self.result.ranking, out / "ranking.csv")
        to_csv(self.result.ablation, out / "ablation.csv")
        RunRecord("neurons", self.facts).write(out)
        return ["ranking.csv", "ablation.csv", "run.json"]

    def shown(self):
        return self.result.ablation


class Neurons(Task):
    name = "neurons"
    help = "neurons: rank each layer's units by a linear probe's weights, ablate the top k against random and bottom k"
    writes = "neurons writes ranking.csv, ablation.csv, run.json"
    Options = NeuronsOptions
    example = {"data": "analysis/data/demo_sentiment.csv"}
    page = "pages/10_Neurons.py"
    unit = "pass"  # its progress counts the ablation passes

    def run(self, options: NeuronsOptions, ctx: Context) -> NeuronsRun:
        from analysis.core.inputs import check_row_limit, read_file
        from models.loading import load_model

        data = check_row_limit(read_file(options.data, options.text_column, label_column=options.label_column),
                               options.max_rows, "neurons'")
        for note in data.notes():
            ctx.log(f"note: {note}")
        loaded = load_model(options.spec())
        ctx.output()
        return self.compute(loaded, data, options, ctx)

    def compute(self, loaded, data, options: NeuronsOptions, ctx: Context) -> NeuronsRun:
        from analysis.neurons.ablation import neurons

        config = NeuronsConfig(**{name: getattr(options, name) for name in NeuronsConfig.model_fields})
        result = neurons(loaded, data, config, progress=ctx.progress)
        return NeuronsRun(result, {**result.info, "data": str(options.data), "text_column": options.text_column,
                                   "label_column": options.label_column, "model_spec": loaded.spec.to_dict()})
