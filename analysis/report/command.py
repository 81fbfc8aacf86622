"""The command line that reproduces a run, rebuilt from its ``run.json`` (:class:`analysis.core.task.RunRecord`).

A run.json holds the task's name (the sub-command: ``probe``, ``heads stats``), the model (``model_spec``, else
``model``) and the options, either as an ``options`` object or among the task's other facts. With the task's options
schema (the task layer passes it for a registered task) each field becomes its flag, defaults left out; without
one, every key of ``options`` is written as ``--key-name value`` and the command is said to be approximate. What
cannot be given as a flag (a value that is a list, an option set only by a job or a page, a key no flag matches) is
named in the notes, never dropped silently."""

from __future__ import annotations

import shlex
from pathlib import Path

MODEL_KEYS = ("model", "revision", "device", "dtype", "allow_pickle", "head_from")
# top-level keys that are the record's own, never an option of the task
RECORD_KEYS = {"task", "versions", "options", "model_spec", "fingerprint"}


def _same(value, default) -> bool:
    if value == default:
        return True
    return default is not None and not isinstance(default, bool) and str(value) == str(default)


def _short(value, limit: int = 100) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _model_flags(record: dict, options: dict) -> list[str]:
    spec = record.get("model_spec") if isinstance(record.get("model_spec"), dict) else {}
    model = record.get("model") if isinstance(record.get("model"), str) else None
    if isinstance(options.get("model"), list):  # a task that takes several models (compare): --model once each
        parts = [w for m in options["model"] for w in ("--model", str(m))]
    else:
        name = spec.get("name") or model or options.get("model")
        parts = ["--model", str(name)] if name else []
    for key in ("revision", "dtype", "device"):
        value = spec.get(key, options.get(key))
        if value not in (None, "", "auto"):
            parts += [f"--{key}", str(value)]
    if spec.get("allow_pickle", options.get("allow_pickle")) is True:
        parts.append("--allow-pickle")
    head_from = spec.get("head_from") or options.get("head_from")
    if head_from:
        parts += ["--head-from", str(head_from)]
    return parts


def _flag_value(flag: str, value, is_bool: bool) -> list[str] | None:
    """The words of ``flag`` set to ``value`` (None: a value no flag can give)."""
    if is_bool or isinstance(value, bool):
        return [flag] if value else [f"--no-{flag[2:]}"]
    if value is None or isinstance(value, (list, tuple, dict)):
        return None
    return [flag, str(value)]


def _from_schema(record: dict, options: dict, schema, flags: dict, hidden) -> tuple[list[str], list[str]]:
    from analysis.core.options import kind

    parts, notes, unrecorded, unflagged, required = [], [], [], [], []
    for name, field in schema.model_fields.items():
        if name in MODEL_KEYS or name == "out":
            continue
        if name in options:
            value = options[name]
        elif name in record and name not in RECORD_KEYS:
            value = record[name]
        else:
            (required if field.is_required() else unrecorded).append(name)
            continue
        if isinstance(value, dict) and isinstance(value.get("path"), str):
            value = value["path"]  # an input recorded with its counts (structure's train and test)
        if _same(value, field.default):
            continue
        if name in hidden:
            unflagged.append(f"{name}={_short(value)} (set by a job or a page only)")
            continue
        if isinstance(value, list) and kind(name, schema) == "str" and value and \
                all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in value):
            value = ",".join(map(str, value))  # a resolved list (layers: 0,4,8) as the text option takes it
        flag = flags.get(name, f"--{name.replace('_', '-')}")
        if kind(name, schema) == "list" and isinstance(value, list):  # given once per value
            words = [w for v in value for w in (flag, str(v))]
        else:
            words = _flag_value(flag, value, kind(name, schema) == "bool")
        if words is None:
            unflagged.append(f"{name}={_short(value)}")
        else:
            parts += words
    for name in required:
        parts += [flags.get(name, f"--{name.replace('_', '-')}"), name.upper()]
        notes.append(f"{name} is required but run.json does not record it: fill in {name.upper()}")
    extra = [k for k in options if k not in schema.model_fields and k not in MODEL_KEYS]
    if extra:
        notes.append("recorded options that are not flags of this command, left out: " + ", ".join(extra))
    if unflagged:
        notes.append("values no flag of this command can give, left out: " + "; ".join(unflagged))
    if unrecorded:
        notes.append("not recorded in run.json, so their defaults are assumed: " + ", ".join(unrecorded))
    return parts, notes


def _generic(options: dict) -> tuple[list[str], list[str]]:
    parts, unflagged = [], []
    for key, value in options.items():
        if key in MODEL_KEYS or key == "out" or value is None:
            continue
        words = _flag_value(f"--{str(key).replace('_', '-')}", value, False)
        if words is None or (isinstance(value, bool) and not value):
            if words is None:
                unflagged.append(str(key))
            continue
        parts += words
    notes = ["approximate: no options schema is known here for this task, so each recorded option is written as "
             "--its-name; a key that is not a flag of the command must be removed by hand"]
    if unflagged:
        notes.append("recorded options with list or object values, left out: " + ", ".join(unflagged))
    return parts, notes


def command_line(record: dict, schema=None, flags: dict[str, str] | None = None,
                 hidden: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """``(command, notes)``: the ``layerlens`` command that reproduces the run ``record`` (run.json as a dict), and
    what makes it approximate (empty: the recorded options are all there). ``schema`` is the task's options schema
    (a pydantic model), ``flags`` its renamed flags (field -> flag), ``hidden`` its options with no flag."""
    task = str(record.get("task") or "").split()
    options = record.get("options") if isinstance(record.get("options"), dict) else {}
    notes = [] if task else ["run.json names no task: write the sub-command in place of TASK"]
    words = ["layerlens", *(task or ["TASK"])] + _model_flags(record, options)
    if schema is not None:
        parts, more = _from_schema(record, options, schema, flags or {}, hidden)
    elif options:
        parts, more = _generic(options)
    else:
        parts, more = [], ["approximate: run.json records no options object and no schema is known here for this "
                           "task: only the model flags are given"]
    words += parts + ["--out", "OUT_DIR"]
    notes += more
    processes = record.get("processes")
    if isinstance(processes, int) and processes > 1:
        notes.append(f"the run used {processes} processes: start it with accelerate launch --num_processes "
                     f"{processes} -m analysis ... (the rest as above)")
    if record.get("rows_file"):
        notes.append(f"{record['rows_file']} holds the rows the page read (typed, uploaded or sampled), kept beside "
                     "run.json (the report's files): run the command in the folder that holds it; its rows are "
                     "numbered by their line in rows.jsonl (0, 1, ...) where the page's tables number them by their "
                     "row in the file they were sampled from")
    elif any(isinstance(w, str) and w and not w.startswith("-") and "/" in w and not Path(w).is_absolute()
             for w in parts):
        notes.append("relative paths are as recorded: relative to the folder the run was started from")
    return " ".join(shlex.quote(str(w)) for w in words), notes
