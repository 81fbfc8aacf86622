"""The CLI's door to the tasks (:mod:`analysis.tasks`): one sub-command per registered task, its flags derived from
the task's options schema (default, choices, help; a field without a default is a required flag), run through a
:class:`CliContext` (progress bars on stderr, notes on stderr, the output folder staged), the result's files written
and its summary printed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.core import options as schema_fields
from analysis.core.inputs import InputError
from analysis.core.task import Task, complete_record
from cli.common import UserError, add_option_flag, prepare_out
from jobs.store import StoreJobs


def add_task_arguments(task: Task):
    """The ``add_arguments`` of ``task``'s sub-command: a flag per option not shared with the model parser."""
    def add(p: argparse.ArgumentParser) -> None:
        g = p.add_argument_group(task.name + (" (the keys of a --config file are these names with underscores)"
                                              if task.config_file else ""))
        if task.config_file:
            g.add_argument("--config", type=Path, help="a .yaml or .json file of these options; flags override it")
        if not task.model_flags and "out" not in task.Options.model_fields:  # no shared model parser: --out here
            g.add_argument("--out", type=Path, help="directory for the output files")
        for name in task.positional:
            g.add_argument(name, type=_type(name, task), metavar=name.upper(),
                           help=schema_fields.help_text(name, task.Options).replace("%", "%%"))
        one_of = g.add_mutually_exclusive_group(required=True) if task.exclusive else None
        at_most_one = g.add_mutually_exclusive_group() if task.exclusive_optional else None
        for name, field in task.Options.model_fields.items():
            if (name in task.shared and task.model_flags) or name in task.hidden or name in task.positional:
                continue
            flag = task.flags.get(name)
            if name in task.exclusive_optional:
                add_option_flag(at_most_one, name, schema=task.Options, flag=flag)
            elif name in task.exclusive or field.is_required():  # given on every command line: no default
                container, required = (one_of, {}) if name in task.exclusive else (g, {"required": True})
                container.add_argument(flag or f"--{name.replace('_', '-')}", dest=name, type=_type(name, task),
                                       metavar=name.upper(), **required,
                                       help=schema_fields.help_text(name, task.Options).replace("%", "%%"))
            else:  # with a config file, only a typed flag overrides it (its value, else the file's, else the default)
                add_option_flag(g, name, schema=task.Options, flag=flag, suppress=task.config_file,
                                aliases=task.aliases.get(name, ()))
    return add


def subcommands(parser: argparse.ArgumentParser):
    """The sub-commands action of ``parser`` (a command with actions: ``lens train``, ``lens classifier``)."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _type(name: str, task: Task):
    annotation = task.Options.model_fields[name].annotation
    return Path if annotation is Path or annotation == Path | None else str


class CliContext(StoreJobs):
    """The task's reports on a terminal: a tqdm bar per stage, notes on stderr, ``--out`` staged; jobs looked up in
    the user's job store."""

    def __init__(self, out: Path | None, unit: str, what: str, in_place: bool = False):
        self.out, self.unit, self.what, self.in_place = out, unit, what, in_place
        self.bar, self.stage, self.staged, self.stopped = None, None, None, False

    def output(self) -> Path:
        if self.out is None:
            raise UserError(f"--out DIR is required: {self.what}")
        if self.in_place:  # the task writes there as it goes, and resumes from what it finds
            self.out.mkdir(parents=True, exist_ok=True)
            return self.out
        if self.staged is None:
            self.staged = prepare_out(self.out)
        return self.staged

    def listen(self) -> None:
        """Ctrl-C asks the task to stop at its next step (it saves what it can resume from) instead of killing it."""
        import signal

        def stop(*_):
            self.stopped = True
        signal.signal(signal.SIGINT, stop)

    def log(self, message: str) -> None:
        if self.bar is not None:  # above the bar, which stays at the bottom
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)

    def progress(self, stage: str, done: int, total: int) -> None:
        from tqdm.auto import tqdm

        if stage != self.stage:
            self.close()
            self.stage, self.bar = stage, tqdm(total=total, desc=stage, unit=self.unit, file=sys.stderr)
        self.bar.update(done - self.bar.n)

    def should_stop(self) -> bool:
        return self.stopped

    def keep(self, name: str) -> Path | None:
        return None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def options_from_args(task: Task, args: argparse.Namespace):
    """The task's options from the parsed flags (the schema checks them: one readable error)."""
    values = {name: getattr(args, name) for name in task.Options.model_fields if hasattr(args, name)}
    if task.config_file and getattr(args, "config", None):
        from cli.configfile import read_config_file

        given = read_config_file(args.config)
        unknown = sorted(set(given) - set(task.Options.model_fields))
        if unknown:
            raise UserError(f"{args.config}: unknown option(s) {', '.join(unknown)}")
        values = {**given, **values}
    if any(str(values.get(name) or "").startswith("job:") for name in ("model", "compare", "checkpoints")):
        from analysis.tasks.kind import resolve_job_refs
        from jobs.store import JobStore

        try:  # job:N, resolved as a job's door resolves it
            values = resolve_job_refs(task, values, JobStore().find)
        except InputError as exc:
            raise UserError(str(exc)) from None
    try:
        return task.build(values)
    except (InputError, ValueError) as exc:
        raise UserError(str(exc)) from None


def run_task(task: Task):
    """The sub-command's function: options from the flags, the run, the files, the summary."""
    def command(args: argparse.Namespace) -> int:
        if getattr(args, "out", None) is None and "out" in vars(args) and not task.out_optional:
            raise UserError(f"--out DIR is required: {task.writes}")
        options = options_from_args(task, args)
        # a one-file output is the result's to write (in place, atomically): no folder
        ctx = CliContext(None if task.output_file else args.out, task.unit, task.writes, task.in_place)
        if task.in_place:
            ctx.listen()
        try:
            result = task.run(options, ctx)
        finally:
            ctx.close()
        if result is None:  # stopped (Ctrl-C), or a helper process of a launcher
            return 130 if ctx.stopped else 0
        if task.output_file:
            size = result.write_file(options.out)
            print(f"wrote {options.out} ({size / 1e6:.1f} MB)", file=sys.stderr)
            return 0
        written = result.write(ctx.output()) if args.out is not None else []  # no --out: printed only
        if args.out is not None:
            complete_record(ctx.output(), options)
        summary = result.summary()
        if summary:
            print(summary)
        if line := result.done_line(str(args.out), written):
            print(line, file=sys.stderr)
        return 0
    return command
