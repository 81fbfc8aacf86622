"""The training sub-commands of ``python -m analysis``: ``finetune`` (with ``--preset`` and ``--config``
files whose values are checked like flags) and ``jobs`` (background fine-tuning runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from analysis.cli_base import UserError, add_option_flag, prepare_out
from analysis.core.inputs import InputError


def add_finetune_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per field of :class:`analysis.options.FinetuneOptions` (its defaults, bounds and help): values
    given are resolved with ``--config`` and ``--preset`` by :func:`analysis.options.resolve`."""
    from analysis import options

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
    from analysis.options import FinetuneOptions, resolve

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


def add_jobs_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("submit", help="queue a fine-tuning job (prints its id last) and start a worker if needed")
    s.add_argument("--config", type=Path, required=True, help="the options file finetune --config takes")
    s.add_argument("--grid", nargs="+", metavar="KEY=V1,V2", help="a sweep: one job per combination, e.g. --grid "
                   "head=cls,attention,lstm lr=2e-5,5e-5 (6 jobs in one group)")
    s.add_argument("--group", help="the sweep's name (default: 'sweep <time>: <keys>')")
    s.add_argument("--name", default="", help="a name for the job list")
    s.add_argument("--no-worker", action="store_true", help="only queue it (a worker started later runs it)")
    ls = sub.add_parser("list", help="the jobs, newest first")
    ls.add_argument("--json", action="store_true", help="every job as JSON (status, progress, metrics, options)")
    for action, text in (("show", "one job as JSON with its progress and, once finished, metrics"),
                         ("cancel", "stop a queued or running job (it keeps its log)"),
                         ("logs", "print a job's log")):
        a = sub.add_parser(action, help=text)
        a.add_argument("id", type=int)
        if action == "show":
            a.add_argument("--json", action="store_true", help="(the output is always JSON)")


def cmd_jobs(args: argparse.Namespace) -> int:
    """Background fine-tuning jobs: submit, list, show, cancel, logs (state under LAYERLENS_HOME)."""
    from jobs import backends
    from jobs.store import JobStore

    store = JobStore()
    if args.action == "submit":
        from jobs.submit import SubmitError, submit, submit_sweep  # loads data and model configs: the heavy action

        config = read_config_file(args.config)
        try:
            if args.grid:
                from analysis.options import grid

                group, ids = submit_sweep(config, grid(args.grid), store, args.group, not args.no_worker)
                print(f"queued {len(ids)} jobs in group '{group}':", file=sys.stderr)
            else:
                ids = [submit(config, store, args.name, start_worker=not args.no_worker, group=args.group)]
        except (SubmitError, InputError) as exc:
            raise UserError(f"not queued ({args.config}): {exc}") from None
        for job_id in ids:
            job = store.get(job_id)
            print(f"queued job {job_id} ({job.where}): {job.name}", file=sys.stderr)
            print(job_id)  # one id a line on stdout, for scripts
        return 0
    backends.refresh(store)
    if args.action == "list":
        jobs = store.list()
        if args.json:
            print(json.dumps([j.to_dict() for j in jobs], indent=2, default=str))
            return 0
        if not jobs:
            print(f"no jobs under {store.root}", file=sys.stderr)
        for j in jobs:
            p = j.progress
            done = f"{p.get('step', 0)}/{p.get('total_steps', '?')}" if p else ""
            acc = f"acc {j.metrics['accuracy']:.4f}" if j.metrics and "accuracy" in j.metrics else ""
            print(f"{j.id:>5}  {j.status:<9}  {done:>11}  {acc:<11}  {j.name}  [{j.where}]")
        return 0
    job = store.get(args.id)
    if job is None:
        raise UserError(f"no job {args.id} under {store.root}")
    if args.action == "show":
        print(json.dumps(job.to_dict(), indent=2, default=str))
    elif args.action == "cancel":
        print(f"job {job.id}: {backends.cancel(store, job.id)}"
              + (" (stopping)" if store.get(job.id).status == "running" else ""))
    else:
        print(job.log_path.read_text(errors="replace") if job.log_path.is_file() else "(no log yet)", end="")
    return 0
