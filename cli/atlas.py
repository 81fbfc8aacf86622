"""``layerlens atlas``: per-layer sentence maps, separability and CKA of a labelled set."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.atlas.options import ATLAS_FLAGS, AtlasConfig
from analysis.core.csvout import to_csv
from analysis.core.inputs import check_row_limit
from cli.common import (
    StageBars,
    UserError,
    add_option_flag,
    launched,
    positive_int,
    prepare_out,
    processes_note,
    versions,
    write_json,
)


def add_atlas_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("atlas")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", type=Path, help="labelled rows: .csv, .tsv or .jsonl")
    src.add_argument("--hf-dataset", metavar="NAME[/CONFIG]",
                     help="a Hugging Face dataset instead of a file, e.g. glue/sst2 (needs a network or the cache)")
    g.add_argument("--split", default="validation", help="with --hf-dataset: the split (default validation)")
    g.add_argument("--text-column", default="text", help="column holding the texts (default: text)")
    g.add_argument("--pair-column", help="column holding the second text of a pair (aspect, hypothesis)")
    g.add_argument("--label-column", default="label", help="column holding the class labels (default: label)")
    for name in ATLAS_FLAGS:  # from the schema: default, choices, help; its checks run in cmd_atlas
        add_option_flag(g, name, schema=AtlasConfig)
    g.add_argument("--sample", type=positive_int, help="use a random sample of this many rows")
    g.add_argument("--max-rows", type=positive_int, help="refuse more rows than this (default: the pages' limit, "
                   "LAYERLENS_ATLAS_MAX_ROWS or 20,000)")


def cmd_atlas(args: argparse.Namespace) -> int:
    """Layer atlas: per-layer sentence vectors in 2-D, separability per layer, layer x layer CKA."""
    from analysis.atlas.atlas import atlas
    from analysis.core.inputs import from_hub_dataset, max_rows, read_file
    from analysis.core.layers import layers_note, parse_layers
    from models.loading import load_model

    if args.out is None:
        raise UserError("--out DIR is required: the atlas writes coords.csv, separability.csv, cka.csv, run.json")
    config = AtlasConfig(batch_size=args.batch_size, **{name: getattr(args, name) for name in ATLAS_FLAGS})
    if args.data is not None:
        data = read_file(args.data, args.text_column, args.pair_column, label_column=args.label_column)
    else:
        name, _, subset = args.hf_dataset.partition("/")
        data = from_hub_dataset(name, subset or None, args.split, args.text_column, args.pair_column,
                                args.label_column)
    ranks, spec = launched(args)
    for note in data.notes() if ranks.is_main else ():
        print(f"note: {note}", file=sys.stderr)
    if args.sample:
        if args.sample < len(data) and ranks.is_main:
            print(f"note: using a random sample of {args.sample:,} of {len(data):,} rows (seed {config.seed})",
                  file=sys.stderr)
        data = data.sample(args.sample, config.seed)
    check_row_limit(data, args.max_rows or max_rows(), "atlas'", sample=True)
    loaded = load_model(spec)
    parse_layers(args.layers, loaded.num_layers + 1)  # a bad --layers is said before any work
    if not ranks.is_main:  # a helper process: its share of the extraction; the main process does the rest
        atlas(loaded, data, config, ranks=ranks, row_limit=args.max_rows)
        return 0
    out = prepare_out(args.out)
    with StageBars(processes_note(ranks)) as progress:
        result = atlas(loaded, data, config, progress=progress, ranks=ranks, row_limit=args.max_rows)
    if note := layers_note(args.layers, loaded.num_layers + 1):
        print(f"note: {note}", file=sys.stderr)
    to_csv(result.coords, out / "coords.csv")
    to_csv(result.separability, out / "separability.csv")
    to_csv(result.cka_frame(), out / "cka.csv", index=True)
    source = str(args.data) if args.data is not None else f"hf:{args.hf_dataset}:{args.split}"
    write_json(out, "run.json", {**result.info, "data": source, "text_column": args.text_column,
                                 "pair_column": args.pair_column, "label_column": args.label_column,
                                 "model_spec": loaded.spec.to_dict(), "processes": ranks.count,
                                 "versions": versions()})
    print(result.separability.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {args.out}/coords.csv, separability.csv, cka.csv, run.json", file=sys.stderr)
    return 0
