"""Submitting a job: every option checked first, so a bad one is a message and nothing is queued.

A job's ``kind`` (default ``finetune``) picks its checks from the registry (:mod:`jobs.kinds`): each kind's
``validate`` resolves its options schema (the keys of ``finetune --config`` files for a fine-tuning job) and
checks what the job will read, so a job keeps the values it was submitted with; a refusal is one
:class:`SubmitError` line. A job for Slurm also needs Slurm here (:func:`jobs.backends.check_available`).

A job from the browser (``browser=True``: the jobs page, the lens form) is checked as the browser's own input
before anything is read (:func:`browser_checked`, which each kind applies to its options): its data sources are
``demo``, a hub dataset *name* or a file under the data roots (:func:`analysis.core.dataroots.browser_source`), its
model a hub id or a folder under the model roots (:func:`analysis.core.dataroots.browser_model`), pickle loading
is off, and a sweep varies only what its kind lets it (:func:`submit_sweep`). The CLI trusts its user and reads what
it is given.
"""

from __future__ import annotations

from pathlib import Path

from analysis.core.inputs import InputError
from jobs import kinds
from jobs.backends import check_available, launch
from jobs.store import JobStore
from jobs.worker import ensure_worker
from models.loading import ModelLoadError, config_and_family
from models.spec import short_name


class SubmitError(ValueError):
    """The job was not queued; the message says why."""


def browser_checked(options):
    """``options`` as the browser may submit them, or an :class:`InputError`: within their browser bounds, no pickle
    loading, and every option that names a path (:func:`analysis.core.options.path_fields`, derived from the schema:
    never a list per kind) where the browser may point it, by its path kind (:func:`browser_path`): data under the
    data roots (stored resolved), models under the model roots, LayerLens's own folders under ``LAYERLENS_HOME``."""
    from analysis.core.options import check_browser_bounds, path_fields

    check_browser_bounds(options)
    if getattr(options, "allow_pickle", False):
        raise InputError("allow_pickle: pickle weights are never loaded for the browser (use the CLI)")
    checked = {}
    for name, kind in path_fields(type(options)).items():
        value = getattr(options, name)
        if value is None or value == "" or value == []:
            continue
        try:
            checked[name] = [browser_path(kind, str(v)) for v in value] if isinstance(value, list) \
                else browser_path(kind, str(value))
        except InputError as exc:
            raise InputError(f"{name}: {exc}") from None
    return options.replace(**checked)


def browser_path(kind: str, value: str) -> str:
    """``value`` of an option of path kind ``kind`` (:data:`analysis.core.options.PATH_KINDS`) as the browser may
    give it, or an :class:`InputError` that is the same whether the path is outside the roots or missing."""
    from analysis.core.dataroots import browser_model, browser_source
    from analysis.core.home import exports_dir, layerlens_home

    if kind == "data":
        return browser_source(value)
    if kind == "model":
        return browser_model(value)
    if kind == "models":  # a series: MODEL@revs, A,B,C or one folder, each name a model the browser may load
        names = [value.partition("@")[0]] if "@" in value else [v.strip() for v in value.split(",") if v.strip()]
        for name in names:
            browser_model(name)
        return value
    root = (exports_dir() if kind == "output" else layerlens_home()).resolve()
    resolved = Path(value).expanduser().resolve()
    if not resolved.is_relative_to(root):
        raise InputError(f"'{value}' is not under {root}, where a job from the browser may "
                         f"{'write' if kind == 'output' else 'read LayerLens folders'}")
    return str(resolved)


def validate(config: dict, browser: bool = False) -> tuple[dict, str]:
    """(the job's resolved options, every field, the device the job will run on) or :class:`SubmitError`: the
    checks of the job's kind (:mod:`jobs.kinds`), then, for a Slurm job, that Slurm is here. ``browser``: also
    :func:`browser_checked`, before anything is read."""
    name = config.get("kind", kinds.DEFAULT)
    kind = kinds.get(name)
    if kind is None:
        raise SubmitError(f"unknown job kind '{name}' (choose from {', '.join(kinds.names())})")
    try:
        if hasattr(kind, "resolve_refs"):  # a task's job: job:N as a model or a series, as the CLI resolves it
            config = kind.resolve_refs(config, lambda job_id: JobStore().get(job_id))
        options, device = kind.validate(config, browser_checked if browser else None, config_and_family)
        if options.get("backend") == "slurm":
            check_available()
    except (InputError, ModelLoadError, ValueError) as exc:
        raise SubmitError(str(exc)) from None
    return options, device


def job_name(options: dict) -> str:
    """``attention · demo · demo set · epochs 1, lr 0.003``: what the job does (its kind's label: a fine-tuning
    job's head), its model, then what its kind says of it (:mod:`jobs.kinds`: for fine-tuning the data, the preset
    and the training options that differ from what the model and the preset give by default)."""
    kind = kinds.of(options)
    return " · ".join([kind.label(options), short_name(options.get("model", "demo")), *kind.describe(options)])


def submit(config: dict, store: JobStore | None = None, name: str = "", start_worker: bool = True,
           group: str | None = None, browser: bool = False) -> int:
    """Validate and queue ``config`` (in sweep ``group``); start a local worker if none runs, or send it to
    Slurm (backend ``slurm``). ``browser``: submitted from the dashboard (:func:`browser_checked`). Returns the
    job id."""
    store = store or JobStore()
    config, device = validate(config, browser)
    job_id = store.submit(config, device, name or job_name(config), group, kinds.label(config))
    if config.get("backend") == "slurm":
        try:
            launch(store, job_id)
        except ValueError as exc:
            raise SubmitError(str(exc)) from None
    elif start_worker:
        ensure_worker(store)
    return job_id


def submit_sweep(config: dict, points: list[dict], store: JobStore | None = None, group: str | None = None,
                 start_worker: bool = True, browser: bool = False) -> tuple[str, list[int]]:
    """Queue one job per grid point (:func:`analysis.training.options.grid`) on top of ``config``, all in one ``group``
    (default: ``sweep <time>: <keys>``). Every point is checked before any is queued; from the ``browser`` a
    point varies only what the job's kind lets it (its ``sweepable()``: a fine-tuning job's
    :data:`analysis.training.options.SWEEPABLE`, a kind without one nothing) and each merged point is
    :func:`browser_checked`. Returns the group name and the job ids."""
    import time

    sweepable = getattr(kinds.of(config), "sweepable", tuple)() if browser else ()
    checked = []
    for point in points:
        refused = [k for k in point if browser and k not in sweepable]
        try:
            if refused:
                raise SubmitError(f"{', '.join(refused)} cannot be swept from the browser: a sweep varies the "
                                  "training options only")
            checked.append(validate({**config, **point}, browser))
        except SubmitError as exc:
            raise SubmitError(f"{', '.join(f'{k}={v}' for k, v in point.items())}: {exc}") from None
    store = store or JobStore()
    group = group or f"sweep {time.strftime('%Y-%m-%d %H:%M:%S')}: {' x '.join(points[0]) if points else ''}"
    ids = [submit(options, store, start_worker=start_worker, group=group, browser=browser)
           for options, _ in checked]
    return group, ids
