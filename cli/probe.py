"""``layerlens probe``: the reconstruction probe per layer (Kao et al. 2020), raw or through a tuned lens."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm.auto import tqdm

from analysis.core.csvout import to_csv
from analysis.core.inputs import PROBE_ROW_LIMIT, check_row_limit
from analysis.probe.options import PROBE_FLAGS, ProbeConfig
from cli.common import (
    UserError,
    add_option_flag,
    launched,
    positive_int,
    prepare_out,
    processes_note,
    versions,
    write_json,
)


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("probe")
    g.add_argument("--input", type=Path, required=True, help="texts: .txt (one per line), .csv, .tsv or .jsonl")
    g.add_argument("--column", default="text", help="column holding the texts (csv/tsv/jsonl; default: text)")
    g.add_argument("--pair-column", help="column holding the second text of a pair (e.g. text_pair, aspect)")
    for name in PROBE_FLAGS:  # from the schema: default, choices, help; its checks run in cmd_probe
        add_option_flag(g, name, schema=ProbeConfig)
    g.add_argument("--max-rows", type=positive_int, default=PROBE_ROW_LIMIT, help="refuse inputs with more texts "
                   f"than this (default {PROBE_ROW_LIMIT:,}, the pages' limit)")
    g.add_argument("--lens", type=Path, metavar="DIR", help="also read the layers through this tuned lens (`lens "
                   "train`): layers.csv and decoded.csv gain a lens column (raw/tuned) and every row kl_to_final "
                   "and agreement; the tuned per-token rows go to tokens_tuned.parquet")


def cmd_probe(args: argparse.Namespace) -> int:
    """Reconstruction probe: every layer through the model's own MLM head."""
    import pandas as pd

    from analysis.core.inputs import read_file
    from analysis.probe.reconstruction import probe, require_mlm_head
    from analysis.probe.token_sink import TokenSink
    from models.loading import load_model

    if args.out is None:
        raise UserError("--out DIR is required: the probe writes layers.csv, decoded.csv, tokens.parquet, run.json")
    if args.half != "output" and args.lens is not None:
        from analysis.probe.lens import halves

        if halves(args.lens) != args.half:
            raise UserError(f"--half attention with --lens: the lens in {args.lens} was trained on the layer outputs "
                            "only; train one with `layerlens lens train --half attention`, or leave out --lens")
    ranks, spec = launched(args)
    inputs = check_row_limit(read_file(args.input, args.column, args.pair_column), args.max_rows, "probe's")
    for note in inputs.notes() if ranks.is_main else ():
        print(f"note: {note}", file=sys.stderr)
    try:
        config = ProbeConfig(batch_size=args.batch_size, **{name: getattr(args, name) for name in PROBE_FLAGS})
    except ValueError as exc:
        raise UserError(str(exc)) from None
    loaded = load_model(spec)
    require_mlm_head(loaded)
    readings = [("raw", None)]
    if args.lens is not None:
        from analysis.probe import lens

        readings.append(("tuned", lens.load(args.lens, loaded)))
    if not ranks.is_main:  # a helper process: its share of the batches, merged and written by the main process
        for _, reading in readings:
            probe(loaded, inputs, config, ranks=ranks, lens=reading, divergence=len(readings) > 1)
        return 0
    out = prepare_out(args.out)
    results = {}
    for name, reading in readings:
        tokens = "tokens.parquet" if reading is None else f"tokens_{name}.parquet"
        desc = ("probing" if reading is None else "probing through the tuned lens") + processes_note(ranks)
        with tqdm(total=len(inputs), desc=desc, unit="text", file=sys.stderr) as bar:
            results[name] = probe(loaded, inputs, config, sink=TokenSink(loaded.tokenizer, config.top_k, out / tokens,
                                                                  halves=config.half != "output"),
                                  progress=lambda done, total: bar.update(done - bar.n), ranks=ranks, lens=reading,
                                  divergence=len(readings) > 1)
    result = results["raw"]
    if result.truncated:
        print(f"note: {result.truncated} text(s) longer than {result.max_length} tokens were cut", file=sys.stderr)
    layers, decoded = result.layers, result.decoded
    if len(results) > 1:
        layers, decoded = (pd.concat([getattr(r, table).assign(lens=name)[["lens", *getattr(r, table).columns]]
                                      for name, r in results.items()], ignore_index=True)
                           for table in ("layers", "decoded"))
    to_csv(layers, out / "layers.csv")
    to_csv(decoded, out / "decoded.csv")
    write_json(out, "run.json", {**result.run_info(), "input": str(args.input), "column": args.column,
                                 "pair_column": args.pair_column, "model_spec": loaded.spec.to_dict(),
                                 "lens": str(args.lens) if args.lens else None,
                                 "processes": ranks.count, "load_seconds": round(loaded.load_seconds, 3),
                                 "versions": versions()})
    print(layers.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {args.out}/layers.csv, decoded.csv, tokens.parquet" + (", tokens_tuned.parquet" if args.lens else "")
          + ", run.json", file=sys.stderr)
    return 0
