"""The one resolver of a second model's name (every "Compare with" field, ``compare --model`` and a job's epochs).

A reference is one of
- a model name (a hub id or a local folder), labelled as itself, read by its own MLM head;
- ``random``: the base model's architecture with seeded random weights (``random:<base>``, head included), the
  control a reviewer asks for, labelled ``<base> with random weights``;
- ``job:N``: job N's fine-tuned encoder (:func:`analysis.training.runs.fine_tuned`), read by the MLM head of the
  model it started from, labelled as the job store labels it (``job #3 (cls, demo)``).

The job store is not imported here (the library never imports ``jobs``): the caller passes its lookup, and the
check a path must pass (the browser's :func:`analysis.core.dataroots.browser_model`; the CLI trusts its user).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from analysis.core.inputs import InputError
from analysis.training.runs import fine_tuned
from models.spec import RANDOM_PREFIX

RANDOM = "random"
JOB_PREFIX = "job:"


@dataclasses.dataclass(frozen=True)
class ModelRef:
    """What to load (``name``), whose MLM head reads it (``head_from``; None: its own) and how to label it."""

    name: str
    head_from: str | None
    label: str


def is_job(ref: str) -> bool:
    return ref.startswith(JOB_PREFIX) and ref[len(JOB_PREFIX):].isdigit()


def resolve(ref: str, base: str, find_job: Callable[[int], object | None],
            allowed: Callable[[str], str] = str, head_from: str | None = None, need_head: bool = False) -> ModelRef:
    """The :class:`ModelRef` of ``ref`` next to the base model ``base``. ``find_job(N)``: the job record (with
    ``artifacts``, ``metrics``, ``status``, ``label``) or None. ``allowed(path)``: the path, or an
    :class:`InputError` (every name it resolves passes it: a job's encoder and its lent head too).
    ``head_from``: the head lent to a job whose base recorded none (the CLI's ``--head-from``); with ``need_head``
    a job without a head to lend is refused (the pages read every model with an MLM head)."""
    ref = ref.strip()
    if ref.lower() == RANDOM:
        return ModelRef(f"{RANDOM_PREFIX}{base.removeprefix(RANDOM_PREFIX)}", None, f"{base} with random weights")
    if not ref.startswith(JOB_PREFIX):
        return ModelRef(allowed(ref), None, ref)
    job = find_job(int(ref[len(JOB_PREFIX):])) if is_job(ref) else None
    encoder, head = fine_tuned(job.artifacts, job.metrics) if job is not None else (None, None)
    head = head or head_from
    if job is None or (need_head and head is None):
        raise InputError(f"'{ref}': no finished job whose fine-tuned layers an MLM head can read (see the jobs "
                         "page, or `layerlens jobs list`)")
    if getattr(job, "status", "succeeded") != "succeeded" or encoder is None:
        raise InputError(f"{ref}: {job.label} kept no fine-tuned checkpoint (not finished, k-fold, or its artifacts "
                         "were deleted)")
    try:
        return ModelRef(allowed(str(encoder)), head and allowed(head), job.label)
    except InputError as exc:
        raise InputError(f"{ref} ({job.label}): {exc}") from None
