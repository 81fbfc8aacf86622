"""The epochs of one fine-tuning job against the model it started from (issue 28: "the epochs of one job, from
``epochs/<e>/``, no recomputation"; Song et al. 2020 Fig. 2 sets epoch 1 against epoch 6).

Every epoch of a job leaves ``epochs/<e>/val_cls.npy``: the [CLS] vector of every hidden state of the validation
rows, ``(L + 1, n, hidden)`` float16, in the order of ``val_ids.json`` (:func:`analysis.training.train.save_epoch`).
These are compared with the base model's [CLS] vectors of the same rows, tokenised as the job tokenised them (its length
limit and truncation), extracted once and cached (:func:`analysis.atlas.atlas.representations`). Per epoch and layer:
the CKA, the probe accuracies with McNemar, movers and neighbours, as :func:`analysis.compare.run.compare_pair`
computes them for any pair; the aligned map is one PCA per layer of the base and every epoch (each rotated onto the
base, as its movement is measured) pooled, so the epoch slider moves only what changed. A job keeps one
checkpoint (the last epoch's weights, or the best epoch's under early stopping): the reconstruction change and the
classifier's own predictions are for that epoch only.

Nothing here reads the job store (:mod:`analysis` does not import :mod:`jobs`): the caller passes what a job left,
:class:`JobRun`.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from analysis.compare.checks import check_rows
from analysis.compare.options import CompareConfig
from analysis.compare.run import (
    CompareResult,
    add_head_predictions,
    add_reconstruction,
    aligned_maps_many,
    compare_pair,
    run_info,
)
from analysis.core.inputs import InputError, TextInputs
from analysis.tasks.comparing import own_predictions, reconstructions
from analysis.training.runs import JobRun
from models.loading import LoadedModel


def validation_rows(run: JobRun) -> TextInputs:
    """The rows the epochs' vectors are of, in their order: the job's validation file, else the rows it held out of
    its training file (the same stratified split, :func:`analysis.training.finetune.split_off`); checked against
    ``val_ids.json`` (an :class:`InputError` if the data changed since)."""
    from analysis.training.finetune import split_off, split_reader

    options = run.options
    read = split_reader(options)
    if options.val:
        rows = read(options.val)
    else:
        rows = split_off(read(options.train), options.training().val_fraction, options.training().seed)[1]
    first = run.epochs()[0]
    meta = json.loads((run.artifacts / "epochs" / str(first) / "val_ids.json").read_text())
    if list(rows.ids) != list(meta["example_id"]):
        raise InputError(f"{run.label}: its validation rows cannot be read back as they were (the data file "
                         "changed since the job ran?)")
    return rows


def compare_epochs(base: LoadedModel, run: JobRun, config: CompareConfig | None = None,
                   checkpoint: LoadedModel | None = None, progress=None) -> CompareResult:
    """``run``'s epochs each against ``base`` on the job's validation rows (module docstring). ``checkpoint``: the
    job's fine-tuned encoder with a lent MLM head (:meth:`JobRun.checkpoint_spec`), for the reconstruction change
    at :meth:`JobRun.checkpoint_epoch`. The tables have :class:`CompareResult`'s columns plus ``epoch``."""
    from analysis.core.vectors import representations

    config = config or CompareConfig()
    if config.pooling != "cls":
        raise InputError("a job's epochs kept the [CLS] vectors only: compare them with pooling cls")
    start = time.perf_counter()
    rows = validation_rows(run)
    check_rows(rows, config.folds, config.debiased)
    epochs = run.epochs()
    max_length = run.metrics.get("max_length_used") or run.options.training().max_length
    config = config.replace(max_length=max_length)
    a = representations(base, rows, "cls", max_length, config.batch_size, progress,
                        truncation=run.options.training().truncation, mmap=True)[0]
    names = {e: f"{run.label} · epoch {e}" for e in epochs}
    at = run.checkpoint_epoch() if checkpoint is not None else None
    tokens, why = ({}, {})
    if config.reconstruction and at is not None:
        tokens, why = reconstructions([base, checkpoint], rows, config, progress)
    own_base = own_predictions(base, rows, max_length, config.batch_size)
    own = own_predictions(checkpoint, rows, max_length, config.batch_size) if at is not None else (None, None)
    cross, summary, movers = [], [], []
    oof_a: dict = {}
    for i, epoch in enumerate(epochs):
        b = run.vectors(epoch)  # memory-mapped float16: compare_pair reads a layer at a time
        if b.shape[:2] != (len(a), len(rows)) or b.shape[2] != a.shape[2]:
            raise InputError(f"{run.label}: epoch {epoch}'s vectors are {b.shape}, the base's {a.shape}: not the "
                             "same model family and rows")
        if progress:
            progress("comparing epochs", i, len(epochs))
        with threadpool_limits(1, user_api="blas"):
            parts = compare_pair(a, b, (base.spec.name, names[epoch]), rows, config, oof_a, maps=False)
        if config.reconstruction:
            add_reconstruction(parts[1], tokens.get(0) if epoch == at else None,
                               tokens.get(1) if epoch == at else None, len(rows), config.seed)
        add_head_predictions(parts[2], own_base[0], own[0] if epoch == at else None)
        for part in parts[0]:
            part["epoch"] = epoch
        for entry in parts[1]:
            entry["epoch"] = epoch
        for frame in parts[2]:
            frame.insert(1, "epoch", epoch)
        cross += parts[0]
        summary += parts[1]
        movers += parts[2]
    coords = epoch_maps(a, run, epochs, rows, base.spec.name, names)
    info = {**run_info(config), "models": [base.spec.name], "names": [base.spec.name, *names.values()],
            "job": None, "job_label": run.label, "epochs": epochs, "rows": len(rows),
            "rows_are": f"the job's {len(rows):,} validation rows (the rows its per-epoch vectors were saved for)",
            "fingerprints": [base.fingerprint], "layer_names": [base.anatomy.layer_names()],
            "epoch_vectors": "epochs/<e>/val_cls.npy as the job saved them (float16), not recomputed",
            "checkpoint_epoch": at,
            "head_predictions": {base.spec.name: own_base[1], **({names[at]: own[1]} if at is not None else {})},
            "aligned_map": "per layer one exact PCA of the base's and every epoch's vectors (each rotated onto the "
                           "base's, as its movement is measured) pooled, each layer's map rotated onto the previous "
                           "layer's",
            "seconds": round(time.perf_counter() - start, 3)}
    if config.reconstruction:
        info["mlm_heads"] = {base.spec.name: base.mlm_head,
                             **({names[at]: checkpoint.mlm_head} if at is not None else {})}
        info["reconstruction"] = {base.spec.name: why.get(0, "not read"),
                                  **({names[at]: why.get(1, "not read")} if at is not None else {}),
                                  "epochs": "a job keeps one checkpoint: the reconstruction change is for epoch "
                                            f"{at} only" if at is not None else "the job kept no checkpoint with "
                                            "an MLM head to lend: no reconstruction"}
    return CompareResult(pd.DataFrame(cross), pd.DataFrame(summary), pd.concat(movers, ignore_index=True),
                         coords, info)


def epoch_maps(a: np.ndarray, run: JobRun, epochs: list[int], rows: TextInputs, base_name: str,
               names: dict[int, str]) -> pd.DataFrame:
    """``coords_aligned`` rows for every epoch: one shared map per layer (:func:`aligned_maps_many`), the base's
    points repeated under each epoch so each epoch's rows are a pair's map."""
    layers = list(range(len(a)))
    maps = aligned_maps_many(a, [run.vectors(e) for e in epochs], layers)  # one layer of each at a time
    ids = np.asarray(rows.ids)
    frames = []
    for layer, (base_coords, *per_epoch) in zip(layers, maps, strict=True):
        for epoch, c in zip(epochs, per_epoch, strict=True):
            for name, xy in ((base_name, base_coords), (names[epoch], c)):
                frames.append(pd.DataFrame({"model_b": names[epoch], "epoch": epoch, "model": name, "layer": layer,
                                            "example_id": ids, "x": xy[:, 0], "y": xy[:, 1]}))
    return pd.concat(frames, ignore_index=True)
