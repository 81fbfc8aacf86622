"""What a fine-tuning job left on disk (:class:`JobRun`): its options, metrics, per-epoch validation vectors and
its fine-tuned encoder (:func:`fine_tuned`), read by the comparisons without knowing the job store."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from analysis.core.inputs import InputError
from analysis.core.store import MANIFEST, VectorSet, adopt
from models.loading import ModelSpec

EPOCH_VECTORS = "val_cls.npy"  # an epoch folder's one shard: its vector set's manifest names it


def epoch_vectors(artifacts: Path, epoch: int) -> VectorSet | None:
    """Epoch ``epoch``'s validation [CLS] vectors, ``(L + 1, n, hidden)`` float16, as the layered vector set of
    ``epochs/<e>/`` (shard ``val_cls.npy``, row metadata ``val_ids.json``: each row's example id and label id).
    A job written before the sets existed gets its manifest now (held in memory where the folder is read-only).
    None when the job kept no vectors for that epoch or they are damaged."""
    directory = Path(artifacts) / "epochs" / str(epoch)
    if (directory / MANIFEST).is_file():
        try:
            return VectorSet.open(directory)
        except InputError:
            return None
    if (directory / EPOCH_VECTORS).is_file():
        return adopt(directory, directory / EPOCH_VECTORS, each_row=EACH_ROW)
    return None


EACH_ROW = "a validation row, in val_ids.json's order"


def fine_tuned(artifacts: Path, metrics: dict | None) -> tuple[Path | None, str | None]:
    """``(encoder, head)`` a fine-tuning job left: its fine-tuned encoder folder (None when it kept none: k-fold,
    not finished, artifacts deleted) and the model whose MLM head can read it (``metrics.json``'s
    ``mlm_head_from``, :func:`head_from`; None when the base had no MLM head of its own)."""
    encoder = Path(artifacts) / "checkpoint" / "encoder"
    return (encoder if encoder.is_dir() else None), head_from(artifacts, metrics)


def head_from(artifacts: Path, metrics: dict | None) -> str | None:
    """``metrics.json``'s ``mlm_head_from``: a model name, or a folder of the run itself (``further_pretrained``,
    recorded relative to the run's folder, which a staged ``--out`` renames), returned as its path."""
    head = (metrics or {}).get("mlm_head_from")
    if head and not Path(head).is_absolute() and (Path(artifacts) / head).is_dir():
        return str(Path(artifacts) / head)
    if head and Path(head).is_absolute() and not Path(head).exists() and (Path(artifacts) / Path(head).name).is_dir():
        return str(Path(artifacts) / Path(head).name)  # a run before the relative record: its staging folder's path
    return head


def recorded_head(artifacts: Path) -> str | None:
    """The MLM head a run folder's ``metrics.json`` records (:func:`head_from`), or None (no metrics.json)."""
    metrics = Path(artifacts) / "metrics.json"
    return head_from(artifacts, json.loads(metrics.read_text())) if metrics.is_file() else None


def classifier_checkpoint(source: str | Path) -> Path | None:
    """The folder of a fine-tuning job's saved classifier that ``source`` names (the folder holding ``head.json``,
    ``head.safetensors`` and ``encoder/``, given as itself or as its ``encoder/``), or None."""
    path = Path(source)
    for folder in (path, path.parent):
        if (folder / "head.json").is_file() and (folder / "head.safetensors").is_file() \
                and (folder / "encoder").is_dir():
            return folder
    return None


@dataclasses.dataclass(frozen=True)
class JobRun:
    """What a finished fine-tuning job left: its artifacts folder, its options (as stored: resolved), its
    ``metrics.json`` and how the pages name it (``job #3 (cls, demo)``)."""

    artifacts: Path
    config: dict
    metrics: dict
    label: str

    @property
    def options(self):
        from analysis.training.options import resolve

        return resolve(self.config)

    def base_spec(self, device: str | None = None) -> ModelSpec:
        """The model the job was fine-tuned from (its ``model``, revision, dtype; the CLI's device)."""
        spec = self.options.spec()
        return dataclasses.replace(spec, device=device or spec.device)

    def checkpoint_spec(self, device: str = "cpu") -> ModelSpec | None:
        """The fine-tuned encoder read by the MLM head of the model it started from, or None (k-fold: no
        checkpoint; a base without an MLM head of its own: no head to lend)."""
        encoder, head = fine_tuned(self.artifacts, self.metrics)
        return None if encoder is None else ModelSpec(str(encoder), device=device, head_from=head)

    def epochs(self) -> list[int]:
        """The epochs whose validation vectors are on disk, in order."""
        root = self.artifacts / "epochs"
        found = [int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / EPOCH_VECTORS).is_file()
                 and (p / "val_ids.json").is_file()] if root.is_dir() else []
        return sorted(found)

    def vectors(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s validation [CLS] vectors, ``(L + 1, n, hidden)``, memory-mapped (float16)."""
        found = epoch_vectors(self.artifacts, epoch)
        if found is None:
            raise InputError(f"{self.label}: the vectors of epoch {epoch} "
                             f"({self.artifacts / 'epochs' / str(epoch) / EPOCH_VECTORS}) are damaged")
        return found.array()

    def checkpoint_epoch(self) -> int | None:
        """The epoch whose weights ``checkpoint/`` holds: the last one trained, or under early stopping the first
        epoch of least validation loss (what :func:`analysis.training.train.train` restores)."""
        history = self.metrics.get("history") or []
        if not history or not (self.artifacts / "checkpoint").is_dir():
            return None
        if self.options.early_stopping:
            return int(min(history, key=lambda h: (h["val_loss"], h["epoch"]))["epoch"])
        return int(history[-1]["epoch"])


def job_run(artifacts: Path, config: dict, metrics: dict | None, label: str) -> JobRun:
    """A :class:`JobRun`, or an :class:`InputError` saying why the job has no epochs to compare."""
    if config.get("kind", "finetune") != "finetune":
        raise InputError(f"{label} is not a fine-tuning job: it has no epochs to compare")
    if not metrics:
        raise InputError(f"{label} has not finished (no metrics.json): compare it when it has")
    run = JobRun(Path(artifacts), config, metrics, label)
    if run.options.folds > 1:
        raise InputError(f"{label} ran k-fold cross-validation: its folds keep no per-epoch vectors of one model")
    if not run.epochs():
        raise InputError(f"{label} kept no per-epoch vectors (epochs/<e>/val_cls.npy; its option save_vectors "
                         "was off, or its artifacts were deleted)")
    return run
