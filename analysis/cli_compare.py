"""``layerlens compare``: checkpoints layer by layer on the same rows (:mod:`analysis.compare`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.cli_base import (
    StageBars,
    UserError,
    add_option_flag,
    nonnegative_int,
    positive_int,
    prepare_out,
    write_json,
)
from analysis.options import ATLAS_POOLINGS


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models and data")
    g.add_argument("--model", action="append", required=True, metavar="MODEL",
                   help="a checkpoint (hub id, directory, demo, random:NAME); give it twice or more: the first is "
                   "the reference A, each other one is compared with it")
    for name in ("device", "dtype", "allow_pickle"):
        add_option_flag(g, name)
    g.add_argument("--data", type=Path, required=True, help="rows: .txt, .csv, .tsv or .jsonl (labels optional)")
    g.add_argument("--text-column", default="text", help="column holding the texts (default: text)")
    g.add_argument("--pair-column", help="column holding the second text of a pair")
    g.add_argument("--label-column", default="label", help="column holding the class labels, if any (default: "
                   "label; without it the probe columns are left out)")
    g.add_argument("--pooling", choices=ATLAS_POOLINGS, default="cls", help="sentence vector (default cls)")
    g.add_argument("--max-length", type=positive_int, help="cut texts to this many tokens (default: the limit)")
    g.add_argument("--batch-size", type=positive_int, default=32, help="texts per forward pass (default 32)")
    g.add_argument("--folds", type=positive_int, default=5, help="folds of the linear probe (default 5)")
    g.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the folds and the bootstrap")
    g.add_argument("--bootstrap", type=positive_int, default=200, help="resamples of the CKA interval (default 200)")
    g.add_argument("--debiased", action="store_true", help="debiased CKA (Nguyen et al. 2021) instead of linear CKA "
                   "in layer_summary.csv (it matters for few rows)")
    g.add_argument("--out", type=Path, help="directory for cka_cross.csv, layer_summary.csv, movers.csv, "
                   "coords_aligned.csv, run.json")


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare checkpoints layer by layer."""
    from analysis import versions
    from analysis.compare.run import CompareConfig, compare
    from analysis.csvout import to_csv
    from analysis.inputs import InputError, read_file
    from models.loading import load_model
    from models.spec import ModelSpec

    if args.out is None:
        raise UserError("--out DIR is required: compare writes cka_cross.csv, layer_summary.csv, movers.csv, "
                        "coords_aligned.csv, run.json")
    if len(args.model) < 2:
        raise UserError("give --model at least twice: the reference first, then the checkpoints to compare with it")
    try:
        data = read_file(args.data, args.text_column, args.pair_column, label_column=args.label_column)
    except InputError as exc:  # no label column (or a .txt file): compare without labels, and say so
        if args.label_column not in str(exc) and "label" not in str(exc):
            raise
        data = read_file(args.data, args.text_column, args.pair_column)
        print(f"note: no '{args.label_column}' column: comparing without labels (no probe columns)", file=sys.stderr)
    for note in data.notes():
        print(f"note: {note}", file=sys.stderr)
    models = [load_model(ModelSpec(m, device=args.device, dtype=args.dtype, allow_pickle=args.allow_pickle))
              for m in args.model]
    config = CompareConfig(pooling=args.pooling, max_length=args.max_length, batch_size=args.batch_size,
                           folds=args.folds, seed=args.seed, boot=args.bootstrap, debiased=args.debiased)
    out = prepare_out(args.out)
    with StageBars() as progress:
        result = compare(models, data, config, progress)
    to_csv(result.cka_cross, out / "cka_cross.csv")
    to_csv(result.layer_summary, out / "layer_summary.csv")
    to_csv(result.movers, out / "movers.csv")
    to_csv(result.coords, out / "coords_aligned.csv")
    write_json(out, "run.json", {**result.info, "versions": versions()})
    s = result.layer_summary
    for name, part in s.groupby("model_b", sort=False):
        print(f"{result.info['models'][0]} vs {name}")
        print(part.drop(columns=["model_a", "model_b"]).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {args.out}/cka_cross.csv, layer_summary.csv, movers.csv, coords_aligned.csv, run.json",
          file=sys.stderr)
    return 0
