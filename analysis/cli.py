"""``python -m analysis``: one sub-command per analysis, sharing the model options.

Errors end the program with one readable line on stderr and a non-zero exit status (2 for bad input,
1 for anything unexpected); set ``LAYERLENS_DEBUG=1`` for the full traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import transformers
from tqdm.auto import tqdm

from analysis.inputs import InputError
from analysis.projection import METHODS, POOLINGS
from analysis.taskdata import TRUNCATIONS
from analysis.training import PRESETS, SCHEDULES
from models.loading import DEMO_NAME, DEVICES, DTYPES, SUGGESTED_MODELS, ModelLoadError, ModelSpec

log = logging.getLogger("layerlens")
LAYERLENS_VERSION = "0.1.0"


class UserError(Exception):
    """Bad input from the user; the message is shown as is."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (the usage itself is one ``--help`` away)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def model_options() -> argparse.ArgumentParser:
    """The options every sub-command shares."""
    p = Parser(add_help=False)
    g = p.add_argument_group("model and output")
    g.add_argument("--model", default=DEMO_NAME,
                   help="hub id, local save_pretrained directory, or 'demo' (default); e.g. "
                   + ", ".join(SUGGESTED_MODELS[1:]))
    g.add_argument("--revision", help="hub branch, tag or commit")
    g.add_argument("--device", default="auto", choices=DEVICES, help="default: cuda, then mps, then cpu")
    g.add_argument("--dtype", default="auto", choices=list(DTYPES),
                   help="default: bfloat16 on a capable GPU, else float32")
    g.add_argument("--allow-pickle", action="store_true",
                   help="also load pickle (.bin) weights; only for sources you trust")
    g.add_argument("--batch-size", type=positive_int, default=32, help="texts per forward pass (default 32)")
    g.add_argument("--out", type=Path, help="directory for the output files")
    return p


def spec_from_args(args: argparse.Namespace) -> ModelSpec:
    return ModelSpec(args.model, revision=args.revision, device=args.device, dtype=args.dtype,
                     allow_pickle=args.allow_pickle)


def prepare_out(out: Path) -> Path:
    """The output directory, created if needed."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_json(out: Path | None, filename: str, payload: dict) -> Path | None:
    """Write ``payload`` to ``out/filename`` (creating ``out``); nothing when ``out`` is None."""
    if out is None:
        return None
    path = prepare_out(out) / filename
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


# --- sub-commands -------------------------------------------------------------------------------------------

def cmd_info(args: argparse.Namespace) -> int:
    """Load the model and describe it: family, layers, sizes, where it runs."""
    from models.loading import load_model

    summary = load_model(spec_from_args(args)).summary()
    width = max(map(len, summary))
    for key, value in summary.items():
        print(f"{key:<{width}}  {value}")
    path = write_json(args.out, "info.json", summary)
    if path:
        print(f"wrote {path}", file=sys.stderr)
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
    g.add_argument("--seed", type=int, default=0, help="seed of the masked mode's random groups")


def cmd_probe(args: argparse.Namespace) -> int:
    """Reconstruction probe: every layer through the model's own MLM head."""
    from analysis.inputs import read_file
    from analysis.reconstruction import ProbeConfig, probe
    from analysis.token_sink import TokenSink
    from models.loading import load_model

    if args.out is None:
        raise UserError("--out DIR is required: the probe writes layers.csv, decoded.csv, tokens.parquet, run.json")
    inputs = read_file(args.input, args.column, args.pair_column)
    for note in inputs.notes():
        print(f"note: {note}", file=sys.stderr)
    try:
        config = ProbeConfig(mode=args.mode, include_special=args.include_special, top_k=args.top_k,
                             batch_size=args.batch_size, max_length=args.max_length, seed=args.seed)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    loaded = load_model(spec_from_args(args))
    out = prepare_out(args.out)
    with tqdm(total=len(inputs), desc="probing", unit="text", file=sys.stderr) as bar:
        result = probe(loaded, inputs, config, sink=TokenSink(loaded.tokenizer, config.top_k, out / "tokens.parquet"),
                       progress=lambda done, total: bar.update(done - bar.n))
    if result.truncated:
        print(f"note: {result.truncated} text(s) longer than {result.max_length} tokens were cut", file=sys.stderr)
    result.layers.to_csv(out / "layers.csv", index=False)
    result.decoded.to_csv(out / "decoded.csv", index=False)
    write_json(out, "run.json", {**result.run_info(), "input": str(args.input), "column": args.column,
                                 "pair_column": args.pair_column, "model_spec": loaded.spec.to_dict(),
                                 "load_seconds": round(loaded.load_seconds, 3), "versions": versions()})
    print(result.layers.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {out}/layers.csv, decoded.csv, tokens.parquet, run.json", file=sys.stderr)
    return 0


class StageBars:
    """A ``(stage, done, total)`` progress callback drawing one tqdm bar per stage on stderr."""

    def __init__(self):
        self.bar, self.stage = None, None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self.stage:
            self.close()
            self.stage, self.bar = stage, tqdm(total=total, desc=stage, file=sys.stderr, leave=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
    g.add_argument("--layers", default="-6:", help="hidden states to project: all, a slice (default -6:) or 0,4,8")
    g.add_argument("--max-length", type=positive_int, help="cut texts to this many tokens (default: the model's limit)")
    g.add_argument("--folds", type=positive_int, default=5, help="folds of the linear probe (default 5)")
    g.add_argument("--seed", type=int, default=0, help="seed of the folds, the projection and any sample")
    g.add_argument("--sample", type=positive_int, help="use a random sample of this many rows")


def cmd_atlas(args: argparse.Namespace) -> int:
    """Layer atlas: per-layer sentence vectors in 2-D, separability per layer, layer x layer CKA."""
    from analysis.inputs import from_hub_dataset, read_file
    from analysis.projection import AtlasConfig, atlas
    from models.loading import load_model

    if args.out is None:
        raise UserError("--out DIR is required: the atlas writes coords.csv, separability.csv, cka.csv, run.json")
    config = AtlasConfig(pooling=args.pooling, method=args.method, layers=args.layers, max_length=args.max_length,
                         batch_size=args.batch_size, folds=args.folds, seed=args.seed)
    if args.data is not None:
        data = read_file(args.data, args.text_column, args.pair_column, label_column=args.label_column)
    else:
        name, _, subset = args.hf_dataset.partition("/")
        data = from_hub_dataset(name, subset or None, args.split, args.text_column, args.pair_column,
                                args.label_column)
    for note in data.notes():
        print(f"note: {note}", file=sys.stderr)
    if args.sample:
        if args.sample < len(data):
            print(f"note: using a random sample of {args.sample:,} of {len(data):,} rows (seed {args.seed})",
                  file=sys.stderr)
        data = data.sample(args.sample, args.seed)
    loaded = load_model(spec_from_args(args))
    out = prepare_out(args.out)
    with StageBars() as progress:
        result = atlas(loaded, data, config, progress=progress)
    result.coords.to_csv(out / "coords.csv", index=False)
    result.separability.to_csv(out / "separability.csv", index=False)
    result.cka_frame().to_csv(out / "cka.csv")
    source = str(args.data) if args.data is not None else f"hf:{args.hf_dataset}:{args.split}"
    write_json(out, "run.json", {**result.info, "data": source, "text_column": args.text_column,
                                 "pair_column": args.pair_column, "label_column": args.label_column,
                                 "model_spec": loaded.spec.to_dict(), "versions": versions()})
    print(result.separability.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {out}/coords.csv, separability.csv, cka.csv, run.json", file=sys.stderr)
    return 0


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


def cmd_duplicate(args: argparse.Namespace) -> int:
    """Layer duplication: export a deeper model (and probe it) without training."""
    from analysis.duplication import duplicate_first, export, parse_plan, preview, sweep
    from analysis.inputs import read_file
    from analysis.reconstruction import probe
    from models.loading import load_model

    if args.out is None:
        raise UserError("--out DIR is required: the deeper model is saved there")
    if args.sweep and args.preview_input is None:
        raise UserError("--sweep needs --preview-input (the texts to probe)")
    inputs = read_file(args.preview_input, args.column) if args.preview_input else None
    loaded = load_model(spec_from_args(args))
    albert = loaded.anatomy.family == "albert"
    if args.depth is not None:
        if not albert:
            raise UserError("--depth is for ALBERT (one shared layer); use --duplicate-first or --plan")
        plan = [0] * args.depth
    elif args.plan is not None:
        if albert:
            raise UserError("ALBERT shares one layer across depth: give --depth N instead of a plan")
        plan = parse_plan(args.plan, loaded.num_layers)
    else:
        plan = duplicate_first(loaded.num_layers, args.duplicate_first or 0)
    out = prepare_out(args.out)
    export(loaded, plan, out)
    print(f"plan ({len(plan)} layers): {','.join(map(str, plan)) if not albert else f'shared x {len(plan)}'}")
    if inputs is not None:
        result = probe(preview(loaded, plan), inputs)
        (out / "preview").mkdir(exist_ok=True)
        result.layers.to_csv(out / "preview" / "layers.csv", index=False)
        print(result.layers.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if args.sweep:
        table = sweep(loaded, inputs)
        table.to_csv(out / "sweep.csv", index=False)
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"wrote {out} (loads with AutoModelForMaskedLM.from_pretrained)", file=sys.stderr)
    return 0


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


def versions() -> dict:
    import platform

    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "layerlens": LAYERLENS_VERSION}


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
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m analysis",
        description="LayerLens: look inside BERT-family masked language models layer by layer.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parent = model_options()
    for name, (func, help_text, add_arguments) in COMMANDS.items():
        parents = [] if name == "jobs" else [parent]  # jobs carry their model in their options
        p = sub.add_parser(name, parents=parents, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # retries while offline; the error says it
    try:
        args = apply_config_file(parser, args, argv)
        return args.func(args)
    except (ModelLoadError, UserError, InputError) as exc:
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
