"""The checkpoints of a series, in order, and the check that they are one model at different times.

A series is named by one string (``--checkpoints``):

- ``DIR``: a folder whose sub-folders are ``save_pretrained`` checkpoints (a ``config.json`` each), ordered by the
  step in their names (the last number, with ``k``/``M`` read as thousands/millions: ``checkpoint-500``,
  ``step_20k``); a name without a number cannot be placed and is refused;
- a fine-tuning job's artifacts folder (``job:N``, resolved by the door): its saved epochs, ``epochs/<e>/encoder``,
  each read by the MLM head the job's ``metrics.json`` names (``mlm_head_from``), after "epoch 0", that masked LM
  itself (the model the job was fine-tuned from, or its further pre-trained one);
- ``MODEL@rev1,rev2,...``: hub revisions (branches or tags such as MultiBERTs' ``step_20k``), in the order given;
- ``A,B,C``: models in the order given.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

from analysis.core.inputs import InputError

NUMBER = re.compile(r"(\d+(?:\.\d+)?)([kKmM]?)")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One point of a series: its label, its step (None where the name has none), what to load and whose MLM head
    reads it."""

    label: str
    step: int | None
    model: str
    revision: str | None = None
    head_from: str | None = None


def step_of(name: str) -> int | None:
    """The last number in ``name`` (``k`` x 1,000, ``M`` x 1,000,000), or None."""
    found = NUMBER.findall(name)
    if not found:
        return None
    value, unit = found[-1]
    return int(round(float(value) * {"": 1, "k": 1_000, "K": 1_000, "m": 1_000_000, "M": 1_000_000}[unit]))


def parse(spec: str, job_head: Callable[[Path], str | None],
          allowed: Callable[[str], object] | None = None) -> list[Checkpoint]:
    """The checkpoints ``spec`` names (module docstring), in order; a one-line error for a series that cannot be.
    ``job_head(folder)``: the MLM head a fine-tuning run's folder records
    (:func:`analysis.training.runs.recorded_head`, passed in by the task layer: a technique imports no other).
    ``allowed(name)``: raises for a model or folder the caller may not reach (the browser's
    :func:`analysis.core.dataroots.browser_model`), called on every name ``spec`` gives before anything of it is read
    (a folder outside the roots is never listed), and on every checkpoint and head found."""
    spec = spec.strip()
    if not spec:
        raise InputError("--checkpoints is empty: give a folder of checkpoints, job:N, MODEL@rev1,rev2 or A,B,C")
    points = _parse(spec, job_head, allowed or (lambda name: name))
    for point in points if allowed else ():
        allowed(point.model)
        if point.head_from:
            allowed(point.head_from)
    return points


def _parse(spec: str, job_head: Callable[[Path], str | None], allowed: Callable[[str], object]) -> list[Checkpoint]:
    if "@" in spec:
        model, _, revisions = spec.partition("@")
        allowed(model.strip())
        revs = [r.strip() for r in revisions.split(",") if r.strip()]
        return _at_least_two([Checkpoint(r, step_of(r), model.strip(), r) for r in revs], spec)
    for name in [s.strip() for s in spec.split(",") if s.strip()] if "," in spec else [spec]:
        allowed(name)
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "epochs").is_dir() and not (path / "config.json").is_file():
        return _at_least_two(job_epochs(path, job_head(path)), spec)
    if path.is_dir() and not (path / "config.json").is_file():
        return _at_least_two(folder(path), spec)
    if "," in spec:
        names = [s.strip() for s in spec.split(",") if s.strip()]
        return _at_least_two([Checkpoint(Path(n).name or n, step_of(Path(n).name) or i, n)
                              for i, n in enumerate(names)], spec)
    raise InputError(f"--checkpoints {spec}: not a series (a folder of checkpoints, job:N, MODEL@rev1,rev2 or "
                     "A,B,C with at least two)")


def _at_least_two(points: list[Checkpoint], spec: str) -> list[Checkpoint]:
    if len(points) < 2:
        raise InputError(f"--checkpoints {spec}: {len(points)} checkpoint(s); a series needs at least two")
    return points


def folder(path: Path) -> list[Checkpoint]:
    """The checkpoints under ``path``, ordered by the step in their names."""
    found = sorted(p for p in path.iterdir() if (p / "config.json").is_file())
    unplaced = [p.name for p in found if step_of(p.name) is None]
    if unplaced:
        raise InputError(f"{path}: cannot order {', '.join(unplaced[:3])} (no step number in the name; name them "
                         "e.g. step-100, checkpoint-200)")
    return sorted((Checkpoint(p.name, step_of(p.name), str(p)) for p in found), key=lambda c: (c.step, c.label))


def job_epochs(artifacts: Path, head: str | None) -> list[Checkpoint]:
    """A fine-tuning job's saved epochs (``epochs/<e>/encoder``), read by ``head``, the MLM head it records."""
    epochs = sorted(int(p.name) for p in (artifacts / "epochs").iterdir()
                    if p.name.isdigit() and (p / "encoder" / "config.json").is_file())
    if not epochs:
        raise InputError(f"{artifacts}: the job kept no epoch checkpoints (fine-tune with save_epoch_checkpoints on "
                         "to make a series of its epochs)")
    start = [Checkpoint("epoch 0", 0, head)] if head else []  # the masked LM it was fine-tuned from
    return start + [Checkpoint(f"epoch {e}", e, str(artifacts / "epochs" / str(e) / "encoder"), head_from=head)
                    for e in epochs]


def identity(point: Checkpoint) -> dict:
    """What must be the same along a series: the architecture (family, depth, width, heads) and the tokenizer's
    vocabulary (a digest), read without loading weights."""
    from transformers import AutoConfig, AutoTokenizer

    from models.spec import ModelSpec

    source = ModelSpec(point.model, revision=point.revision).source  # "demo" is the bundled model's folder
    try:
        config = AutoConfig.from_pretrained(source, revision=point.revision)
        vocab = AutoTokenizer.from_pretrained(source, revision=point.revision).get_vocab()
    except (OSError, ValueError) as exc:
        raise InputError(f"checkpoint {point.label} ({point.model}): {str(exc).splitlines()[0]}") from None
    digest = hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()[:16]
    return {"architecture": (config.model_type, config.num_hidden_layers, config.hidden_size,
                             config.num_attention_heads), "tokenizer": digest}


def check_one_model(points: list[Checkpoint]) -> dict:
    """The series' one identity; a one-line error naming the first checkpoint whose architecture or tokenizer
    differs from the first one's."""
    first = identity(points[0])
    for point in points[1:]:
        other = identity(point)
        for what in ("architecture", "tokenizer"):
            if other[what] != first[what]:
                shown = {"architecture": lambda v: "{} with {} layers, hidden {}, {} heads".format(*v),
                         "tokenizer": lambda v: f"vocabulary {v}"}[what]
                raise InputError(f"checkpoint {point.label} differs from {points[0].label} in its {what} "
                                 f"({shown(other[what])} vs {shown(first[what])}): a series is one model at "
                                 "different times")
    return first
