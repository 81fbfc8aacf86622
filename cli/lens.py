"""``python -m analysis lens train``: a tuned lens for a model (:mod:`analysis.probe.lens`)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tqdm.auto import tqdm

from analysis.core.inputs import InputError
from cli.common import UserError, add_option_flag


def add_lens_arguments(p: argparse.ArgumentParser) -> None:
    from analysis.probe.options import LensOptions

    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    t = sub.add_parser("train", help="train a tuned lens (resumes when --out holds one stopped with the same options)",
                       description="Train one affine translator per layer so that the MLM head reads each layer as "
                       "the final layer's distribution (KL at masked positions). Writes config.json, "
                       "translators.safetensors, training.json and checkpoint.safetensors (the one file a stopped or "
                       "killed run resumes from) to --out.")
    g = t.add_argument_group("tuned lens (the keys of a --config file are these names with underscores)")
    g.add_argument("--config", type=Path, help="a .yaml or .json file of these options; flags override it")
    g.add_argument("--out", type=Path, help="directory for the lens")
    g.add_argument("--corpus", dest="corpus", default=argparse.SUPPRESS, help="texts: a .txt file (a text a line), "
                   ".csv/.tsv/.jsonl (--text-column), 'demo', or hf:NAME[/CONFIG]:SPLIT")
    for name in LensOptions.model_fields:
        if name != "corpus":
            add_option_flag(g, name, suppress=True, schema=LensOptions)


def lens_options(args: argparse.Namespace):
    from analysis.probe.options import LensOptions
    from cli.configfile import read_config_file

    given = read_config_file(args.config) if args.config else {}
    flags = {k: v for k, v in vars(args).items() if k in LensOptions.model_fields}
    unknown = sorted(set(given) - set(LensOptions.model_fields))
    if unknown:
        raise UserError(f"{args.config}: unknown option(s) {', '.join(unknown)}")
    try:
        return LensOptions(**{**given, **flags})
    except InputError as exc:
        raise UserError(str(exc)) from None


def cmd_lens(args: argparse.Namespace) -> int:
    """Train a tuned lens."""
    from analysis.probe import lens_training
    from models.loading import load_model

    if args.out is None:
        raise UserError("--out DIR is required: the lens is written there (config.json, translators.safetensors, "
                        "training.json)")
    options = lens_options(args)
    texts = lens_training.read_corpus(options)
    loaded = load_model(options.spec())
    stop = []
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))  # Ctrl-C: checkpoint after this step, then exit
    with tqdm(desc="training the lens", unit="step", file=sys.stderr) as bar:
        def progress(step, total, losses):
            bar.total = total
            bar.update(step - bar.n)
            bar.set_postfix(kl=f"{sum(losses):.3f}")

        training = lens_training.train(loaded, texts, options, args.out, progress=progress,
                                       should_stop=lambda: bool(stop),
                                       log=lambda line: bar.write(line, file=sys.stderr))
    if stop:
        return 130
    held = training["held_out"]
    states = training.get("states") or [[i, "output"] for i in range(len(held["raw"]["masked"]["kl"]))]
    width = 15 if "states" in training else 5  # "3 attention": a lens of both halves names each state's half
    print(f"{'layer':<{width}}  held-out KL to final (masked)  raw -> tuned   top-1 agreement  raw -> tuned")
    for (layer, half), kr, kt, ar, at in zip(states, held["raw"]["masked"]["kl"], held["tuned"]["masked"]["kl"],
                                             held["raw"]["masked"]["agreement"], held["tuned"]["masked"]["agreement"],
                                             strict=True):
        name = f"{layer}" + (" attention" if half == "attention" else "")
        print(f"{name:{'<' if 'states' in training else '>'}{width}}  {kr:>22.4f} -> {kt:<10.4f}  {ar:>15.4f} -> "
              f"{at:.4f}")
    print(f"wrote {args.out}/config.json, translators.safetensors, training.json", file=sys.stderr)
    return 0
