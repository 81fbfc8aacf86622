"""Word vectors per layer from subword vectors, aligned through the tokenizer's word ids.

A treebank's words are given pre-split; :func:`analysis.core.activations.encode_words` tokenises them with the
model's own special tokens and records which word each subword belongs to (WordPiece, SentencePiece and
byte-level BPE alike; a byte-level BPE reads every word as preceded by a space). A word's vector at layer ``l``
is its **first** subword's hidden state (the default, as in Hewitt & Manning 2019 and Hewitt & Liang 2019) or
the **mean** of its subwords' states (Tenney et al. 2019 pool spans; an option here).

A sentence longer than the model's limit is never cut: it is dropped and counted (``too_long``), as is a
sentence with a word the tokenizer turns into nothing (``no_subword``). The ``(L + 1, words, hidden)`` float32
array is cached on disk (:mod:`analysis.core.store`, like the atlas' vectors) by model fingerprint, words, pooling
and limit, written there batch by batch through a memory map (the whole array is never in memory), and handed
back memory-mapped so a probe holds one layer at a time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import torch

from analysis.core.activations import (
    Encoded,
    encode_words,
    hidden_states,
    make_batch,
    max_input_length,
)
from analysis.core.inputs import InputError
from analysis.core.parallel import ONE, Ranks
from analysis.core.store import ArrayStore, key_of
from analysis.core.vectors import Progress, batch_plan, run_plan
from models.loading import LoadedModel

WORD_VECTORS = ("first", "mean")


@dataclasses.dataclass
class WordVectors:
    """``vectors``: ``(L + 1, n_words, hidden)`` for the kept sentences' words, in order; ``kept`` the input
    positions of those sentences; ``offsets[s]`` the first word of kept sentence ``s`` (``offsets[-1] ==
    n_words``)."""

    vectors: np.ndarray
    kept: list[int]
    offsets: np.ndarray
    too_long: list[int]
    no_subword: list[int]
    pooling: str
    max_length: int
    cache_hit: bool = False

    def __post_init__(self):
        if self.vectors.ndim != 3 or self.vectors.shape[1] != int(self.offsets[-1]):
            raise ValueError(f"word vectors {self.vectors.shape} do not match {int(self.offsets[-1])} words")

    def layer(self, index: int) -> np.ndarray:
        """Layer ``index`` ``(words, hidden)``, copied into memory. From the memory-mapped cache it is read through
        a map opened for this read and dropped after it, so the file's pages do not stay mapped: the process's
        resident memory holds the layer being probed, not every layer read so far."""
        if isinstance(self.vectors, np.memmap) and self.vectors.filename:
            mapped = np.load(self.vectors.filename, mmap_mode="r")
            out = np.array(mapped[index])
            del mapped
            return out
        return np.array(self.vectors[index])

    def info(self) -> dict:
        return {"word_vector": self.pooling, "word_vector_text": POOLING_TEXT[self.pooling],
                "max_tokens": self.max_length, "sentences_kept": len(self.kept),
                "dropped_too_long": len(self.too_long), "dropped_no_subword": len(self.no_subword),
                "cache_hit": self.cache_hit}


POOLING_TEXT = {"first": "first subword of each word", "mean": "mean of each word's subwords"}


def words_hash(sentences: list[list[str]]) -> str:
    digest = hashlib.sha256()
    for words in sentences:
        digest.update(json.dumps(list(words), ensure_ascii=False).encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def subword_index(word_ids: list[int | None], n_words: int, pooling: str) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, words)``: the token positions that make up each word's vector and the word of each
    (``first``: one token per word, its first subword; ``mean``: every subword)."""
    tokens, words, seen = [], [], set()
    for t, w in enumerate(word_ids):
        if w is None or (pooling == "first" and w in seen):
            continue
        seen.add(w)
        tokens.append(t)
        words.append(w)
    if len(seen) != n_words:
        raise ValueError(f"{n_words - len(seen)} word(s) have no subword")
    return np.asarray(tokens), np.asarray(words)


@torch.inference_mode()
def extract(loaded: LoadedModel, sentences: list[list[str]], pooling: str = "first", batch_size: int = 32,
            progress: Progress | None = None, store: ArrayStore | None = None, ranks: Ranks = ONE
            ) -> WordVectors | None:
    """Every layer's word vectors of ``sentences`` (lists of words), read from the cache when this model,
    words, pooling and limit were seen before.

    Under a launcher (``ranks``) each process runs its share of the batches and the main process writes them in
    place (:mod:`analysis.core.parallel`, as the atlas's extraction); only the main process gets the vectors (the
    others get None)."""
    if pooling not in WORD_VECTORS:
        raise InputError(f"unknown word vector '{pooling}'; choose one of {', '.join(WORD_VECTORS)}")
    tokenizer = loaded.tokenizer
    limit = max_input_length(loaded)
    encoded = encode_words(tokenizer, sentences, limit)
    bad = set(encoded.too_long) | set(encoded.no_subword)
    kept = [i for i in range(len(sentences)) if i not in bad]
    if not kept:
        raise InputError(f"every sentence is longer than the model's {limit} tokens or has a word without subwords")
    sizes = np.array([len(sentences[i]) for i in kept])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    store = store or ArrayStore()
    key = key_of(model=loaded.fingerprint, words=words_hash([sentences[i] for i in kept]), pooling=pooling,
                 max_length=limit, version=1)
    shape = (loaded.num_layers + 1, int(offsets[-1]), loaded.anatomy.hidden_size)
    common = dict(kept=kept, offsets=offsets, too_long=list(encoded.too_long), no_subword=list(encoded.no_subword),
                  pooling=pooling, max_length=limit)
    found = store.get_set("word_vectors", key) if ranks.is_main else None
    cached = found.array() if found is not None else None
    if ranks.broadcast(cached is not None and cached.shape == shape):
        return WordVectors(cached, cache_hit=True, **common) if ranks.is_main else None

    sub = Encoded([encoded.input_ids[i] for i in kept],
                  [encoded.token_type_ids[i] for i in kept] if encoded.token_type_ids is not None else None, limit, 0)
    done = 0

    def run(idx: list[int]):
        batch = make_batch(sub, idx, tokenizer.pad_token_id, loaded.spec.device)
        states = torch.stack(hidden_states(loaded, batch)).float()  # (L + 1, batch, seq, hidden)
        width = states.shape[2]
        flat_tokens, flat_words, n = [], [], 0
        for row, s in enumerate(idx):
            tokens, words = subword_index(encoded.word_ids[kept[s]], int(sizes[s]), pooling)
            flat_tokens.append(row * width + tokens)
            flat_words.append(n + words)
            n += int(sizes[s])
        tok = torch.as_tensor(np.concatenate(flat_tokens), device=states.device)
        wrd = torch.as_tensor(np.concatenate(flat_words), device=states.device)
        picked = states.flatten(1, 2)[:, tok]  # (L + 1, tokens, hidden)
        pooled = torch.zeros((states.shape[0], n, states.shape[-1]), dtype=states.dtype, device=states.device)
        pooled.index_add_(1, wrd, picked)
        counts = torch.bincount(wrd, minlength=n).clamp(min=1).to(states.dtype)
        return idx, (pooled / counts[None, :, None]).cpu().numpy()

    plan = batch_plan(loaded, sub, batch_size, ranks)
    if not ranks.is_main:  # a helper process: its share of the batches, sent to the main process
        for _ in run_plan(plan, run, ranks):
            pass
        return None
    with store.create_set("word_vectors", key, shape, model=loaded.spec.name, pooling=pooling,
                          each_row="a word of the kept sentences, in order") as out:  # memory holds a batch
        for step in run_plan(plan, run, ranks):
            for part, pooled in step:
                start = 0
                for s in part:
                    out[:, offsets[s]:offsets[s + 1]] = pooled[:, start:start + sizes[s]]
                    start += int(sizes[s])
                done += len(part)
            if progress:
                progress("word vectors", done, len(kept))
        if not isinstance(out, np.memmap):  # the disk refused: keep the array in memory
            return WordVectors(out, **common)
    stored = store.get_set("word_vectors", key)
    if stored is None:
        raise OSError(f"the word vectors just written to {store.set_dir('word_vectors', key)} cannot be read back")
    return WordVectors(stored.array(), **common)
