"""The command line, ``layerlens`` (``python -m analysis`` is the same): one sub-command per analysis, each in its
own module of this package, sharing the model options (:mod:`cli.common`).

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

from analysis.core.inputs import InputError
from analysis.core.parallel import is_main_process
from analysis.core.staging import is_no_space, no_space
from analysis.tasks import TASKS
from cli.cache import add_cache_arguments, cmd_cache
from cli.common import (
    Parser,
    UserError,
    finish_outputs,
    model_options,
)
from cli.dashboard import add_dashboard_arguments, cmd_dashboard
from cli.info import cmd_info
from cli.jobs import add_jobs_arguments, cmd_jobs
from cli.tasks import add_task_arguments, run_task, subcommands
from jobs.store import StoreError
from models.spec import ModelLoadError

log = logging.getLogger("layerlens")


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str, Callable[[argparse.ArgumentParser], None]]] = {
    "info": (cmd_info, "describe a model: family, layers, hidden size, vocabulary, device, bytes (writes info.json)",
             lambda p: None),
    **{name: (run_task(task), task.help, add_task_arguments(task)) for name, task in TASKS.items() if " " not in name},
    "jobs": (cmd_jobs, "background jobs (fine-tuning, and every other command): submit, list, show, cancel, logs",
             add_jobs_arguments),
    "cache": (cmd_cache, "the shared cache: verify every vector set (manifest, shard sizes and checksums)",
              add_cache_arguments),
    "dashboard": (cmd_dashboard, "start the dashboard in the browser (from a clone or the installed package)",
                  add_dashboard_arguments),
}


# commands made only of tasks (a task named "GROUP ACTION" is ACTION of GROUP): their help
GROUPS = {"tokens": "token vectors of a corpus per layer on disk, nearest tokens per layer, each layer's geometry "
                    "and token map (extract | index | neighbours | geometry | map)",
          "heads": "attention heads: per-head statistics and the head map, heads as parsers on UD, head importance "
                   "and pruning, one sentence's attention (stats | parse | importance | view)",
          "lens": "lenses: train a tuned lens read by the MLM head (train; probe --lens uses it), read every layer "
                  "through a classifier's own head (classifier)"}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="layerlens",
        description="LayerLens: look inside BERT-family masked language models layer by layer.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parent = model_options()
    for name, (func, help_text, add_arguments) in COMMANDS.items():
        # their models are their own options (heads, tokens: each action's parser has the model flags)
        own_models = name in ("jobs", "dashboard", "cache") or (
            name in TASKS and not TASKS[name].model_flags)
        parents = [] if own_models else [model_options(TASKS[name].Options) if name in TASKS else parent]
        p = sub.add_parser(name, parents=parents, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(func=func)
    for name, task in TASKS.items():  # a task named "GROUP ACTION" is ACTION under GROUP's own sub-commands
        group, _, action = name.partition(" ")
        if not action:
            continue
        if group not in sub.choices:
            g = sub.add_parser(group, help=GROUPS[group], description=GROUPS[group])  # its actions have the flags
            g.add_subparsers(dest="action", metavar="ACTION", required=True)
        own = [model_options(task.Options)] if task.model_flags else []
        p = subcommands(sub.choices[group]).add_parser(action, parents=own,
                                                       help=task.help, description=task.description or task.help)
        add_task_arguments(task)(p)
        p.set_defaults(func=run_task(task))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    if args.command not in ("jobs", "dashboard", "cache"):  # the jobs commands only read the job store: no torch
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
        if is_no_space(exc):  # a full disk no writer named: its file's folder, or --out
            from pathlib import Path

            where = Path(exc.filename).parent if getattr(exc, "filename", None) else getattr(args, "out", None)
            print(f"error: {no_space(Path(where or '.'))}", file=sys.stderr)
            return 2
        print(f"error: unexpected {type(exc).__name__}: {exc} (set LAYERLENS_DEBUG=1 for details)", file=sys.stderr)
        return 1
    finally:
        finish_outputs(ok)  # a staged --out is renamed into place only after a complete run


def _terminated(signum, frame):
    raise KeyboardInterrupt
