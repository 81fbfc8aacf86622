"""The one extraction loop (:func:`run_plan`: batches of texts through the encoder, shared by the processes of a
launcher, gathered in plan order), and sentence vectors on it: every hidden state's pooled vector of each text
(Song et al. 2020 §3.3.1: the [CLS] state; or the mean over counted tokens, or a sentence encoder's own pooling),
extracted in length buckets and cached on disk by model fingerprint, data hash, pooling and max length, as a
layered vector set (:mod:`analysis.core.store`). Word vectors (:mod:`analysis.structure.words`), token vectors
(:mod:`analysis.tokens.vectors`) and the duplication's token states run on the same loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import numpy as np
import torch

from analysis.core.activations import (
    Encoded,
    bucket_indices,
    counted_mask,
    encode,
    halving_on_oom,
    hidden_states,
    make_batch,
    max_input_length,
)
from analysis.core.inputs import InputError, TextInputs
from analysis.core.parallel import ONE, Ranks
from analysis.core.store import ArrayStore, key_of
from models.loading import LoadedModel, split_pooling

Progress = Callable[[str, int, int], None]  # (stage, done, total): every extraction's progress callback
T = TypeVar("T")


def batch_plan(loaded: LoadedModel, encoded: Encoded, batch_size: int, ranks: Ranks = ONE) -> list[list[int]]:
    """The length-bucketed batches of ``encoded`` (:func:`analysis.core.activations.bucket_indices`), made by the
    main process and the same in every process."""
    return ranks.broadcast(list(bucket_indices(encoded, batch_size, loaded)) if ranks.is_main else None)


def run_plan(plan: Sequence[list[int]], run: Callable[[list[int]], T], ranks: Ranks = ONE,
             stop: Callable[[], BaseException | None] | None = None) -> Iterator[list[T]]:
    """THE extraction loop: each batch of ``plan`` (lists of text indices, the same in every process) through
    ``run`` (its batch halved on running out of memory: :func:`analysis.core.activations.halving_on_oom`), the
    processes of a launcher taking one batch each per step (:meth:`analysis.core.parallel.Ranks.steps`).
    Yields, in the main process, each step's results in plan order (one per batch, or more where a batch was
    halved); the other processes yield nothing and must run the generator to its end (or the main process's
    break), step by step, as the main process does. ``stop``: asked by the main process before each step; the
    exception it returns (a Stop pressed) is raised in every process."""
    for idx in ranks.steps(plan):
        if stop is not None and (stopped := ranks.broadcast(stop() if ranks.is_main else None)) is not None:
            raise stopped
        gathered = ranks.gather(list(halving_on_oom(run, idx)) if idx is not None else [])
        if ranks.is_main:
            yield [result for rank_results in gathered for result in rank_results]


@torch.inference_mode()
def extract(loaded: LoadedModel, inputs: TextInputs, pooling: str = "cls", max_length: int | None = None,
            batch_size: int = 32, progress: Progress | None = None, ranks: Ranks = ONE,
            truncation: str = "head") -> np.ndarray | None:
    """``(L + 1, n, hidden)`` float32: every hidden state's sentence vector per text, in input order.

    Under a launcher (``ranks``) each process pools its share of the batches and the main process, which alone
    gets the array (others get None) and reports progress, puts them in place (:mod:`analysis.core.parallel`).

    ``pooling``: ``cls`` (the first token), ``mean`` (over counted, non-special tokens) or ``model``: a sentence
    encoder's own pooling, exactly as sentence-transformers computes it (its mean and max run over every token
    the attention mask keeps, specials included; then its ``Normalize`` module where ``modules.json`` lists
    one).

    ``truncation``: which tokens of a text over ``max_length`` are kept (``head``, ``tail``, ``head+tail``:
    :func:`analysis.core.activations.encode_truncated`); a fine-tuning job's own choice when its vectors are compared
    with these (:mod:`analysis.tasks.epochs`)."""
    if pooling == "model":
        if loaded.pooling is None:
            raise InputError(f"'{loaded.spec.name}' has no pooling of its own (it is not a sentence-transformers "
                             "model): choose cls or mean")
        mode, normalize = split_pooling(loaded.pooling)
        pooling = {"cls": "cls", "mean": "mask-mean", "max": "mask-max"}[mode]
    else:
        normalize = False
    tokenizer = loaded.tokenizer
    max_length = min(max_length or 10**9, max_input_length(loaded))
    encoded = encode(tokenizer, inputs, max_length, truncation)
    if ranks.is_main:
        out = np.empty((loaded.num_layers + 1, len(encoded), loaded.anatomy.hidden_size), np.float32)
    special_ids = list(tokenizer.all_special_ids)
    done = 0

    def run(idx: list[int]):
        batch = make_batch(encoded, idx, tokenizer.pad_token_id, loaded.spec.device)
        states = torch.stack(hidden_states(loaded, batch))  # (L + 1, batch, seq, hidden)
        if pooling == "cls":
            pooled = states[:, :, 0]
        elif pooling == "mask-max":
            keep = batch.attention_mask.bool()[None, :, :, None]
            pooled = states.masked_fill(~keep, torch.finfo(states.dtype).min).amax(2)
        else:
            weights = (batch.attention_mask if pooling == "mask-mean" else
                       counted_mask(batch, special_ids, include_special=False)).to(states.dtype)
            pooled = (states * weights[None, :, :, None]).sum(2) / weights.sum(1).clamp(min=1)[None, :, None]
        if normalize:  # sentence-transformers' Normalize module: each sentence vector to unit L2 norm
            pooled = torch.nn.functional.normalize(pooled.float(), p=2, dim=-1)
        return idx, pooled.float().cpu().numpy()

    for step in run_plan(batch_plan(loaded, encoded, batch_size, ranks), run, ranks):
        for part, pooled in step:
            out[:, part] = pooled
            done += len(part)
        if progress:
            progress("extracting", done, len(encoded))
    return out if ranks.is_main else None


def representations(loaded: LoadedModel, inputs: TextInputs, pooling: str = "cls", max_length: int | None = None,
                    batch_size: int = 32, progress: Progress | None = None,
                    store: ArrayStore | None = None, ranks: Ranks = ONE,
                    truncation: str = "head", mmap: bool = False) -> tuple[np.ndarray | None, bool]:
    """:func:`extract`, read from the disk cache when this model, data, pooling, max length (and truncation, when
    not ``head``) were seen before. Returns ``(array, cache_hit)``. Labels and batch size do not change the
    vectors, so not the key. ``mmap``: the cached array memory-mapped (read a layer at a time; the comparison of
    checkpoints holds two layers), also right after an extraction (the array as extracted if it could not be
    cached).
    Under a launcher the processes share the extraction; the main process reads and writes the cache and alone
    gets the array."""
    store = store or ArrayStore()
    data = dataclasses.replace(inputs, labels=None, row_ids=None, skipped_empty=0, dropped_over_limit=0)
    key = key_of(model=loaded.fingerprint, data=data.content_hash(),
                 pooling=f"model:{loaded.pooling}" if pooling == "model" else pooling,
                 max_length=min(max_length or 10**9, max_input_length(loaded)),
                 **({"truncation": truncation} if truncation != "head" else {}))
    found = store.get_set("representations", key) if ranks.is_main else None
    cached = found.array(mmap) if found is not None else None
    if ranks.broadcast(cached is not None and cached.shape[:2] == (loaded.num_layers + 1, len(inputs))):
        return cached, True
    reps = extract(loaded, inputs, pooling, max_length, batch_size, progress, ranks, truncation)
    if ranks.is_main:
        store.put_set("representations", key, reps, each_row="a text, in input order", model=loaded.spec.name)
        if mmap and (stored := store.get_set("representations", key)) is not None:
            reps = stored.array()
    return reps, False
