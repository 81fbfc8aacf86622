"""``probe``: the reconstruction probe per layer (Kao et al. 2020), raw or through a tuned lens: layers.csv,
decoded.csv, tokens.parquet (tokens_tuned.parquet with a lens) and run.json."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from analysis.core.csvout import to_csv
from analysis.core.inputs import PROBE_ROW_LIMIT, InputError
from analysis.core.options import pair_column, path
from analysis.core.task import Context, ReadingOptions, Result, RunRecord, Task, layer_rows
from analysis.probe.options import ProbeConfig


class ProbeOptions(ProbeConfig, ReadingOptions):
    """Everything a probe run needs: the model block, the texts, the probe's own knobs
    (:class:`analysis.probe.options.ProbeConfig`) and a tuned lens to read the layers through."""

    input: Path = Field(json_schema_extra=path("data"),
                        title="texts", description="texts: .txt (one per line), .csv, .tsv or .jsonl")
    column: str = Field("text", min_length=1, title="text column", description="column holding the texts "
                        "(csv/tsv/jsonl; default: text)")
    pair_column: str | None = pair_column()
    max_rows: int = Field(PROBE_ROW_LIMIT, ge=1, json_schema_extra={"browser_max": 100_000},
                          title="row limit", description="refuse inputs with more texts "
                          f"than this (default {PROBE_ROW_LIMIT:,}, the pages' limit)")
    lens: Path | None = Field(None, json_schema_extra=path("model"),
                              title="tuned lens", description="also read the layers through this tuned lens "
                              "(`lens train`): layers.csv and decoded.csv gain a lens column (raw/tuned) and every "
                              "row kl_to_final and agreement; the tuned per-token rows go to tokens_tuned.parquet")
    divergence: bool = Field(False, title="divergence", description="also measure each layer's KL to the final "
                             "layer's distribution and its top-1 agreement with it without a lens (kl_to_final, "
                             "agreement; always on with --lens)")

    def config(self) -> ProbeConfig:
        return ProbeConfig(**{name: getattr(self, name) for name in ProbeConfig.model_fields})


class ProbeRun(Result):
    def __init__(self, results: dict, options: ProbeOptions, facts: dict):
        self.results, self.options, self.facts = results, options, facts

    def tables(self):
        import pandas as pd

        raw = self.results["raw"]
        if len(self.results) == 1:
            return raw.layers, raw.decoded
        return tuple(pd.concat([getattr(r, table).assign(lens=name)[["lens", *getattr(r, table).columns]]
                                for name, r in self.results.items()], ignore_index=True)
                     for table in ("layers", "decoded"))

    def write(self, out: Path) -> list[str]:
        layers, decoded = self.tables()
        to_csv(layers, out / "layers.csv")
        to_csv(decoded, out / "decoded.csv")
        for name, result in self.results.items():  # a page's run holds its token rows (a CLI's went to the file)
            if result.tokens is not None:
                result.tokens.to_parquet(out / tokens_file(name), index=False)
        RunRecord("probe", self.facts).write(out)
        return ["layers.csv", "decoded.csv", *map(tokens_file, self.results), "run.json"]

    def shown(self):
        return self.tables()[0]


def tokens_file(reading: str) -> str:
    """The per-token rows' file of a reading (raw, tuned)."""
    return "tokens.parquet" if reading == "raw" else f"tokens_{reading}.parquet"


def needs_mlm_head(loaded, options) -> None:
    from analysis.probe.reconstruction import require_mlm_head

    require_mlm_head(loaded)


class Probe(Task):
    name = "probe"
    help = "reconstruction probe: how well each layer, fed to the MLM head, reconstructs the input"
    writes = "the probe writes layers.csv, decoded.csv, tokens.parquet, run.json"
    Options = ProbeOptions
    example = {"input": "analysis/data/demo_sentiment.csv"}
    page = "pages/1_Reconstruction.py"
    requires = (needs_mlm_head,)
    hidden = ("mask_fraction", "logits_budget_bytes")
    unit = "text"
    series_name, series_what, series_inputs = "probe", "reconstruction accuracy", ("input",)

    def series_options(self, model: dict, series) -> ProbeOptions:
        return ProbeOptions(**model, input=series.input, column=series.text_column, max_rows=series.max_rows)

    def layer_metrics(self, folder: Path) -> list[dict]:
        """``accuracy`` and ``sentence_mean`` (with its bootstrap interval) per layer (the output states)."""
        import pandas as pd

        layers = pd.read_csv(folder / "layers.csv")
        if "half" in layers:
            layers = layers[layers["half"] == "output"]
        return layer_rows(layers, "accuracy", "accuracy") + layer_rows(layers, "sentence_mean", "sentence_mean",
                                                                       "ci_low", "ci_high")

    def run(self, options: ProbeOptions, ctx: Context) -> ProbeRun | None:
        from analysis.core.inputs import check_row_limit, read_file
        from analysis.core.parallel import ranks_for
        from analysis.core.task import check_requirements
        from models.loading import load_model

        if options.half != "output" and options.lens is not None:
            from analysis.probe.lens import halves

            if halves(options.lens) != options.half:
                raise InputError(f"--half attention with --lens: the lens in {options.lens} was trained on the layer "
                                 "outputs only; train one with `layerlens lens train --half attention`, or leave out "
                                 "--lens")
        ranks = ranks_for(options.device)
        spec = options.spec(ranks.device_for(options.device))
        inputs = check_row_limit(read_file(options.input, options.column, options.pair_column), options.max_rows,
                                 "probe's")
        for note in inputs.notes() if ranks.is_main else ():
            ctx.log(f"note: {note}")
        loaded = load_model(spec)
        check_requirements(self, loaded, options)
        if not ranks.is_main:  # a helper process: its share of the batches, merged and written by the main one
            self.compute(loaded, inputs, options, ctx, ranks=ranks)
            return None
        return self.compute(loaded, inputs, options, ctx, ranks=ranks, out=ctx.output())

    def compute(self, loaded, data, options: ProbeOptions, ctx: Context, ranks=None, out: Path | None = None
                ) -> ProbeRun | None:
        """The probe of ``data`` on ``loaded``, raw and (with a lens) tuned; each reading's per-token rows stream into
        ``out``'s Parquet file, or are held in memory without ``out`` (a page's run)."""
        from analysis.core.parallel import ONE
        from analysis.probe.reconstruction import probe
        from analysis.probe.token_sink import TokenSink

        ranks, config = ranks or ONE, options.config()
        readings = [("raw", None)]
        if options.lens is not None:
            from analysis.probe import lens

            readings.append(("tuned", lens.load(options.lens, loaded)))
        divergence = len(readings) > 1 or options.divergence
        note = f" ({ranks.count} processes)" if ranks.count > 1 else ""
        results = {}
        for name, reading in readings:
            stage = ("probing" if reading is None else "probing through the tuned lens") + note
            sink = None if out is None or not ranks.is_main else TokenSink(
                loaded.tokenizer, config.top_k, out / tokens_file(name), halves=config.half != "output")
            results[name] = probe(loaded, data, config, sink=sink,
                                  progress=lambda done, total, stage=stage: ctx.progress(stage, done, total),
                                  should_stop=ctx.should_stop, ranks=ranks, lens=reading, divergence=divergence)
        if not ranks.is_main:
            return None
        result = results["raw"]
        if result.truncated:
            ctx.log(f"note: {result.truncated} text(s) longer than {result.max_length} tokens were cut")
        facts = {**result.run_info(), "input": str(options.input), "column": options.column,
                 "pair_column": options.pair_column, "model_spec": loaded.spec.to_dict(),
                 "lens": str(options.lens) if options.lens else None, "processes": ranks.count,
                 "load_seconds": round(loaded.load_seconds, 3), **({"divergence": True} if options.divergence else {})}
        return ProbeRun(results, options, facts)
