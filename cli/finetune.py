"""The training sub-commands of ``python -m analysis``: ``finetune`` (with ``--preset`` and ``--config``
files whose values are checked like flags) and ``jobs`` (background fine-tuning runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from analysis.core.inputs import InputError
from cli.common import UserError, add_option_flag, prepare_out


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


CONFIG_MAX_BYTES = 2**20  # a config file is a few lines; more is a mistake or an attack
CONFIG_MAX_ALIASES = 50  # YAML anchors/aliases allowed ("billion laughs" files are refused)
CONFIG_MAX_NODES = 100_000  # YAML values once aliases are expanded (an alias counts its whole target)


def read_config_file(path: Path) -> dict:
    """The option mapping in a .yaml/.yml or .json file: at most 1 MB, YAML with at most
    :data:`CONFIG_MAX_ALIASES` aliases and :data:`CONFIG_MAX_NODES` nodes counted as if every alias were
    expanded (an alias bomb is refused after parsing, before any value is built)."""
    if not path.is_file():
        raise UserError(f"no such config file: {path}")
    if path.stat().st_size > CONFIG_MAX_BYTES:
        raise UserError(f"{path} is {path.stat().st_size:,} bytes: a config file may have at most "
                        f"{CONFIG_MAX_BYTES:,}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a text file (a config file is YAML or JSON)") from None
    try:
        values = _yaml(text) if path.suffix.lower() in (".yaml", ".yml") else json.loads(text)
    except Exception as exc:
        raise UserError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(values, dict):
        raise UserError(f"{path} must hold a mapping of option names to values")
    return values


def _yaml(text: str):
    """``yaml.safe_load`` with the alias and expanded-size limits: the document is composed (aliases are shared
    nodes, nothing is copied), its expanded size counted, and only then constructed."""
    import yaml

    class Limited(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                Limited.aliases += 1
                if Limited.aliases > CONFIG_MAX_ALIASES:
                    raise yaml.YAMLError(f"more than {CONFIG_MAX_ALIASES} YAML aliases")
            return super().compose_node(parent, index)

    loader = Limited(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_nodes(root) -> int:
    """The number of nodes under ``root`` with every alias expanded (a node reached twice counts twice), computed
    once per distinct node; a ``YAMLError`` above :data:`CONFIG_MAX_NODES` or for an alias inside its own anchor."""
    import yaml

    def children(node):
        if isinstance(node, yaml.SequenceNode):
            return node.value
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        return []

    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            open_nodes.discard(id(node))
            sizes[id(node)] = size = 1 + sum(sizes[id(c)] for c in children(node))
            if size > CONFIG_MAX_NODES:
                raise yaml.YAMLError(f"more than {CONFIG_MAX_NODES:,} YAML nodes once its aliases are expanded")
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            raise yaml.YAMLError(f"a YAML alias refers to itself (line {node.start_mark.line + 1})")
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if id(c) not in sizes)
    return sizes[id(root)]


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


