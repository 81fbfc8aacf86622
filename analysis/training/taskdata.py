"""Classification data for fine-tuning: label ids, long-text truncation (Sun et al. §5.3.1) and batches.

Texts are tokenised by :func:`analysis.core.activations.encode_truncated`, the tokenisation every analysis uses
(head/tail/head+tail truncation, text pairs, the checkpoint's stored padding and truncation ignored).
"""

from __future__ import annotations

import dataclasses
import random

import torch

from analysis.core.activations import encode_truncated
from analysis.core.inputs import InputError, TextInputs


@dataclasses.dataclass
class TaskData:
    """Encoded texts with integer labels (``-1`` where a split has no labels) and source row ids."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    labels: list[int]
    ids: tuple[int, ...]
    truncated: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    def subset(self, positions) -> TaskData:
        pick = list(positions)
        return TaskData([self.input_ids[i] for i in pick], [self.token_type_ids[i] for i in pick],
                        [self.labels[i] for i in pick], tuple(self.ids[i] for i in pick))


def label_ids(train_labels, *others) -> dict[str, int]:
    """Label name -> id from the training labels (sorted); other splits may not bring new labels."""
    names = sorted(set(train_labels))
    if len(names) < 2:
        raise InputError(f"the training data has a single class ('{names[0] if names else ''}'); need at least two")
    for split in others:
        unknown = sorted(set(split or ()) - set(names))
        if unknown:
            raise InputError(f"labels {', '.join(map(repr, unknown[:5]))} are not in the training data "
                             f"(training labels: {', '.join(names[:10])})")
    return {name: i for i, name in enumerate(names)}


def prepare(tokenizer, inputs: TextInputs, labels: dict[str, int], max_length: int, strategy: str) -> TaskData:
    ids, types, cut = encode_truncated(tokenizer, inputs.texts, inputs.pairs, max_length, strategy)
    y = [labels[x] for x in inputs.labels] if inputs.labels is not None else [-1] * len(ids)
    return TaskData(ids, types, y, inputs.ids, cut)


def batch_order(lengths: list[int], batch_size: int, shuffle: bool, seed: int = 0, by_length: bool = False,
                group: int = 50) -> list[list[int]]:
    """Indices of each batch. ``shuffle`` with ``by_length`` is length-grouped sampling (as the HF Trainer's
    ``group_by_length``): shuffle, sort each run of ``group`` batches by length so a batch pads little, then
    shuffle the batches. ``by_length`` alone sorts everything (evaluation)."""
    order = list(range(len(lengths)))
    rng = random.Random(seed)
    if shuffle:
        rng.shuffle(order)
        if by_length:
            mega = batch_size * group
            order = [i for s in range(0, len(order), mega)
                     for i in sorted(order[s:s + mega], key=lambda i: -lengths[i])]
    elif by_length:
        order.sort(key=lambda i: lengths[i])
    out = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    if shuffle and by_length:
        rng.shuffle(out)
    return out


def batches(data: TaskData, batch_size: int, pad_id: int, shuffle: bool, seed: int = 0, by_length: bool = False):
    """Padded batches (dynamic padding: to the longest text of the batch) as dicts of tensors plus
    ``positions`` (indices into ``data``), in the order of :func:`batch_order`."""
    lengths = [len(ids) for ids in data.input_ids]
    for idx in batch_order(lengths, batch_size, shuffle, seed, by_length):
        yield padded(data, idx, pad_id)


def padded(data: TaskData, idx: list[int], pad_id: int) -> dict:
    """Rows ``idx`` of ``data`` padded to the longest of them: ``input_ids``, ``token_type_ids``,
    ``attention_mask``, ``labels`` and ``positions``."""
    width = max(len(data.input_ids[i]) for i in idx)
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(idx), width), dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    for row, i in enumerate(idx):
        n = len(data.input_ids[i])
        ids[row, :n] = torch.tensor(data.input_ids[i])
        types[row, :n] = torch.tensor(data.token_type_ids[i])
        mask[row, :n] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
            "labels": torch.tensor([data.labels[i] for i in idx]), "positions": torch.tensor(idx)}
