"""``python -m analysis``: one sub-command per analysis, sharing the model options.

Errors end the program with one readable line on stderr and a non-zero exit status (2 for bad input,
1 for anything unexpected); set ``LAYERLENS_DEBUG=1`` for the full traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from analysis.cli_base import (
    Parser,
    StageBars,
    UserError,
    finish_outputs,
    launched,
    model_options,
    nonnegative_int,
    positive_int,
    prepare_out,
    processes_note,
    spec_from_args,
    versions,
    write_json,
)
from analysis.cli_compare import add_compare_arguments, cmd_compare
from analysis.cli_finetune import (
    add_finetune_arguments,
    add_jobs_arguments,
    cmd_finetune,
    cmd_jobs,
)
from analysis.cli_lens import add_lens_arguments, cmd_lens
from analysis.cli_structure import add_structure_arguments, cmd_structure
from analysis.cli_tokens import add_tokens_arguments, cmd_tokens
from analysis.core.csvout import to_csv
from analysis.core.inputs import PROBE_ROW_LIMIT, InputError, check_row_limit
from analysis.core.parallel import is_main_process
from analysis.core.projection import METHODS
from analysis.core.vectors import POOLINGS
from analysis.options import COLOR_BY
from jobs.store import StoreError
from models.spec import DTYPE_NAMES, ModelLoadError

SAVE_DTYPES = ["source", *(d for d in DTYPE_NAMES if d != "auto")]

log = logging.getLogger("layerlens")


def cmd_info(args: argparse.Namespace) -> int:
    """Load the model and describe it: family, layers, sizes, where it runs."""
    from models.loading import load_model

    summary = load_model(spec_from_args(args)).summary()
    width = max(map(len, summary))
    for key, value in summary.items():
        print(f"{key:<{width}}  {value}")
    if write_json(prepare_out(args.out) if args.out else None, "info.json", summary):
        print(f"wrote {args.out}/info.json", file=sys.stderr)
    return 0


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("probe")
    g.add_argument("--input", type=Path, required=True, help="texts: .txt (one per line), .csv, .tsv or .jsonl")
    g.add_argument("--column", default="text", help="column holding the texts (csv/tsv/jsonl; default: text)")
    g.add_argument("--pair-column", help="column holding the second text of a pair (e.g. text_pair, aspect)")
    g.add_argument("--mode", choices=["unmasked", "masked"], default="unmasked",
                   help="unmasked: the input as is (Kao et al.); masked: every token masked once, 15%% at a time")
    g.add_argument("--include-special", action="store_true", help="also count [CLS], [SEP] and other specials")
    g.add_argument("--top-k", type=positive_int, default=5, help="predictions kept per token (default 5)")
    g.add_argument("--max-length", type=positive_int, help="cut texts to this many tokens (default: the model's limit)")
    g.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the masked mode's random groups")
    g.add_argument("--precision", choices=["float32", "certified"], default="float32",
                   help="the MLM head's vocabulary product: float32 (default), or certified: bf16 on a machine with "
                   "bf16 units, each row certified equal to float32 or recomputed (identical tables; run.json "
                   "says what ran). --dtype bfloat16 is the approximate mode, checked against float32 on a sample")
    g.add_argument("--max-rows", type=positive_int, default=PROBE_ROW_LIMIT, help="refuse inputs with more texts "
                   f"than this (default {PROBE_ROW_LIMIT:,}, the pages' limit)")
    g.add_argument("--lens", type=Path, metavar="DIR", help="also read the layers through this tuned lens (`lens "
                   "train`): layers.csv and decoded.csv gain a lens column (raw/tuned) and every row kl_to_final "
                   "and agreement; the tuned per-token rows go to tokens_tuned.parquet")


def cmd_probe(args: argparse.Namespace) -> int:
    """Reconstruction probe: every layer through the model's own MLM head."""
    import pandas as pd

    from analysis.core.inputs import read_file
    from analysis.probe.reconstruction import ProbeConfig, probe, require_mlm_head
    from analysis.probe.token_sink import TokenSink
    from models.loading import load_model

    if args.out is None:
        raise UserError("--out DIR is required: the probe writes layers.csv, decoded.csv, tokens.parquet, run.json")
    ranks, spec = launched(args)
    inputs = check_row_limit(read_file(args.input, args.column, args.pair_column), args.max_rows, "probe's")
    for note in inputs.notes() if ranks.is_main else ():
        print(f"note: {note}", file=sys.stderr)
    try:
        config = ProbeConfig(mode=args.mode, include_special=args.include_special, top_k=args.top_k,
                             batch_size=args.batch_size, max_length=args.max_length, seed=args.seed,
                             precision=args.precision)
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
            results[name] = probe(loaded, inputs, config, sink=TokenSink(loaded.tokenizer, config.top_k, out / tokens),
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
    g.add_argument("--pooling", choices=POOLINGS, default="cls",
                   help="cls: first token (default); mean: mean of counted tokens")
    g.add_argument("--method", choices=METHODS, default="pca", help="2-D projection (default pca)")
    g.add_argument("--color-by", choices=COLOR_BY, default="label", help="a classifier checkpoint can also colour "
                   "its points by its own prediction or by whether it is correct (coords.csv gains prediction, "
                   "probability, correct)")
    g.add_argument("--layers", default="-6:", help="hidden states to project: all, a slice (default -6:) or 0,4,8")
    g.add_argument("--max-length", type=positive_int, help="cut texts to this many tokens (default: the model's limit)")
    g.add_argument("--folds", type=positive_int, default=5, help="folds of the linear probe (default 5)")
    g.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the folds, the projection and any sample")
    g.add_argument("--sample", type=positive_int, help="use a random sample of this many rows")
    g.add_argument("--max-rows", type=positive_int, help="refuse more rows than this (default: the pages' limit, "
                   "LAYERLENS_ATLAS_MAX_ROWS or 20,000)")


def cmd_atlas(args: argparse.Namespace) -> int:
    """Layer atlas: per-layer sentence vectors in 2-D, separability per layer, layer x layer CKA."""
    from analysis.atlas.atlas import AtlasConfig, atlas
    from analysis.core.inputs import from_hub_dataset, max_rows, read_file
    from analysis.core.layers import layers_note, parse_layers
    from models.loading import load_model

    if args.out is None:
        raise UserError("--out DIR is required: the atlas writes coords.csv, separability.csv, cka.csv, run.json")
    config = AtlasConfig(pooling=args.pooling, method=args.method, layers=args.layers, max_length=args.max_length,
                         batch_size=args.batch_size, folds=args.folds, seed=args.seed, color_by=args.color_by)
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
            print(f"note: using a random sample of {args.sample:,} of {len(data):,} rows (seed {args.seed})",
                  file=sys.stderr)
        data = data.sample(args.sample, args.seed)
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
    from models.loading import _config_and_family, load_model

    if args.out is None:
        raise UserError("--out DIR is required: the deeper model is saved there")
    if args.sweep and args.preview_input is None:
        raise UserError("--sweep needs --preview-input (the texts to probe)")
    inputs = read_file(args.preview_input, args.column) if args.preview_input else None
    spec = spec_from_args(args)
    config, family = _config_and_family(spec)  # the plan is checked before the weights are loaded
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


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str, Callable[[argparse.ArgumentParser], None]]] = {
    "info": (cmd_info, "describe a model: family, layers, hidden size, vocabulary, device, bytes (writes info.json)",
             lambda p: None),
    "probe": (cmd_probe, "reconstruction probe: how well each layer, fed to the MLM head, reconstructs the input",
              add_probe_arguments),
    "atlas": (cmd_atlas, "layer atlas: per-layer sentence vectors in 2-D by class, separability and CKA per layer",
              add_atlas_arguments),
    "finetune": (cmd_finetune, "fine-tune a layer-pooling classifier head and the encoder on labelled data",
                 add_finetune_arguments),
    "duplicate": (cmd_duplicate, "layer duplication: a deeper model from the pre-trained layers, without training",
                  add_duplicate_arguments),
    "jobs": (cmd_jobs, "background fine-tuning jobs: submit, list, show, cancel, logs", add_jobs_arguments),
    "structure": (cmd_structure, "linguistic structure per layer: UPOS and relation probes with control tasks, MDL, "
                  "structural probes on UD treebanks", add_structure_arguments),
    "compare": (cmd_compare, "compare checkpoints layer by layer on the same rows: CKA, probe accuracy, the examples "
                "that moved most, aligned maps", add_compare_arguments),
    "tokens": (cmd_tokens, "token vectors of a corpus per layer on disk, nearest tokens per layer, each layer's "
               "geometry (extract | index | neighbours | geometry)", add_tokens_arguments),
    "lens": (cmd_lens, "tuned lens: train per-layer translators read by the MLM head (probe --lens uses them)",
             add_lens_arguments),
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="layerlens",
        description="LayerLens: look inside BERT-family masked language models layer by layer.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parent = model_options()
    for name, (func, help_text, add_arguments) in COMMANDS.items():
        parents = [] if name in ("jobs", "finetune", "compare") else [parent]  # their models are their own options
        p = sub.add_parser(name, parents=parents, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    if args.command != "jobs":  # the jobs commands only read the job store: no torch, no transformers
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # retries while offline; the error says it
    signal.signal(signal.SIGTERM, _terminated)  # like Ctrl-C: outputs are cleaned up, then exit
    ok = False
    try:
        code = args.func(args)
        ok = code == 0
        return code
    except (ModelLoadError, UserError, InputError, StoreError) as exc:  # StoreError: read-only, damaged
        if is_main_process():  # under a launcher every process meets the same bad input: say it once
            print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head & co.
        return 0
    except Exception as exc:  # the CLI never ends in a traceback unless asked to
        if os.environ.get("LAYERLENS_DEBUG"):
            raise
        print(f"error: unexpected {type(exc).__name__}: {exc} (set LAYERLENS_DEBUG=1 for details)", file=sys.stderr)
        return 1
    finally:
        finish_outputs(ok)  # a staged --out is renamed into place only after a complete run


def _terminated(signum, frame):
    raise KeyboardInterrupt
