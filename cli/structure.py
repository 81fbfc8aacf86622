"""``python -m analysis structure``: what each layer knows about linguistic structure (:mod:`analysis.structure`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli.common import (
    StageBars,
    UserError,
    add_option_flag,
    launched,
    prepare_out,
    processes_note,
)

OUTPUTS = "probes.csv, mdl.csv, summary.csv, trees.jsonl, run.json"


def add_structure_arguments(p: argparse.ArgumentParser) -> None:
    from analysis.structure.options import DEFAULT_TEST, DEFAULT_TRAIN, StructureOptions

    g = p.add_argument_group("linguistic structure (CoNLL-U treebanks, .conllu or .conllu.gz)")
    g.add_argument("--train", type=Path, default=DEFAULT_TRAIN, help="treebank the probes are trained on "
                   "(default: UD English-EWT dev under ../shared/data/ud_english_ewt)")
    g.add_argument("--test", type=Path, default=DEFAULT_TEST, help="treebank the probes are scored on (default: "
                   "UD English-EWT test)")
    g.add_argument("--label-data", type=Path, help="a labelled set of texts (.csv, .tsv, .jsonl, as the atlas "
                   "reads): its task label becomes one more task, 'label', probed per layer as the atlas does, so "
                   "the summary says where it peaks beside POS and syntax")
    g.add_argument("--text-column", default="text", help="--label-data's text column (default: text)")
    g.add_argument("--pair-column", help="--label-data's second text column, if any (text pairs)")
    g.add_argument("--label-column", default="label", help="--label-data's label column (default: label)")
    g.add_argument("--label-pooling", choices=("cls", "mean"), default="cls", help="--label-data's sentence "
                   "vector (default cls, the atlas's)")
    for name in StructureOptions.model_fields:
        if name != "batch_size":  # --batch-size is the model group's (every command's)
            add_option_flag(g, name, schema=StructureOptions)


def structure_options(args: argparse.Namespace):
    from analysis.structure.options import StructureOptions

    return StructureOptions(**{k: v for k, v in vars(args).items() if k in StructureOptions.model_fields})


def cmd_structure(args: argparse.Namespace) -> int:
    """Label probes with control tasks, MDL and structural probes per layer, on UD treebanks."""
    from analysis.core.treebank import read_conllu
    from analysis.structure.output import run_info, write_outputs
    from analysis.structure.run import run_structure
    from models.loading import load_model

    if args.out is None:
        raise UserError(f"--out DIR is required: the analysis writes {OUTPUTS}")
    options = structure_options(args)
    for name in ("train", "test"):
        path = getattr(args, name)
        if not path.is_file():
            raise UserError(f"--{name} {path}: no such file (give a CoNLL-U treebank, .conllu or .conllu.gz)")
    train = read_conllu(args.train, options.max_sentences)
    test = read_conllu(args.test, options.max_sentences)
    labelled = None
    if args.label_data is not None:
        from analysis.core.inputs import read_file

        labelled = read_file(args.label_data, args.text_column, args.pair_column, label_column=args.label_column)
    ranks, spec = launched(args)
    loaded = load_model(spec)
    extra = {"labelled": labelled, "label_pooling": args.label_pooling}
    if not ranks.is_main:  # a helper process: its share of the word vectors; the main process does the rest
        run_structure(loaded, train, test, options, ranks=ranks, **extra)
        return 0
    out = prepare_out(args.out)
    with StageBars(processes_note(ranks)) as progress:
        result = run_structure(loaded, train, test, options, progress=progress, ranks=ranks, **extra)
    write_outputs(result, out, run_info(result, loaded, ranks.count, args.label_data))
    for name, info in (("train", result.info["train"]), ("test", result.info["test"])):
        dropped = info["dropped_too_long"] + info["dropped_no_subword"]
        if dropped:
            print(f"note: {name}: dropped {info['dropped_too_long']} sentence(s) longer than the model's "
                  f"{result.info['max_tokens']} tokens (special tokens included) and {info['dropped_no_subword']} "
                  f"with a word that has no subword, of {info['sentences']} (ids in run.json)", file=sys.stderr)
    print(f"word vector: {result.info['word_vector_text']}", file=sys.stderr)
    print(f"summary intervals: {result.info['summary_interval']}", file=sys.stderr)
    print(result.summary.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {args.out}: {OUTPUTS}", file=sys.stderr)
    return 0
