"""The training sub-commands of ``python -m analysis``: ``finetune`` (with ``--preset`` and ``--config``
files whose values are checked like flags) and ``jobs`` (background fine-tuning runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm.auto import tqdm

from analysis.core.inputs import InputError
from cli.common import UserError, add_option_flag, prepare_out
from cli.configfile import read_config_file


def add_finetune_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per field of :class:`analysis.training.options.FinetuneOptions` (its defaults, bounds and help): values
    given are resolved with ``--config`` and ``--preset`` by :func:`analysis.training.options.resolve`."""
    from analysis.training import options

    g = p.add_argument_group("fine-tuning (see the option table in the README)")
    g.add_argument("--config", type=Path, help="a .yaml or .json file of these options (keys: the flag names with "
                   "underscores); flags given on the command line override it")
    g.add_argument("--out", type=Path, help="directory for the output files")
    for name in options.FinetuneOptions.model_fields:
        add_option_flag(g, name, suppress=True)


def finetune_options(args: argparse.Namespace):
    """The resolved options: schema defaults <- model defaults <- preset <- --config file <- flags."""
    from analysis.training.options import FinetuneOptions, resolve

    flags = {k: v for k, v in vars(args).items() if k in FinetuneOptions.model_fields}
    from_file = read_config_file(args.config) if getattr(args, "config", None) else {}
    try:
        return resolve(from_file, flags)
    except InputError as exc:
        where = f"{args.config}: " if from_file and set(from_file) - set(FinetuneOptions.model_fields) else ""
        raise UserError(where + str(exc)) from None


def cmd_finetune(args: argparse.Namespace, callbacks: list = ()) -> int:
    """Fine-tune a classifier head (and the encoder) on labelled data."""
    from analysis.core.parallel import is_main_process
    from analysis.training.finetune import run_options

    if args.out is None:
        raise UserError("--out DIR is required: fine-tuning writes metrics.json, predictions.csv, checkpoint/, ...")
    options = finetune_options(args)
    if not options.train:
        raise UserError("--train is required (a file, 'demo', or hf:NAME[/CONFIG]:SPLIT)")
    if options.backend != "local":
        raise UserError(f"backend {options.backend} is where a job runs: queue it with `layerlens jobs "
                        "submit --config FILE` (finetune runs here, now)")
    if not is_main_process():  # under a launcher: train and evaluate with the others; the main process writes
        run_options(options, args.out)
        return 0
    out = prepare_out(args.out)
    with tqdm(desc="fine-tuning", unit="step", file=sys.stderr) as bar:
        def note(line: str) -> None:  # on stderr, above the bar; stdout keeps only the result line
            bar.write(line, file=sys.stderr)

        def progress(event, state, control):
            bar.total = state.total_steps
            bar.update(state.step - bar.n)
            if event == "step":
                bar.set_postfix(epoch=state.epoch, loss=f"{state.last_loss:.3f}")
            else:
                h = state.history[-1]
                note(f"epoch {h['epoch']}: val loss {h['val_loss']:.4f}, accuracy {h['val_accuracy']:.4f}, "
                     f"macro-F1 {h['val_macro_f1']:.4f}")

        try:
            metrics = run_options(options, out, [progress, *callbacks], log=note)
        except ValueError as exc:  # a head that does not fit this model
            raise UserError(str(exc)) from None
    std = f" ± {metrics['accuracy_std']:.4f}" if "accuracy_std" in metrics else ""
    base = metrics.get("baseline") or {}
    print(f"{metrics.get('evaluated_on', '')} accuracy {metrics.get('accuracy', float('nan')):.4f}{std} (majority "
          f"class {base.get('accuracy', float('nan')):.4f}), macro-F1 {metrics.get('macro_f1', float('nan')):.4f}; "
          f"head parameters {metrics['head_trainable_parameters']:,}"
          + ("; every prediction is one class" if metrics.get("one_class") else ""))
    written = sorted(f"{p.name}/" if p.is_dir() else p.name for p in Path(out).iterdir())  # what is there, all of it
    print(f"wrote {args.out}/: {', '.join(written)}", file=sys.stderr)
    return 0


