"""``atlas``: per-layer sentence maps, separability and CKA of a labelled set (Song et al. 2020 §3.3.1; Sun et al.
2019 §5.3.2): coords.csv, separability.csv, cka.csv and run.json."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from analysis.atlas.options import AtlasConfig
from analysis.core.csvout import to_csv
from analysis.core.options import FREE, label_column, pair_column, path
from analysis.core.task import Context, ReadingOptions, Result, RunRecord, Task, layer_rows


class AtlasOptions(AtlasConfig, ReadingOptions):
    """The model block, the labelled rows (a file or a Hugging Face dataset) and the atlas' own knobs
    (:class:`analysis.atlas.options.AtlasConfig`)."""

    data: Path | None = Field(None, json_schema_extra=path("data"),
                              title="labelled rows", description="labelled rows: .csv, .tsv or .jsonl")
    hf_dataset: str | None = Field(None, title="Hugging Face dataset", description="a Hugging Face dataset "
                                   "instead of a file, e.g. glue/sst2 (needs a network or the cache)")
    split: str = Field("validation", min_length=1, title="split", description="with --hf-dataset: the split "
                       "(default validation)")
    text_column: str = Field("text", min_length=1, title="text column", description="column holding the texts "
                             "(default: text)")
    pair_column: str | None = pair_column()
    label_column: str = label_column()
    sample: int | None = Field(None, ge=1, json_schema_extra=FREE,
                               title="sample", description="use a random sample of this many rows")
    max_rows: int | None = Field(None, ge=1, json_schema_extra={"browser_max": 100_000},
                                 title="row limit", description="refuse more rows than this (default: "
                                 "the pages' limit, LAYERLENS_ATLAS_MAX_ROWS or 20,000)")

    @model_validator(mode="after")
    def _one_source(self):
        if (self.data is None) == (self.hf_dataset is None):
            raise ValueError("give the labelled rows as a file (data) or a Hugging Face dataset (hf_dataset), "
                             "one of them")
        return self

    def source(self) -> str:
        return str(self.data) if self.data is not None else f"hf:{self.hf_dataset}:{self.split}"


class AtlasRun(Result):
    def __init__(self, result, facts: dict):
        self.result, self.facts = result, facts

    def write(self, out: Path) -> list[str]:
        to_csv(self.result.coords, out / "coords.csv")
        to_csv(self.result.separability, out / "separability.csv")
        to_csv(self.result.cka_frame(), out / "cka.csv", index=True)
        RunRecord("atlas", self.facts).write(out)
        return ["coords.csv", "separability.csv", "cka.csv", "run.json"]

    def shown(self):
        return self.result.separability


class Atlas(Task):
    name = "atlas"
    help = "layer atlas: per-layer sentence vectors in 2-D by class, separability and CKA per layer"
    writes = "the atlas writes coords.csv, separability.csv, cka.csv, run.json"
    Options = AtlasOptions
    example = {"data": "analysis/data/demo_sentiment.csv"}
    page = "pages/2_Layer_Atlas.py"
    exclusive = ("data", "hf_dataset")
    series_name, series_what, series_inputs = "atlas", "separability and CKA to the last checkpoint", ("input",)

    def series_options(self, model: dict, series) -> AtlasOptions:
        return AtlasOptions(**model, data=series.input, text_column=series.text_column,
                            label_column=series.label_column, max_rows=series.max_rows, layers="all")

    def layer_metrics(self, folder: Path) -> list[dict]:
        """``probe_accuracy`` (with its interval) and ``silhouette`` per layer."""
        import pandas as pd

        sep = pd.read_csv(folder / "separability.csv")
        return layer_rows(sep, "probe_accuracy", "probe_accuracy", "probe_ci_low", "probe_ci_high") + \
            layer_rows(sep, "silhouette", "silhouette")

    def run(self, options: AtlasOptions, ctx: Context) -> AtlasRun | None:
        from analysis.atlas.atlas import atlas
        from analysis.core.inputs import check_row_limit, from_hub_dataset, max_rows, read_file
        from analysis.core.layers import parse_layers
        from analysis.core.parallel import ranks_for
        from models.loading import load_model

        config = AtlasConfig(**{name: getattr(options, name) for name in AtlasConfig.model_fields})
        if options.data is not None:
            data = read_file(options.data, options.text_column, options.pair_column, label_column=options.label_column)
        else:
            name, _, subset = options.hf_dataset.partition("/")
            data = from_hub_dataset(name, subset or None, options.split, options.text_column, options.pair_column,
                                    options.label_column)
        ranks = ranks_for(options.device)
        spec = options.spec(ranks.device_for(options.device))
        for note in data.notes() if ranks.is_main else ():
            ctx.log(f"note: {note}")
        if options.sample:
            if options.sample < len(data) and ranks.is_main:
                ctx.log(f"note: using a random sample of {options.sample:,} of {len(data):,} rows (seed "
                        f"{config.seed})")
            data = data.sample(options.sample, config.seed)
        check_row_limit(data, options.max_rows or max_rows(), "atlas'", sample=True)
        loaded = load_model(spec)
        parse_layers(options.layers, loaded.num_layers + 1)  # a bad --layers is said before any work
        if not ranks.is_main:  # a helper process: its share of the extraction; the main process does the rest
            atlas(loaded, data, config, ranks=ranks, row_limit=options.max_rows)
            return None
        ctx.output()
        return self.compute(loaded, data, options, ctx, ranks)

    def compute(self, loaded, data, options: AtlasOptions, ctx: Context, ranks=None) -> AtlasRun:
        from analysis.atlas.atlas import atlas
        from analysis.core.layers import layers_note
        from analysis.core.parallel import ONE

        config = AtlasConfig(**{name: getattr(options, name) for name in AtlasConfig.model_fields})
        ranks = ranks or ONE  # a page's run: one process
        note = f" ({ranks.count} processes)" if ranks.count > 1 else ""
        result = atlas(loaded, data, config, progress=lambda stage, done, total: ctx.progress(stage + note, done,
                                                                                              total),
                       ranks=ranks, row_limit=options.max_rows)
        if note := layers_note(options.layers, loaded.num_layers + 1):
            ctx.log(f"note: {note}")
        facts = {**result.info, "data": options.source(), "text_column": options.text_column,
                 "pair_column": options.pair_column, "label_column": options.label_column,
                 "model_spec": loaded.spec.to_dict(), "processes": ranks.count}
        return AtlasRun(result, facts)

