"""What every ``python -m analysis`` sub-command shares: the model options, user errors, output helpers,
progress bars and the versions recorded in ``run.json``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from analysis import versions  # noqa: F401  (re-exported for the sub-commands)
from analysis.core.inputs import InputError
from models.spec import ModelSpec


class UserError(Exception):
    """Bad input from the user; the message is shown as is."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (the usage itself is one ``--help`` away)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def int_at_least(low: int):
    """An argparse type: a whole number of at least ``low``, else a one-line usage error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}" if low else
                                             f"must be 0 or more, got {value}")
        return value
    return parse


positive_int, nonnegative_int = int_at_least(1), int_at_least(0)


MODEL_FIELDS = ("model", "revision", "device", "dtype", "allow_pickle")


def add_option_flag(group, name: str, suppress: bool = False, schema=None, flag: str | None = None,
                    aliases: tuple[str, ...] = ()) -> None:
    """``--name`` (or ``flag``, its value still ``args.name``) for a field of an options schema (default
    :class:`analysis.training.options.FinetuneOptions`): its default (or none given unless typed, with
    ``suppress``), its choices, its help. Values are checked by the schema, not by argparse."""
    from analysis.core import options
    from analysis.training.options import FinetuneOptions

    schema = schema or FinetuneOptions
    kind, default = options.kind(name, schema), options.field_info(name, schema).default
    extra = ({"action": argparse.BooleanOptionalAction} if kind == "bool" else
             {"choices": options.choices(name, schema)} if kind == "choice" else
             {"action": "append", "metavar": name.upper()} if kind == "list" else {"metavar": name.upper()})
    group.add_argument(*aliases, flag or f"--{name.replace('_', '-')}", dest=name,
                       default=argparse.SUPPRESS if suppress else default,
                       help=options.help_text(name, schema).replace("%", "%%"), **extra)


def model_options(schema=None) -> argparse.ArgumentParser:
    """The options every analysis sub-command shares (the model fields as the options schema defines them). With a
    task's ``schema``, ``--head-from`` and ``--batch-size`` are its own fields' flags (their help and default), and
    only where it has them: a flag its run would not read is not offered (issue 53 item 13); without one (``info``),
    the generic pair."""
    p = Parser(add_help=False)
    g = p.add_argument_group("model and output")
    for name in MODEL_FIELDS:
        add_option_flag(g, name)
    if schema is not None:
        for name in ("head_from", "batch_size"):
            if name in schema.model_fields:
                add_option_flag(g, name, schema=schema)
    else:
        g.add_argument("--head-from", metavar="MODEL", help="read the layers with the pre-trained MLM head of this "
                       "masked LM (same family, hidden size and vocabulary), e.g. the model a classifier was "
                       "fine-tuned from")
        g.add_argument("--batch-size", type=positive_int, default=32, help="texts per forward pass (default 32)")
    g.add_argument("--out", type=Path, help="directory for the output files")
    return p


def spec_from_args(args: argparse.Namespace, device: str | None = None) -> ModelSpec:
    return ModelSpec(args.model, revision=args.revision, device=device or args.device, dtype=args.dtype,
                     allow_pickle=args.allow_pickle, head_from=getattr(args, "head_from", None))


_STAGED: list = []  # the staging folders of this command, made into their outputs when it succeeds


def prepare_out(out: Path) -> Path:
    """A staging folder that becomes ``out`` when the command succeeds (:mod:`analysis.core.staging`): until then a
    previous result in ``out`` stays whole, and a failed or interrupted command leaves it untouched."""
    from analysis.core.staging import staged

    try:
        context = staged(out)
        stage = context.__enter__()
    except InputError as exc:
        raise UserError(str(exc)) from None
    _STAGED.append(context)
    return stage


def finish_outputs(ok: bool) -> None:
    """Rename this command's staging folders into place (``ok``) or remove them."""
    while _STAGED:
        context = _STAGED.pop()
        if ok:
            context.__exit__(None, None, None)
        else:
            context.__exit__(RuntimeError, RuntimeError("the command failed"), None)


def write_json(out: Path | None, filename: str, payload: dict) -> Path | None:
    """Write ``payload`` to ``out/filename``; nothing when ``out`` is None."""
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / filename
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
