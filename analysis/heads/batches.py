"""The inputs head importance scores (Michel et al. 2019, :mod:`analysis.heads.importance`): texts with a seeded
share of their tokens masked (the MLM loss), or a labelled set with its class ids (a classifier's loss), in
length-sorted batches."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from analysis.core.activations import Encoded, encode, make_batch, max_input_length
from analysis.core.inputs import InputError, TextInputs, class_ids
from models.loading import LoadedModel


@dataclasses.dataclass
class LossBatch:
    """Model inputs ``(batch, seq)`` and targets: ``(batch, seq)`` token ids with -100 where not scored (MLM) or
    ``(batch,)`` class ids."""

    inputs: dict
    labels: torch.Tensor


def _padded(rows: list[list[int]], idx: list[int], fill: int) -> torch.Tensor:
    """Rows ``idx`` padded with ``fill`` (the one batch builder, :func:`analysis.core.activations.make_batch`)."""
    return make_batch(Encoded(rows, None, 0, 0), idx, fill).input_ids


def _batched(ids: list[list[int]], types: list[list[int]] | None, pad: int, batch_size: int):
    """Length-sorted batches of ``ids`` (their input positions and model inputs)."""
    encoded = Encoded(ids, types, 0, 0)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        yield idx, make_batch(encoded, idx, pad).model_inputs()


def mlm_batches(loaded: LoadedModel, texts: TextInputs, batch_size: int = 16, mask_prob: float = 0.15,
                seed: int = 0) -> list[LossBatch]:
    """``texts`` tokenised (cut at the model's limit), ``mask_prob`` of each text's non-special tokens masked
    (seeded; at least one per text)."""
    tokenizer = loaded.tokenizer
    if tokenizer.mask_token_id is None:
        raise InputError(f"'{loaded.spec.name}' has no mask token: the MLM loss needs one")
    if not len(texts):
        raise InputError("the corpus is empty: no text to read")
    encoded = encode(tokenizer, texts, max_input_length(loaded))
    special = set(tokenizer.all_special_ids)
    rng = np.random.default_rng(seed)
    ids, labels, kept = [], [], []
    for r, row in enumerate(encoded.input_ids):
        candidates = [t for t, i in enumerate(row) if i not in special]
        if not candidates:
            continue
        k = max(1, int(round(mask_prob * len(candidates))))
        chosen = set(rng.choice(candidates, k, replace=False).tolist())
        ids.append([tokenizer.mask_token_id if t in chosen else i for t, i in enumerate(row)])
        labels.append([i if t in chosen else -100 for t, i in enumerate(row)])
        kept.append(r)
    if not ids:
        raise InputError("the corpus is empty: no text has a token to mask")
    types = encoded.token_type_ids
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return [LossBatch(inputs, _padded(labels, idx, -100))
            for idx, inputs in _batched(ids, [types[r] for r in kept] if types else None, pad, batch_size)]


def classifier_labels(model: nn.Module, name: str = "the classifier") -> dict[str, int]:
    """A sequence classifier's classes (``config.label2id``); a checkpoint without a classification head or
    labels is an :class:`InputError`."""
    config = model.config
    architectures = getattr(config, "architectures", None) or []
    label2id = getattr(config, "label2id", None) or {}
    if not any(a.endswith("ForSequenceClassification") for a in architectures) and not hasattr(model, "classifier"):
        raise InputError(f"{name} has no sequence-classification head: its loss needs one (a fine-tuned "
                         "classifier), or give texts for the MLM loss instead")
    if not label2id:
        raise InputError(f"{name} has no labels (config.label2id is empty): cannot score a labelled set")
    return {str(k): int(v) for k, v in label2id.items()}


def classifier_batches(tokenizer, data: TextInputs, label2id: dict[str, int], max_length: int,
                       batch_size: int = 16, truncation: str = "head") -> list[LossBatch]:
    """A labelled set tokenised (pairs kept, cut at ``max_length``) with its class ids; a label the classifier
    does not have is an :class:`InputError`."""
    if not len(data):
        raise InputError("the labelled set is empty")
    if data.labels is None:
        raise InputError("the data has no labels: head importance for a classifier needs a labelled set")
    ids = class_ids(data.labels, sorted(label2id, key=label2id.get))  # names or class ids, as the lens reads them
    encoded = encode(tokenizer, data, max_length, truncation)  # as the classifier was trained
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return [LossBatch(inputs, torch.tensor([ids[i] for i in idx]))
            for idx, inputs in _batched(encoded.input_ids, encoded.token_type_ids, pad, batch_size)]
