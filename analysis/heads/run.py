"""One pass over a corpus (texts or a CoNLL-U treebank) that feeds every head-level result at once: the token
statistics and the head map (:mod:`analysis.heads.stats`, Clark et al. 2019 §3 and §6) and, for a treebank, the
heads as parsers (:mod:`analysis.heads.parse`, §4.2) on word-level attention (:mod:`analysis.heads.words`, §4.1).

**Memory bound.** Sentences are sorted by length and batched so that a batch's ``sentences x width^2`` stays under
``max_cells`` (default 2^17; and at most ``batch_size`` sentences): the model's attention output for a batch is
at most ``layers x heads x max_cells`` float32 values (bert-base: 144 x 2^17 x 4 B = 75 MB), reduced to sums
before the next batch. Kept across batches: the statistics' sums ``O(layers x heads x 9)``, the parsing counts
``O(relations x 2 x layers x heads)``, the head map's ``(layers x heads)^2`` distances. Never ``sentences x layers
x heads x n^2``.

``progress(stage, done, total)`` is called after every batch (it may raise to stop, as the pages' Stop and the
jobs' cancel do); ``should_stop()`` returning True raises :class:`Stopped`.

**Resume.** Given ``resume`` (a folder: a ``heads`` job passes ``LAYERLENS_HOME/cache/heads_progress``), the sums
are saved there every ``checkpoint_seconds`` and when the run is stopped, under a key of everything that changes
them (the model's fingerprint, the input ids, the treebank's trees, the options); the same run started again
continues after the last batch saved and gives the same numbers as a run never stopped (the sums are the same
float64 values added in the same order). The file is removed when the run completes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from analysis.core.activations import encode, encode_words, halving_on_oom, make_batch, max_input_length
from analysis.core.inputs import InputError, TextInputs
from analysis.core.store import key_of
from analysis.core.treebank import Treebank
from analysis.core.vectors import Progress
from analysis.heads.model import attentions, check_eager, head_shape
from analysis.heads.parse import MIN_COUNT, Parsing, relations_of
from analysis.heads.resume import Checkpoint
from analysis.heads.stats import STATISTICS, HeadClusters, TokenStatistics, punctuation_ids, sample_tokens
from analysis.heads.words import pooling_matrices, word_attention
from models.cache import is_out_of_memory
from models.loading import LoadedModel

MAX_CELLS = 1 << 17
CLUSTER_TOKENS = 2048
log = logging.getLogger(__name__)


class Stopped(Exception):
    """The run was stopped by its ``should_stop`` hook."""


@dataclasses.dataclass
class HeadsResult:
    """``heads`` (heads.csv), ``clusters`` (clusters.csv), ``relations`` (relations.csv), ``accuracies`` (every
    head per relation and direction), ``uuas`` (every head's attention tree); None where not asked for or not
    possible (parsing needs a treebank). ``info``: what was read, dropped and how long it took."""

    heads: pd.DataFrame | None
    clusters: pd.DataFrame | None
    relations: pd.DataFrame | None
    accuracies: pd.DataFrame | None
    uuas: pd.DataFrame | None
    info: dict


def batches(lengths: list[int], batch_size: int, max_cells: int) -> list[list[int]]:
    """Indices by ascending length, cut so that a batch holds at most ``batch_size`` sentences and ``len(batch) x
    longest^2 <= max_cells`` (a single sentence always makes a batch)."""
    out, batch = [], []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batch and (len(batch) == batch_size or (len(batch) + 1) * lengths[i] ** 2 > max_cells):
            out.append(batch)
            batch = []
        batch.append(i)
    return out + ([batch] if batch else [])


def run_key(loaded: LoadedModel, ids: list, trees: list | None, options: dict) -> str:
    """What changes a run's sums: the model, every kept sentence's input ids (and for parsing its tree), options."""
    digest = hashlib.sha256(json.dumps([ids, trees]).encode()).hexdigest()
    return key_of(kind="heads", model=loaded.fingerprint, data=digest, **options)


def analyse(loaded: LoadedModel, source: TextInputs | Treebank, *, statistics: bool = True, clusters: bool = True,
            parse: bool = True, relations: list[str] | None = None, batch_size: int = 32, max_cells: int = MAX_CELLS,
            cluster_tokens: int = CLUSTER_TOKENS, seed: int = 0, progress: Progress | None = None,
            should_stop: Callable[[], bool] | None = None, resume: Path | None = None, reading: str = "clark",
            symmetry: str = "sum", min_count: int = MIN_COUNT) -> HeadsResult:
    """Head statistics, the head map and (``source`` a treebank) heads as parsers, in one pass.

    ``loaded`` must run the eager attention path (:func:`analysis.heads.model.load_eager`). Texts longer than
    the model's limit are cut (counted); treebank sentences longer than it are dropped (counted), never cut.
    ``reading``, ``symmetry``, ``min_count``: the parser's readings (:class:`analysis.heads.parse.Parsing`)."""
    model, tokenizer = loaded.model, loaded.tokenizer
    check_eager(model, f"'{loaded.spec.name}'")
    layers, heads = head_shape(model)
    limit = max_input_length(loaded)
    info: dict = {"model": loaded.spec.name, "layers": layers, "heads": heads}
    treebank = isinstance(source, Treebank)
    if treebank:
        sentences = source.sentences
        encoded = encode_words(tokenizer, [list(s.words) for s in sentences], limit)
        dropped = set(encoded.too_long) | set(encoded.no_subword)
        kept = [i for i in range(len(sentences)) if i not in dropped]
        info.update(dropped_too_long=len(encoded.too_long), dropped_no_subword=len(encoded.no_subword))
    else:
        encoded = encode(tokenizer, source, limit)
        kept = list(range(len(encoded)))
        info.update(truncated=encoded.truncated)
    kept = [i for i in kept if len(encoded.input_ids[i]) > 0]
    if not kept:
        raise InputError("the corpus is empty: no sentence to read" if not len(encoded) else
                         f"every sentence is longer than the model's {limit} tokens or has a word without subwords")
    parse = parse and treebank
    if parse:
        chosen = relations_of([sentences[i] for i in kept], relations)
        parser = Parsing(layers, heads, chosen, reading, symmetry, min_count)
    stats = TokenStatistics(layers, heads) if statistics else None
    uniform = TokenStatistics(1, 1) if statistics else None  # the baseline: uniform attention on the same sentences
    lengths = [len(encoded.input_ids[i]) for i in kept]
    sample = sample_tokens(lengths, cluster_tokens, seed) if clusters else set()
    heads_map = HeadClusters(layers, heads) if clusters else None
    punct = torch.from_numpy(punctuation_ids(tokenizer))
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    plan = batches(lengths, batch_size, max_cells)
    parts = {name: part for name, part in (("stats", stats), ("uniform", uniform), ("map", heads_map),
                                           ("parser", parser if parse else None)) if part is not None}
    key = run_key(loaded, [encoded.input_ids[i] for i in kept],
                  [[sentences[i].heads, sentences[i].deprels] for i in kept] if parse else None,
                  {"parts": sorted(parts), "relations": parser.relations if parse else None, "batch_size": batch_size,
                   "reading": [reading, symmetry] if parse else None,
                   "max_cells": max_cells, "cluster_tokens": cluster_tokens if clusters else 0, "seed": seed})
    checkpoint = Checkpoint(Path(resume) / f"{key}.npz" if resume is not None else None, parts)
    first = checkpoint.load(len(plan))
    done = sum(len(idx) for idx in plan[:first])
    if first:
        info["resumed_after"] = done
        log.info("resuming after %d of %d sentences (%s)", done, len(kept), checkpoint.path)

    def add(idx: list[int], rows: list[int], batch, maps) -> None:
        ids, mask = torch.from_numpy(batch.host_ids), torch.from_numpy(batch.host_mask.astype(np.int64))
        width = ids.shape[1]
        n = torch.tensor([lengths[k] for k in idx])
        if len(maps) != layers:
            raise RuntimeError(f"the model returned {len(maps)} attention maps for {layers} layers")
        flags = torch.stack([ids == (cls_id if cls_id is not None else -1),
                             ids == (sep_id if sep_id is not None else -1),
                             punct[ids.clamp(max=len(punct) - 1)] & mask.bool()], -1).float()
        if parse:
            words = parser.batch([sentences[r] for r in rows], [k % 2 for k in idx])
            mean, total = pooling_matrices([encoded.word_ids[r] for r in rows], [len(sentences[r]) for r in rows],
                                           width)
        if uniform is not None:
            uniform.add(0, (mask.float() / n[:, None])[:, None, None, :].expand(-1, 1, width, -1), n, flags)
        if parse:  # the word maps are made where the attention is (issue 44 item 6)
            mean, total = mean.to(maps[0].device), total.to(maps[0].device)
        for layer, a in enumerate(maps):
            a = a.float()  # on the model's device: statistics and word maps are reduced there
            if stats is not None:
                stats.add(layer, a, n, flags)
            if parse:
                parser.add(layer, word_attention(a, mean, total), words)
        if heads_map is not None:
            by_length: dict[int, list[tuple[int, int]]] = {}
            for b, k in enumerate(idx):
                for p in range(lengths[k]):
                    if (k, p) in sample:
                        by_length.setdefault(lengths[k], []).append((b, p))
            for size, picked in by_length.items():  # rows cut to their sentence's length: no padding columns
                bi, pi = (torch.tensor(v) for v in zip(*picked, strict=True))
                heads_map.add(torch.stack([a[bi.to(a.device), :, pi.to(a.device), :size].float().cpu()
                                           for a in maps], 1).flatten(1, 2))  # the sampled rows only

    def read(idx: list[int]) -> int:
        """One batch: the forward pass, then its sums. Out of memory in the forward pass: nothing was summed, and
        :func:`halving_on_oom` reads the batch again in halves; out of memory once summing began is an error (a retry
        would count rows twice)."""
        rows = [kept[k] for k in idx]
        batch = make_batch(encoded, rows, pad, loaded.spec.device)  # the one batch builder
        maps = attentions(model, batch.model_inputs(), f"'{loaded.spec.name}'")
        try:
            add(idx, rows, batch, maps)
        except RuntimeError as exc:
            if is_out_of_memory(exc):
                raise RuntimeError(f"out of memory while summing a batch of {len(idx)} sentences: lower "
                                   "--batch-size or --max-cells") from exc
            raise
        return len(idx)

    start = time.perf_counter()
    with torch.inference_mode():
        for step, idx in enumerate(plan[first:], first):
            checkpoint.save(step)
            if should_stop is not None and should_stop():
                checkpoint.save(step, force=True)
                raise Stopped("stopped")
            for _ in halving_on_oom(read, idx):
                pass
            done += len(idx)
            if progress is not None:
                try:
                    progress("attention", done, len(kept))
                except BaseException:  # a Stop or a cancel: what was summed so far is kept for the next run
                    checkpoint.save(step + 1, force=True)
                    raise
    checkpoint.remove()
    if uniform is not None:  # what each statistic would be if every token attended uniformly to its sentence
        row = uniform.table().iloc[0]
        info["uniform_attention"] = {name: float(row[name]) for name in STATISTICS if name != "uniform_entropy"}
    info.update(sentences=len(kept), tokens=int(sum(lengths)), seconds=round(time.perf_counter() - start, 3),
                cluster_tokens=heads_map.tokens if heads_map is not None else 0, max_cells=max_cells,
                word_attention="Clark et al. 2019 §4.1: sum over the attended word's pieces, mean over the attending "
                "word's pieces")
    if parse:
        info.update(reading=parser.reading, symmetry=parser.symmetry, min_count=parser.min_count,
                    relations_under_min_count=parser.under_min_count(), best_tree=parser.best_tree())
    if stats is not None:  # the statistics' interval; a parse's are Wilson's (analysis.heads.actions.INTERVALS)
        info["interval"] = "95% Student t interval over sentence means"
    return HeadsResult(
        heads=stats.table() if stats is not None else None,
        clusters=heads_map.table(seed) if heads_map is not None and heads_map.tokens else None,
        relations=parser.table() if parse else None,
        accuracies=parser.accuracies() if parse else None,
        uuas=parser.uuas() if parse else None, info=info)

