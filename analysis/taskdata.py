"""Classification data for fine-tuning: label ids, long-text truncation (Sun et al. §5.3.1) and batches.

Truncation keeps ``budget = max_length - special tokens`` tokens of the (first) text:
``head`` the first ``budget``, ``tail`` the last ``budget``, ``head+tail`` the first ``round(budget * 128/510)``
and the rest from the end (128 + 382 at 512, the paper's best). With a text pair, the second text (an aspect,
a hypothesis) keeps at most half the budget, cut at its end, and the first text gets the rest.
"""

from __future__ import annotations

import dataclasses
import random

import torch
from tokenizers import Encoding

from analysis.inputs import InputError, TextInputs
from analysis.options import TRUNCATIONS


def truncate_indices(n: int, budget: int, strategy: str) -> list[int]:
    """Which of ``n`` token positions a text keeps under ``strategy`` with room for ``budget`` tokens."""
    if strategy not in TRUNCATIONS:
        raise InputError(f"unknown truncation '{strategy}'; choose one of {', '.join(TRUNCATIONS)}")
    if n <= budget:
        return list(range(n))
    if strategy == "head":
        return list(range(budget))
    if strategy == "tail":
        return list(range(n - budget, n))
    head = round(budget * 128 / 510)
    return list(range(head)) + list(range(n - (budget - head), n))


def _cut(encoding: Encoding, keep: list[int], n: int) -> Encoding:
    """``encoding`` reduced to the positions ``keep`` (a head run and/or a tail run)."""
    if len(keep) == n:
        return encoding
    head = next((i for i, k in enumerate(keep) if k != i), len(keep))
    tail = len(keep) - head
    parts = []
    if head:
        first = Encoding.merge([encoding], growing_offsets=False)
        first.truncate(head, direction="right")
        parts.append(first)
    if tail:
        last = Encoding.merge([encoding], growing_offsets=False)
        last.truncate(tail, direction="left")
        parts.append(last)
    return Encoding.merge(parts, growing_offsets=False)


def encode_truncated(tokenizer, texts, pairs, max_length: int, strategy: str) -> tuple[list, list, int]:
    """(input_ids, token_type_ids, how many texts were cut) with special tokens, via the fast tokenizer's
    backend (so the model's own template adds [CLS]/[SEP], <s>/</s>, ...)."""
    backend = tokenizer.backend_tokenizer
    budget = max_length - tokenizer.num_special_tokens_to_add(pair=pairs is not None)
    if budget < 2:
        raise InputError(f"max length {max_length} leaves no room for text")
    ids, types, cut = [], [], 0
    firsts = backend.encode_batch(list(texts), add_special_tokens=False)
    seconds = backend.encode_batch(list(pairs), add_special_tokens=False) if pairs is not None else None
    for i, a in enumerate(firsts):
        b = None
        room = budget
        if seconds is not None:
            b = seconds[i]
            if len(b) + len(a) > budget and len(b) > budget // 2:
                b = _cut(b, truncate_indices(len(b), budget // 2, "head"), len(b))
                cut += 1
            room = budget - len(b)
        keep = truncate_indices(len(a), room, strategy)
        cut += len(keep) < len(a)
        final = backend.post_process(_cut(a, keep, len(a)), b, add_special_tokens=True)
        ids.append(final.ids)
        types.append(final.type_ids)
    return ids, types, cut


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
