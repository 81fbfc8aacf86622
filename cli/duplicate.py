"""``layerlens duplicate``: a deeper model made of the pre-trained layers (Kao et al. 2020 §3), measured
or exported."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.core.csvout import to_csv
from cli.common import (
    UserError,
    positive_int,
    prepare_out,
    spec_from_args,
)
from models.spec import DTYPE_NAMES

SAVE_DTYPES = ["source", *(d for d in DTYPE_NAMES if d != "auto")]


def add_duplicate_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("duplication")
    plan = g.add_mutually_exclusive_group()
    plan.add_argument("--duplicate-first", type=int, metavar="K",
                      help="the paper's plan: copy each of the first K layers right after itself (L -> L + K)")
    plan.add_argument("--plan", help="0-based source layer of each new layer, e.g. 0,0,1,1,2,2,3,4,5")
    plan.add_argument("--depth", type=positive_int, help="ALBERT: apply the shared layer this many times")
    g.add_argument("--preview-input", type=Path, help="texts to probe the deeper model on (writes preview/)")
    g.add_argument("--column", default="text", help="text column of --preview-input (csv/tsv/jsonl)")
    g.add_argument("--sweep", action="store_true", help="final-layer accuracy for K = 0..L duplicated layers on "
                   "--preview-input (writes sweep.csv)")
    g.add_argument("--save-dtype", choices=SAVE_DTYPES, default="source", help="dtype of the saved model "
                   "(default: the source checkpoint's own, whatever --dtype it is computed in; in duplication.json)")


def cmd_duplicate(args: argparse.Namespace) -> int:
    """Layer duplication: export a deeper model (and probe it) without training."""
    from analysis.compare.duplication import sweep
    from analysis.core.inputs import read_file
    from analysis.duplication.export import export, loads_with
    from analysis.duplication.plan import check_depth, duplicate_first, parse_plan, preview
    from analysis.probe.reconstruction import probe
    from models.loading import config_and_family, load_model

    if args.out is None:
        raise UserError("--out DIR is required: the deeper model is saved there")
    if args.sweep and args.preview_input is None:
        raise UserError("--sweep needs --preview-input (the texts to probe)")
    inputs = read_file(args.preview_input, args.column) if args.preview_input else None
    spec = spec_from_args(args)
    config, family = config_and_family(spec)  # the plan is checked before the weights are loaded
    albert, layers = family == "albert", config.num_hidden_layers
    if args.depth is not None:
        if not albert:
            raise UserError("--depth is for ALBERT (one shared layer); use --duplicate-first or --plan")
        plan = [0] * check_depth(args.depth, layers)
    elif args.plan is not None:
        if albert:
            raise UserError("ALBERT shares one layer across depth: give --depth N instead of a plan")
        plan = parse_plan(args.plan, layers)
    else:
        plan = duplicate_first(layers, args.duplicate_first or 0)
    loaded = load_model(spec)
    out = prepare_out(args.out)
    export(loaded, plan, out, dtype=None if args.save_dtype == "source" else args.save_dtype)
    print(f"plan ({len(plan)} layers): {','.join(map(str, plan)) if not albert else f'shared x {len(plan)}'}")
    if inputs is not None:
        result = probe(preview(loaded, plan), inputs)
        (out / "preview").mkdir(exist_ok=True)
        to_csv(result.layers, out / "preview" / "layers.csv")
        print(result.layers.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if args.sweep:
        table = sweep(loaded, inputs)
        to_csv(table, out / "sweep.csv")
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {args.out} ({loads_with(out)})", file=sys.stderr)
    return 0
