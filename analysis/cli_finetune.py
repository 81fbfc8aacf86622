"""The training sub-commands of ``python -m analysis``: ``finetune`` (with ``--preset`` and ``--config``
files whose values are checked like flags) and ``jobs`` (background fine-tuning runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from analysis.cli_base import UserError, positive_int, prepare_out, spec_from_args, versions, write_json
from analysis.taskdata import TRUNCATIONS
from analysis.training import PRESETS, SCHEDULES


def add_finetune_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fine-tuning")
    g.add_argument("--config", type=Path, help="a .yaml or .json file of these options (keys: the flag names with "
                   "underscores); flags given on the command line override it")
    g.add_argument("--preset", choices=sorted(PRESETS), help="the papers' settings as defaults: sun2019 (batch 24, "
                   "lr 2e-5, layer decay 0.95, head+tail at 512, 4 epochs) or grubert (gru-share-3, lr 1e-5 x 0.9 per "
                   "epoch, batch 64, 15 epochs, early stopping, 40 tokens); options given explicitly win")
    g.add_argument("--train", help="training rows: a .csv/.tsv/.jsonl file, 'demo', or hf:NAME[/CONFIG]:SPLIT")
    g.add_argument("--val", help="validation rows (same forms); default: hold out --val-fraction of --train")
    g.add_argument("--val-fraction", type=float, default=0.2, help="without --val (default 0.2, stratified)")
    g.add_argument("--test", help="test rows (same forms); predictions.csv is for them when given")
    g.add_argument("--text-column", default="text", help="column holding the texts (default: text)")
    g.add_argument("--pair-column", help="second text of a pair: the aspect (ABSA) or hypothesis (NLI)")
    g.add_argument("--label-column", default="label", help="column holding the class labels (default: label)")
    g.add_argument("--head", default="cls", help="cls, pooler, layer-K, first4-|last4-concat|mean|max, all-concat, "
                   "lstm, attention, scalar-mix, gru-share-C, gru-cat-C, gru-share-C-linear (default cls)")
    g.add_argument("--epochs", type=positive_int, default=3)
    g.add_argument("--lr", type=float, default=2e-5, help="base learning rate (default 2e-5)")
    g.add_argument("--layer-decay", type=float, default=1.0,
                   help="layer-wise decay xi: layer k trains at lr * xi^(L-k) (Sun et al.; 0.95 there; default 1)")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--warmup", type=float, default=0.1, help="warm-up proportion of the steps (default 0.1)")
    g.add_argument("--dropout", type=float, default=0.1, help="dropout in the head (default 0.1)")
    g.add_argument("--truncation", choices=TRUNCATIONS, default="head", help="long texts: keep the head, the tail, "
                   "or head+tail (128 + 382 at 512, scaled)")
    g.add_argument("--max-length", type=positive_int, default=128, help="tokens per text (default 128)")
    g.add_argument("--max-steps", type=positive_int, help="stop after this many optimiser steps")
    g.add_argument("--folds", type=positive_int, default=1, help="k-fold cross-validation over --train")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--early-stopping", action="store_true", help="stop when validation loss stops improving "
                   "(--patience epochs) and keep the best epoch")
    g.add_argument("--patience", type=positive_int, default=2)
    g.add_argument("--schedule", choices=SCHEDULES, default="linear",
                   help="linear warm-up and decay (default), or epoch-decay: lr x 0.9 after each epoch (GRUBERT)")
    g.add_argument("--further-pretrain-steps", type=int, default=0, help="first continue masked-LM training on the "
                   "training texts for this many steps (within-task further pre-training, Sun et al. 4.2)")
    p.set_defaults(batch_size=16)


def apply_config_file(parser: argparse.ArgumentParser, args: argparse.Namespace, argv) -> argparse.Namespace:
    """Re-parse with defaults from ``--preset`` and then ``--config``, so that command-line flags win."""
    preset = getattr(args, "preset", None)
    if args.command != "finetune" or (getattr(args, "config", None) is None and preset is None):
        return args
    sub = parser._subparsers._group_actions[0].choices[args.command]
    if preset is not None:
        sub.set_defaults(**PRESETS[preset])
    if getattr(args, "config", None) is None:
        return parser.parse_args(argv)
    path = args.config
    if not path.is_file():
        raise UserError(f"no such config file: {path}")
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(path.read_text())
        else:
            values = json.loads(path.read_text())
    except Exception as exc:
        raise UserError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(values, dict):
        raise UserError(f"{path} must hold a mapping of option names to values")
    known = set(vars(args)) - {"func", "command", "config"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"{path}: unknown option(s) {', '.join(unknown)} (use the flag names with underscores)")
    values = {key: _coerce(sub, key, value, path) for key, value in values.items()}
    if "preset" in values:
        if values["preset"] not in PRESETS:
            raise UserError(f"{path}: unknown preset '{values['preset']}' (choose from {', '.join(sorted(PRESETS))})")
        sub.set_defaults(**PRESETS[values["preset"]])
    sub.set_defaults(**values)
    return parser.parse_args(argv)


def finetune_config(args: argparse.Namespace):
    from analysis.training import FinetuneConfig

    return FinetuneConfig(
        head=args.head, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, layer_decay=args.layer_decay,
        weight_decay=args.weight_decay, warmup=args.warmup, dropout=args.dropout, truncation=args.truncation,
        max_length=args.max_length, max_steps=args.max_steps, folds=args.folds, seed=args.seed,
        early_stopping=args.early_stopping, patience=args.patience, schedule=args.schedule,
        further_pretrain_steps=args.further_pretrain_steps)


def _coerce(parser: argparse.ArgumentParser, key: str, value, path: Path):
    """A config-file value checked and converted as the command line would (types, choices, flags)."""
    action = next(a for a in parser._actions if a.dest == key)
    if value is None:
        return None
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise UserError(f"{path.name}: {key} must be true or false, got {value!r}")
        return value
    try:
        converted = action.type(str(value)) if action.type is not None else value
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise UserError(f"{path.name}: {key}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        raise UserError(f"{path.name}: {key} must be one of {', '.join(map(str, action.choices))}, got {value!r}")
    return converted


def cmd_finetune(args: argparse.Namespace, callbacks: list = ()) -> int:
    """Fine-tune a classifier head (and the encoder) on labelled data."""
    run_finetune_args(args, callbacks)
    return 0


def run_finetune_args(args: argparse.Namespace, callbacks: list = ()) -> dict:
    """``finetune`` from parsed arguments (also the body of a dashboard job); returns metrics.json's dict."""
    from analysis.finetune import Splits, read_split, run_finetune, split_off

    if args.out is None:
        raise UserError("--out DIR is required: fine-tuning writes metrics.json, predictions.csv, checkpoint/, ...")
    if not args.train:
        raise UserError("--train is required (a file, 'demo', or hf:NAME[/CONFIG]:SPLIT)")
    config = finetune_config(args)
    read = lambda source: read_split(source, args.text_column, args.pair_column, args.label_column)  # noqa: E731
    train = read(args.train)
    val = read(args.val) if args.val else None
    if val is None and config.folds == 1:
        train, val = split_off(train, args.val_fraction, args.seed)
        print(f"note: validation = {len(val)} rows held out from --train (stratified, seed {args.seed})",
              file=sys.stderr)
    splits = Splits(train, val, read(args.test) if args.test else None)
    out = prepare_out(args.out)
    with tqdm(desc="fine-tuning", unit="step", file=sys.stderr) as bar:
        def progress(event, state, control):
            bar.total = state.total_steps
            bar.update(state.step - bar.n)
            if event == "step":
                bar.set_postfix(epoch=state.epoch, loss=f"{state.last_loss:.3f}")
            else:
                h = state.history[-1]
                bar.write(f"epoch {h['epoch']}: val loss {h['val_loss']:.4f}, accuracy {h['val_accuracy']:.4f}, "
                          f"macro-F1 {h['val_macro_f1']:.4f}")

        try:
            metrics = run_finetune(spec_from_args(args), splits, config, out, [progress, *callbacks], log=bar.write)
        except ValueError as exc:  # a head that does not fit this model
            raise UserError(str(exc)) from None
    write_json(out, "run.json", {"config": config.to_dict(), "model_spec": spec_from_args(args).to_dict(),
                                 "train": args.train, "val": args.val, "test": args.test,
                                 "text_column": args.text_column, "pair_column": args.pair_column,
                                 "label_column": args.label_column, "versions": versions()})
    std = f" ± {metrics['accuracy_std']:.4f}" if "accuracy_std" in metrics else ""
    print(f"{metrics.get('evaluated_on', '')} accuracy {metrics.get('accuracy', float('nan')):.4f}{std}, macro-F1 "
          f"{metrics.get('macro_f1', float('nan')):.4f}; head parameters {metrics['head_trainable_parameters']:,}")
    print(f"wrote {out}/metrics.json, predictions.csv, run.json" + (", checkpoint/" if config.folds == 1 else ""),
          file=sys.stderr)
    return metrics


def add_jobs_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("submit", help="queue a fine-tuning job (prints its id last) and start a worker if needed")
    s.add_argument("--config", type=Path, required=True, help="the options file finetune --config takes")
    s.add_argument("--name", default="", help="a name for the job list")
    s.add_argument("--no-worker", action="store_true", help="only queue it (a worker started later runs it)")
    ls = sub.add_parser("list", help="the jobs, newest first")
    ls.add_argument("--json", action="store_true")
    for action, text in (("show", "one job as JSON with its progress and, once finished, metrics"),
                         ("cancel", "stop a queued or running job (it keeps its log)"),
                         ("logs", "print a job's log")):
        a = sub.add_parser(action, help=text)
        a.add_argument("id", type=int)
        if action == "show":
            a.add_argument("--json", action="store_true", help="(the output is always JSON)")


def cmd_jobs(args: argparse.Namespace) -> int:
    """Background fine-tuning jobs: submit, list, show, cancel, logs (state under LAYERLENS_HOME)."""
    from jobs.store import JobStore
    from jobs.submit import SubmitError, submit

    store = JobStore()
    if args.action == "submit":
        if not args.config.is_file():
            raise UserError(f"no such config file: {args.config}")
        text = args.config.read_text()
        try:
            import yaml

            config = yaml.safe_load(text) if args.config.suffix.lower() in (".yaml", ".yml") else json.loads(text)
        except Exception as exc:
            raise UserError(f"cannot read {args.config}: {str(exc).splitlines()[0]}") from None
        if not isinstance(config, dict):
            raise UserError(f"{args.config} must hold a mapping of option names to values")
        try:
            job_id = submit(config, store, args.name, start_worker=not args.no_worker)
        except SubmitError as exc:
            raise UserError(f"not queued: {exc}") from None
        print(job_id)
        return 0
    if args.action == "list":
        jobs = store.list()
        if args.json:
            print(json.dumps([j.to_dict() for j in jobs], indent=2, default=str))
            return 0
        for j in jobs:
            p = j.progress
            done = f"{p.get('step', 0)}/{p.get('total_steps', '?')}" if p else ""
            acc = f"acc {j.metrics['accuracy']:.4f}" if j.metrics and "accuracy" in j.metrics else ""
            print(f"{j.id:>5}  {j.status:<9}  {done:>11}  {acc:<11}  {j.name}")
        return 0
    job = store.get(args.id)
    if job is None:
        raise UserError(f"no job {args.id} under {store.root}")
    if args.action == "show":
        print(json.dumps(job.to_dict(), indent=2, default=str))
    elif args.action == "cancel":
        print(f"job {job.id}: {store.request_cancel(job.id)}"
              + (" (stopping)" if store.get(job.id).status == "running" else ""))
    else:
        print(job.log_path.read_text(errors="replace") if job.log_path.is_file() else "(no log yet)", end="")
    return 0
