"""Submitting a fine-tuning job: every option checked first, so a bad one is a message and nothing is queued.

The options are those of ``python -m analysis finetune`` (the keys of its ``--config`` file). Checked at
submit: option types and values (negative learning rate, unknown truncation, ...), that the model's config
loads and the head fits it (``gru-share-5`` on 12 layers, ``pooler`` on DistilBERT), that the data sources
read, that the text/pair/label columns exist and that the training labels have at least two classes.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from analysis.cli import build_parser
from analysis.cli_base import UserError
from analysis.cli_finetune import apply_config_file, finetune_config
from analysis.finetune import read_split
from analysis.heads import build_head
from analysis.inputs import InputError
from analysis.taskdata import label_ids
from jobs.store import JobStore
from jobs.worker import ensure_worker
from models.loading import ModelLoadError, ModelSpec, _config_and_family

OPTIONS = "options.json"


class SubmitError(ValueError):
    """The job was not queued; the message says why."""


def parsed(config: dict):
    """The ``finetune`` arguments for ``config`` (as a ``--config`` file would give them)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / OPTIONS
        path.write_text(json.dumps(config, default=str))
        argv = ["finetune", "--config", str(path), "--out", str(Path(tmp) / "out")]
        parser = build_parser()
        return apply_config_file(parser, parser.parse_args(argv), argv)


def validate(config: dict) -> tuple[dict, str]:
    """(the options as given, the device the job will run on) or :class:`SubmitError`."""
    config = {k: v for k, v in config.items() if v is not None and k not in ("out", "config")}
    try:
        args = parsed({k: v for k, v in config.items() if k != "num_processes"})
        ft = finetune_config(args)
        if not args.train:
            raise UserError("no training data: set train (a file, 'demo' or hf:NAME[/CONFIG]:SPLIT)")
        spec = ModelSpec(args.model, revision=args.revision, device=args.device, dtype=args.dtype,
                         allow_pickle=args.allow_pickle).resolved()
        model_config, _ = _config_and_family(spec)
        train = read_split(args.train, args.text_column, args.pair_column, args.label_column)
        others = [read_split(s, args.text_column, args.pair_column, args.label_column) for s in (args.val, args.test)
                  if s]
        label_ids(train.labels, *(o.labels for o in others))
        build_head(ft.head, model_config.num_hidden_layers, model_config.hidden_size, 2,
                   pooler=object() if getattr(model_config, "model_type", "") not in ("distilbert", "electra")
                   else None)
    except SystemExit:
        raise SubmitError("invalid options (see python -m analysis finetune --help)") from None
    except (UserError, InputError, ModelLoadError, ValueError) as exc:
        raise SubmitError(str(exc).removeprefix(f"{OPTIONS}: ")) from None
    return config, spec.device


def submit(config: dict, store: JobStore | None = None, name: str = "", start_worker: bool = True) -> int:
    """Validate and queue ``config``; start a worker if none runs. Returns the job id."""
    store = store or JobStore()
    config, device = validate(config)
    job_id = store.submit(config, device, name or f"{config.get('head', 'cls')} on {config.get('train')}")
    if start_worker:
        ensure_worker(store)
    return job_id
