"""``layerlens heads stats|parse|importance|view``: what every attention head does (:mod:`analysis.heads`; the
README's "Attention heads" section and ``docs/heads.md`` describe every file written). Each action has its own
flags, the model flags included (``layerlens heads stats --model M ...``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli.common import (
    StageBars,
    UserError,
    model_options,
    nonnegative_int,
    positive_int,
    prepare_out,
    spec_from_args,
    versions,
    write_json,
)

OUTPUTS = {"stats": "heads.csv, clusters.csv, run.json",
           "parse": "relations.csv, head_accuracies.csv, uuas.csv, run.json",
           "importance": "importance.csv, pruning.csv, run.json",
           "view": "attention.npz, run.json (attention.csv with --layer)"}
TREEBANK = (".conllu", ".conllu.gz")  # analysis.core.dataroots.TREEBANK_SUFFIXES (the parser stays light)
INTERVALS = {"heads.csv": "95% Student t interval over sentence means (sentences are the independent unit)",
             "relations.csv": "95% Wilson score interval of the best head's accuracy over the relation's words",
             "baseline": "the best fixed offset k per relation and direction (the word k positions away), on the "
                         "same words (Clark et al. 2019 §4.2)"}


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

    g = actions["importance"].add_argument_group("data (one of)")
    data = g.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", type=Path, help="a labelled set (.csv, .tsv, .jsonl) scored by --model's own "
                      "sequence-classification head (a fine-tuned classifier with labels)")
    data.add_argument("--input", type=Path, help="texts scored by the MLM loss of --model's own MLM head")
    _corpus_flags(g)
    g.add_argument("--label-column", default="label", help="--data's label column (default: label)")
    g.add_argument("--pair-column", help="--data's second text column, if any")
    g.add_argument("--steps", type=positive_int, default=10, help="points of the pruning curve after 0%% (default "
                   "10: every 10%% of the heads)")
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


def _run_info(args, loaded, info: dict, **extra) -> dict:
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
               if k not in ("func", "command", "action", "model", "revision", "device", "dtype", "allow_pickle",
                            "head_from", "out")}
    return {"action": args.action, "model": loaded.spec.name, "model_spec": loaded.spec.to_dict(),
            "options": options, **info, **extra, "load_seconds": round(loaded.load_seconds, 3),
            "versions": versions()}


def _eager(args):
    from analysis.heads.model import load_eager

    return load_eager(spec_from_args(args))


def _corpus(path: Path, column: str, limit: int | None):
    from analysis.core.inputs import read_file
    from analysis.core.treebank import read_conllu

    if not path.is_file():
        raise UserError(f"--input {path}: no such file (texts or a CoNLL-U treebank)")
    if path.name.lower().endswith(TREEBANK):
        return read_conllu(path, limit)
    return read_file(path, column, limit=limit)


def _notes(info: dict) -> None:
    if info.get("truncated"):
        print(f"note: {info['truncated']} text(s) cut to the model's limit", file=sys.stderr)
    if info.get("dropped_too_long") or info.get("dropped_no_subword"):
        print(f"note: left out {info['dropped_too_long']} sentence(s) over the model's limit and "
              f"{info['dropped_no_subword']} with a word without subwords", file=sys.stderr)


def _cmd_stats(args: argparse.Namespace) -> int:
    from analysis.core.csvout import to_csv
    from analysis.heads.run import analyse

    source = _corpus(args.input, args.column, args.limit)
    loaded = _eager(args)
    with StageBars() as bars:
        result = analyse(loaded, source, parse=False, clusters=not args.no_clusters, batch_size=args.batch_size,
                         cluster_tokens=args.cluster_tokens, seed=args.seed, progress=bars)
    out = prepare_out(args.out)
    to_csv(result.heads, out / "heads.csv")
    if result.clusters is not None:
        to_csv(result.clusters, out / "clusters.csv")
    write_json(out, "run.json", _run_info(args, loaded, result.info, input=str(args.input),
                                          intervals={"heads.csv": INTERVALS["heads.csv"]}))
    _notes(result.info)
    shown = ["layer", "head", "entropy", "cls", "sep", "punct", "self", "previous", "next", "distance"]
    print(result.heads[shown].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"wrote {args.out}: heads.csv" + (", clusters.csv" if result.clusters is not None else "") + ", run.json",
          file=sys.stderr)
    return 0


def _cmd_parse(args: argparse.Namespace) -> int:
    from analysis.core.csvout import to_csv
    from analysis.core.treebank import read_conllu
    from analysis.heads.run import analyse

    if not args.treebank.is_file():
        raise UserError(f"--treebank {args.treebank}: no such file (give a CoNLL-U treebank, .conllu or .conllu.gz)")
    treebank = read_conllu(args.treebank, args.limit)
    wanted = [r.strip() for r in args.relations.split(",") if r.strip()] if args.relations else None
    loaded = _eager(args)
    with StageBars() as bars:
        result = analyse(loaded, treebank, statistics=False, clusters=False, relations=wanted,
                         batch_size=args.batch_size, progress=bars)
    out = prepare_out(args.out)
    to_csv(result.relations, out / "relations.csv")
    to_csv(result.accuracies, out / "head_accuracies.csv")
    to_csv(result.uuas, out / "uuas.csv")
    best = result.uuas.sort_values("uuas", ascending=False).iloc[0]
    write_json(out, "run.json", _run_info(args, loaded, result.info, treebank=str(args.treebank),
                                          intervals={"relations.csv": INTERVALS["relations.csv"]},
                                          baseline=INTERVALS["baseline"],
                                          best_tree={"layer": int(best.layer), "head": int(best["head"]),
                                                     "uuas": float(best.uuas)}))
    _notes(result.info)
    print(result.relations.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"best attention tree: layer {int(best.layer)} head {int(best['head'])}, UUAS {best.uuas:.3f}",
          file=sys.stderr)
    print(f"wrote {args.out}: {OUTPUTS['parse']}", file=sys.stderr)
    return 0


def _cmd_importance(args: argparse.Namespace) -> int:
    from analysis.core.csvout import to_csv
    from analysis.heads import importance as imp

    if not 0 < args.mask_prob < 1:
        raise UserError(f"--mask-prob must be between 0 and 1, got {args.mask_prob}")
    path = args.data or args.input
    if not path.is_file():
        raise UserError(f"--{'data' if args.data else 'input'} {path}: no such file")
    from analysis.core.inputs import read_file

    options = {"steps": args.steps, "drop": args.drop}
    with StageBars() as bars:
        if args.input is not None:
            from models.loading import load_model

            texts = read_file(path, args.column, limit=args.limit)
            loaded = load_model(spec_from_args(args))
            result = imp.mlm_importance(loaded, texts, batch_size=args.batch_size, mask_prob=args.mask_prob,
                                        seed=args.seed, progress=bars, **options)
            loss, name = "MLM cross-entropy at masked tokens; accuracy: MLM token accuracy", loaded.spec.name
        else:
            from analysis.core.activations import max_input_length
            from models.loading import load_as_saved, load_model

            loaded = load_model(spec_from_args(args, "cpu"))  # the tokenizer, the limit, the spec's checks
            model, _ = load_as_saved(loaded.spec, loaded.spec.dtype)
            labels = imp.classifier_labels(model, f"'{loaded.spec.name}'")
            data = read_file(path, args.column, args.pair_column, args.limit, label_column=args.label_column)
            batches = imp.classifier_batches(loaded.tokenizer, data, labels, max_input_length(loaded),
                                             args.batch_size)
            result = imp.head_importance(model, batches, progress=bars, **options)
            loss, name = "the classifier's cross-entropy; accuracy: classification accuracy", loaded.spec.name
    out = prepare_out(args.out)
    to_csv(result.importance, out / "importance.csv")
    to_csv(result.pruning, out / "pruning.csv")
    write_json(out, "run.json", _run_info(args, loaded, result.info, loss=loss,
                                          random_orders="3 seeded random permutations of all heads (seeds 0, 1, 2)"))
    print(result.importance.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    mine = result.pruning[result.pruning.order == "importance"]
    print(f"{name}: base accuracy {result.info['base_accuracy']:.4f}; with half the heads masked (least important "
          f"first) {_at(mine, 0.5):.4f}", file=sys.stderr)
    print(f"wrote {args.out}: {OUTPUTS['importance']}", file=sys.stderr)
    return 0


def _at(curve, fraction: float) -> float:
    row = curve.iloc[(curve["fraction"] - fraction).abs().argsort().iloc[0]]
    return float(row["accuracy"])


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
        from cli.compare import model_spec

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
    write_json(out, "run.json", _run_info(args, loaded, view.info(), **extra))
    print(" ".join(view.tokens))
    print(f"{view.layers} layers x {view.heads} heads x {len(view.tokens)} x {len(view.tokens)} tokens; wrote "
          f"{args.out}: attention.npz" + (", attention.csv" if args.layer is not None else "") + ", run.json",
          file=sys.stderr)
    return 0
