"""The job kinds: what a job can do, one technique's ``job.py`` each, listed here one line per kind. This is the
only module of ``jobs`` that imports a technique; :mod:`jobs.submit`, :mod:`jobs.run` and :mod:`jobs.store`
iterate :data:`KINDS`, so a new kind is one ``job.py`` and one line below.

A kind is a module (or any object) with:

- ``NAME``: the kind's name, the ``kind`` of a job's options (a job without one is a :data:`DEFAULT` job);
- ``OPTIONS``: its options schema (an :class:`analysis.core.options.Options`);
- ``STAGED``: whether its artifacts appear whole when complete (:func:`analysis.core.staging.staged`) or are written
  straight into the job's ``artifacts`` folder (checkpoints a later job resumes from);
- ``label(config)``: what the store and the pages call the job's work (``tuned lens``; a fine-tuning job's head);
- ``describe(config)``: the job name's parts after the label and the model;
- ``validate(config, browser, model_config)``: (the options to store, the device), or an ``InputError``,
  ``ModelLoadError`` or ``ValueError`` that says why (:func:`jobs.submit.validate` makes it a ``SubmitError``);
  ``browser`` is None or the browser's check of the options (:func:`jobs.submit.browser_checked`),
  ``model_config(spec)`` reads the model's (config, family);
- ``run(config, out, control)``: the job's work with its artifacts in ``out``, returning its metrics;
  ``control`` (:class:`jobs.run.Control`) brings the log, the progress reporter, the stop request (Cancel), the
  earlier jobs' artifacts and the store's JSON conversion, so a kind never imports ``jobs``;
- optionally ``OPENED_ON``: (page, how) where a finished job's results open (:func:`opened_on`);
- optionally ``sweepable()``: the options a sweep from the browser may vary (none without it);
- optionally ``stage(progress)``: where a running job is, in words (``probes: 3 of 20 steps · 72% of the job``),
  and ``note(metrics)``: what a finished one adds (``resumed after 4 passes of an earlier job``).
"""

from __future__ import annotations

from analysis.probe import job as lens  # train a tuned lens (analysis.probe.lens)
from analysis.structure import job as structure  # probe each layer for linguistic structure (analysis.structure)
from analysis.tasks import TASKS  # the task layer: every task runs as a job too
from analysis.tasks.heads import KIND as heads  # what every attention head does (analysis.heads)
from analysis.tasks.kind import TaskKind
from analysis.tokens import job as tokens  # extract a corpus's token vectors, index them (analysis.tokens)
from analysis.training import job as finetune  # fine-tune a head (analysis.training)


class Recorded:
    """A hand-written kind whose run.json gets the options its task's door records (``complete_record``): the job's
    run.json is the CLI's, and its report's command reproduces it."""

    def __init__(self, kind, task: str):
        self._kind, self._task = kind, task

    def __getattr__(self, name):
        return getattr(self._kind, name)

    def run(self, config: dict, out, control) -> dict:
        from analysis.core.task import complete_record

        metrics = self._kind.run(config, out, control)
        complete_record(out, TASKS[self._task].job_options(config))
        return metrics


KINDS = {kind.NAME: kind for kind in (finetune, Recorded(lens, "lens train"), Recorded(structure, "structure"),
                                      Recorded(tokens, "tokens extract"), heads)}  # in the order the messages list them
KINDS.update({name: TaskKind(task) for name, task in TASKS.items() if (task.kind or name) not in KINDS})
DEFAULT = finetune.NAME  # the kind of a job whose options name none


def names() -> tuple[str, ...]:
    """Every kind's name, in :data:`KINDS`' order."""
    return tuple(KINDS)


def get(name: str):
    """The kind called ``name``, or None."""
    return KINDS.get(name) if isinstance(name, str) else None


def of(config: dict):
    """The kind of a stored job's options (a job without ``kind``, or of a kind this version does not know, runs and
    is named as a :data:`DEFAULT` job, as it always was)."""
    return get(config.get("kind")) or KINDS[DEFAULT]


def label(config: dict) -> str:
    """What the store and the pages call a job's work (``linguistic structure``; a fine-tuning job's head)."""
    return of(config).label(config)



def opened_on(job) -> tuple[str, str] | None:
    """(the page, how) where ``job``'s results open once it has succeeded, or None (its files and report are on the
    jobs page)."""
    return getattr(of(job.config), "OPENED_ON", None) if job.status == "succeeded" else None


def stage(job) -> str:
    """A job's stage in words, for the jobs table and the pages: ``cancelling…`` from the Cancel until its process
    has stopped; a running job's stage (its kind's ``stage``); a finished job's note (its kind's ``note``)."""
    kind = of(job.config)
    if job.status == "running":
        if job.cancel_requested:
            return "cancelling… (it stops at its next step)"
        return kind.stage(job.progress or {}) if hasattr(kind, "stage") else ""
    if job.status in ("succeeded", "failed", "cancelled") and hasattr(kind, "note"):
        return kind.note(job.metrics or {})
    return ""
