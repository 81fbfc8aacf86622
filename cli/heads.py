"""``layerlens heads stats|parse|importance|view``: what every attention head does (:mod:`analysis.heads`; the
README's "Attention heads" section and ``docs/heads.md`` describe every file written). Each action has its own
flags, the model flags included (``layerlens heads stats --model M ...``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.core.task import RunRecord
from analysis.heads.options import MIN_COUNT, READINGS, SYMMETRIES
from cli.common import (
    StageBars,
    UserError,
    model_options,
    model_spec,
    nonnegative_int,
    positive_int,
    prepare_out,
    spec_from_args,
    versions,
)

OUTPUTS = {"stats": "heads.csv, clusters.csv, run.json",
           "parse": "relations.csv, head_accuracies.csv, uuas.csv, run.json",
           "importance": "importance.csv, pruning.csv, run.json",
           "view": "attention.npz, run.json (attention.csv with --layer)"}


def add_heads_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    helps = {"stats": "per-head statistics over a corpus (Clark et al. 2019 §3) and the head map (§6)",
             "parse": "heads as dependency parsers on a UD treebank (Clark §4.2) and their attention trees' UUAS",
             "importance": "head importance and the pruning curve (Michel et al. 2019)",
             "view": "one sentence's attention, every layer and head (bertviz's head view as arrays)"}
    actions = {name: sub.add_parser(name, parents=[model_options()], help=text, description=text)
               for name, text in helps.items()}

    g = actions["stats"].add_argument_group("corpus")
    g.add_argument("--input", type=Path, required=True, help="texts (.txt one per line, .csv, .tsv, .jsonl) or a "
                   "CoNLL-U treebank (.conllu, .conllu.gz)")
    _corpus_flags(g)
    g.add_argument("--no-clusters", action="store_true", help="skip the head map (clusters.csv)")
    g.add_argument("--cluster-tokens", type=positive_int, default=2048, help="attending tokens sampled for the "
                   "head map's Jensen-Shannon distances (default 2048)")
    g.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the head map's sample and MDS")

    g = actions["parse"].add_argument_group("treebank")
    g.add_argument("--treebank", type=Path, required=True, help="a CoNLL-U treebank (.conllu, .conllu.gz)")
    g.add_argument("--limit", type=positive_int, help="read at most this many sentences (the first)")
    g.add_argument("--relations", help="comma-separated relations to score (default: every one in the treebank)")
    g.add_argument("--reading", choices=READINGS, default="clark", help="head -> dependent: clark (the word "
                   "attending most to the dependent is its head, Clark et al.'s transposed map) or row (the head "
                   "word's own most-attended word is the dependent) (default clark)")
    g.add_argument("--tree", choices=SYMMETRIES, default="sum", help="attention trees over W + W^T (sum, Clark's "
                   "'both') or max(W, W^T) (default sum)")
    g.add_argument("--min-count", type=positive_int, default=MIN_COUNT, help="words a relation needs in each split "
                   f"(selection, held-out) to be reported (default {MIN_COUNT})")

    g = actions["importance"].add_argument_group("data (one of)")
    data = g.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", type=Path, help="a labelled set (.csv, .tsv, .jsonl) scored by --model's own "
                      "sequence-classification head (a fine-tuned classifier with labels), or with --model job:N by "
                      "that fine-tuning job's classifier")
    data.add_argument("--input", type=Path, help="texts scored by the MLM loss of --model's own MLM head")
    _corpus_flags(g)
    g.add_argument("--label-column", default="label", help="--data's label column (default: label)")
    g.add_argument("--pair-column", help="--data's second text column, if any")
    g.add_argument("--steps", type=positive_int, default=10, help="points of the pruning curve after 0%% (default "
                   "10: every 10%% of the heads)")
    g.add_argument("--random-orders", type=nonnegative_int, default=3, help="seeded random orders of the heads the "
                   "importance order is compared with (default 3: seeds 0, 1, 2)")
    g.add_argument("--mask-prob", type=float, default=0.15, help="--input: share of each text's tokens masked "
                   "(default 0.15)")
    g.add_argument("--drop", type=float, default=0.01, help="the accuracy drop a layer's prunable share allows "
                   "(default 0.01: 1 point)")
    g.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the MLM masking")

    g = actions["view"].add_argument_group("sentence")
    g.add_argument("--text", required=True, help="the sentence (never cut: over the model's limit is an error)")
    g.add_argument("--layer", type=int, help="also write attention.csv (long form) for this attention layer "
                   "(1-based)")
    g.add_argument("--head", type=int, help="with --layer: only this head (0-based)")
    g.add_argument("--compare", metavar="MODEL", help="a second model with the same tokenizer (a name, random, "
                   "job:N): attention.npz gains attention_compared and difference (second - first)")


def _corpus_flags(g) -> None:
    g.add_argument("--column", default="text", help="text column of a .csv/.tsv/.jsonl (default: text)")
    g.add_argument("--limit", type=positive_int, help="read at most this many texts (sentences)")


def cmd_heads(args: argparse.Namespace) -> int:
    if args.out is None:
        raise UserError(f"--out DIR is required: heads {args.action} writes {OUTPUTS[args.action]}")
    return {"stats": _cmd_stats, "parse": _cmd_parse, "importance": _cmd_importance,
            "view": _cmd_view}[args.action](args)


def _run_info(args, model: dict, info: dict, **extra) -> dict:
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
               if k not in ("func", "command", "action", "model", "revision", "device", "dtype", "allow_pickle",
                            "head_from", "out")}
    load_seconds = model.get("load_seconds")
    return {"action": args.action, "model": model["model"], "model_spec": model["model_spec"],
            "options": options, **info, **extra, "load_seconds": load_seconds, "versions": versions()}


def _eager(args):
    from analysis.heads.model import load_eager

    return load_eager(spec_from_args(args))


def _notes(info: dict) -> None:
    if info.get("truncated"):
        print(f"note: {info['truncated']} text(s) cut to the model's limit", file=sys.stderr)
    if info.get("dropped_too_long") or info.get("dropped_no_subword"):
        print(f"note: left out {info['dropped_too_long']} sentence(s) over the model's limit and "
              f"{info['dropped_no_subword']} with a word without subwords", file=sys.stderr)


def _finish(args, output, **extra) -> None:
    """Write the action's files and run.json (:class:`analysis.heads.actions.Output`), print its table."""
    out = prepare_out(args.out)
    output.write(out)
    RunRecord(f"heads {args.action}", _run_info(args, output.model, output.info, **extra)).write(out)
    _notes(output.info)
    print(output.shown.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


def _cmd_stats(args: argparse.Namespace) -> int:
    from analysis.heads import actions

    source = actions.read_corpus(args.input, args.column, args.limit)
    loaded = _eager(args)
    with StageBars() as bars:
        output = actions.stats(loaded, source, clusters=not args.no_clusters, cluster_tokens=args.cluster_tokens,
                               seed=args.seed, batch_size=args.batch_size, progress=bars)
    _finish(args, output, input=str(args.input))
    print(f"wrote {args.out}: {', '.join(output.files)}, run.json", file=sys.stderr)
    return 0


def _cmd_parse(args: argparse.Namespace) -> int:
    from analysis.heads import actions

    treebank = actions.read_treebank(args.treebank, args.limit)
    wanted = [r.strip() for r in args.relations.split(",") if r.strip()] if args.relations else None
    loaded = _eager(args)
    with StageBars() as bars:
        output = actions.parse(loaded, treebank, wanted, batch_size=args.batch_size, progress=bars,
                               reading=args.reading, symmetry=args.tree, min_count=args.min_count)
    _finish(args, output, treebank=str(args.treebank))
    best = output.info["best_tree"]
    print(f"best attention tree (chosen on the selection split): layer {best['layer']} head {best['head']}, held-out "
          f"UUAS {best['uuas']:.3f} (selection {best['selection_uuas']:.3f})", file=sys.stderr)
    if left := output.info["relations_under_min_count"]:
        print(f"{len(left)} relation(s) with fewer than {args.min_count} words in a split left out: "
              f"{', '.join(list(left)[:8])}{' ...' if len(left) > 8 else ''}", file=sys.stderr)
    print(f"wrote {args.out}: {OUTPUTS['parse']}", file=sys.stderr)
    return 0


def _cmd_importance(args: argparse.Namespace) -> int:
    from analysis.heads import actions

    if not 0 < args.mask_prob < 1:
        raise UserError(f"--mask-prob must be between 0 and 1, got {args.mask_prob}")
    path = args.data or args.input
    if not path.is_file():
        raise UserError(f"--{'data' if args.data else 'input'} {path}: no such file")
    from analysis.compare.modelref import is_job

    with StageBars() as bars:
        if is_job(args.model):
            output, name = _job_importance(args, bars)
        else:  # the data's classifier is read on the CPU (actions.importance)
            output = actions.importance(spec_from_args(args), texts=args.input, data=args.data, column=args.column,
                                        label_column=args.label_column, pair_column=args.pair_column,
                                        limit=args.limit, batch_size=args.batch_size, mask_prob=args.mask_prob,
                                        seed=args.seed, steps=args.steps, drop=args.drop, progress=bars,
                                        random_orders=args.random_orders)
            name = output.model["model"]
    _finish(args, output)
    print(f"{name}: base accuracy {output.info['base_accuracy']:.4f}; with half the heads masked "
          f"(least important first) {actions.at_fraction(output.files['pruning.csv'], 0.5):.4f}", file=sys.stderr)
    print(f"wrote {args.out}: {OUTPUTS['importance']}", file=sys.stderr)
    return 0


def _job_importance(args: argparse.Namespace, bars):
    """``--model job:N``: with ``--data``, the job's own classifier (its pooling head on its fine-tuned encoder,
    :func:`analysis.training.finetune.load_checkpoint`) scored on the labelled set; with ``--input``, the fine-tuned
    encoder read by the MLM head it started from (the one resolver, :mod:`analysis.compare.modelref`). Returns the
    action's :class:`analysis.heads.actions.Output` and the job's label."""
    from analysis.core.inputs import read_file
    from analysis.heads import actions

    spec, label = model_spec(args.model, args.model, None, args)
    options = {"steps": args.steps, "drop": args.drop, "progress": bars}
    if args.input is not None:
        return actions.importance(spec, texts=args.input, column=args.column, limit=args.limit,
                                  batch_size=args.batch_size, mask_prob=args.mask_prob, seed=args.seed,
                                  random_orders=args.random_orders, **options), label
    options["seeds"] = tuple(range(args.random_orders))
    from analysis.tasks.recipes import job_classifier_importance

    checkpoint = Path(spec.name).parent
    data = read_file(args.data, args.column, args.pair_column, args.limit, label_column=args.label_column)
    result = job_classifier_importance(checkpoint, data, f"{args.model} ({label})", batch_size=args.batch_size,
                                       **options)
    return actions.importance_output(result, actions.LOSSES["job"], {
        "model": label, "model_spec": {"job": args.model, "checkpoint": str(checkpoint)}, "load_seconds": None}), label


def _cmd_view(args: argparse.Namespace) -> int:
    import dataclasses

    import numpy as np
    import pandas as pd

    from analysis.core.csvout import to_csv
    from analysis.heads.view import compare_views, head_rows, head_view

    if args.head is not None and args.layer is None:
        raise UserError("--head needs --layer (the head's attention layer, 1-based)")
    loaded = _eager(args)
    if args.layer is not None:
        from analysis.heads.model import check_head

        check_head(loaded.model, args.layer, args.head or 0)
    arrays, extra = {}, {}
    if args.compare:
        from analysis.heads.model import load_eager

        spec, label = model_spec(args.compare, loaded.spec.name, None, args)
        other = load_eager(dataclasses.replace(spec, head_from=None))  # attention needs no MLM head
        both = compare_views(loaded, other, args.text)
        view = both.a
        arrays = {"attention_compared": both.b.attention, "difference": both.difference}
        extra = {"compared": {"ref": args.compare, "model": spec.name, "label": label}}
    else:
        view = head_view(loaded, args.text)
    out = prepare_out(args.out)
    np.savez_compressed(out / "attention.npz", attention=view.attention, ids=np.asarray(view.ids),
                        tokens=np.asarray(view.tokens, dtype=str), **arrays)
    if args.layer is not None:
        to_csv(pd.DataFrame(head_rows(view, args.layer, args.head)), out / "attention.csv")
    from analysis.heads.actions import model_facts

    RunRecord("heads view", _run_info(args, model_facts(loaded), view.info(), **extra)).write(out)
    print(" ".join(view.tokens))
    print(f"{view.layers} layers x {view.heads} heads x {len(view.tokens)} x {len(view.tokens)} tokens; wrote "
          f"{args.out}: attention.npz" + (", attention.csv" if args.layer is not None else "") + ", run.json",
          file=sys.stderr)
    return 0
