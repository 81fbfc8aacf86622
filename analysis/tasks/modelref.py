"""The one resolver of a second model's name (every "Compare with" field, ``compare --model`` and a job's epochs).

A reference is one of
- a model name (a hub id or a local folder), labelled as itself, read by its own MLM head;
- ``random``: the base model's architecture with seeded random weights (``random:<base>``, head included), the
  control a reviewer asks for, labelled ``<base> with random weights``;
- ``job:N``: job N's fine-tuned encoder (:func:`analysis.training.runs.fine_tuned`), read by the MLM head of the
  model it started from, labelled as the job store labels it (``job #3 (cls, demo)``).

A sweep group (:func:`resolve_group`) resolves to the model its jobs started from and its finished jobs, each then
a ``job:N`` reference. The job store is not imported here (the library never imports ``jobs``): the caller passes
its lookup (or its jobs), and the check a path must pass (the browser's
:func:`analysis.core.dataroots.browser_model`; the CLI trusts its user).
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


@dataclasses.dataclass(frozen=True)
class Group:
    """A sweep group: the model its jobs started from (``base``), its finished jobs with a checkpoint (``members``,
    by id) and the ids of the others (``skipped``)."""

    name: str
    base: str
    members: tuple
    skipped: tuple[int, ...]

    def refs(self, allowed: Callable[[str], str] = str, head_from: str | None = None) -> list[ModelRef]:
        """Each member's fine-tuned model, resolved as its ``job:N`` is (:func:`resolve`, from the member records
        already read): the encoder, the MLM head it lends (else ``head_from``), the job's label."""
        by_id = {j.id: j for j in self.members}
        return [resolve(f"{JOB_PREFIX}{j.id}", self.base, by_id.get, allowed, head_from) for j in self.members]


def resolve_group(jobs, group: str, where: str = "") -> Group:
    """The :class:`Group` ``group`` of ``jobs`` (job records: ``id``, ``group``, ``status``, ``config``,
    ``artifacts``, ``metrics``), or an :class:`InputError` naming why it cannot be compared (``where``: the store,
    named in the message when the group is unknown)."""
    members = sorted((j for j in jobs if j.group == group), key=lambda j: j.id)
    if not members:
        raise InputError(f"no group '{group}'" + (f" under {where}" if where else "") + " (layerlens jobs list shows "
                         "each job's group)")
    done = [j for j in members if j.status == "succeeded" and fine_tuned(j.artifacts, j.metrics)[0] is not None]
    if not done:
        raise InputError(f"group '{group}': none of its {len(members)} jobs has finished with a checkpoint (k-fold "
                         "runs keep none)")
    bases = {j.config.get("model") for j in done}
    if len(bases) > 1:
        raise InputError(f"group '{group}' fine-tuned different models ({', '.join(sorted(map(str, bases)))}): "
                         "compare them as two checkpoints (--model)")
    return Group(group, done[0].config.get("model"), tuple(done), tuple(j.id for j in members if j not in done))
