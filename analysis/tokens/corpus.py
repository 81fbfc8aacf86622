"""A corpus tokenised once, with one metadata row per *counted* token (the non-special ones, as the probe counts
them: :func:`analysis.core.activations.counted_mask`).

Plain texts (any file :func:`analysis.core.inputs.read_file` reads, ``.txt`` one text per line) go through the one
tokenisation, :func:`analysis.core.activations.encode` (texts over the model's limit cut at their end, counted); a
token's *word* is the tokenizer's pre-tokenizer word (its ``word_ids``) spelled as in the text. A CoNLL-U treebank
(:func:`analysis.core.treebank.read_conllu`) is tokenised from its words
by :func:`analysis.core.activations.encode_words`, as the structure analysis does (a sentence over the limit, or
with a word that has no subword, is left out and counted), and each token carries its word's UPOS and DEPREL.

Row ``r`` of the metadata is row ``r`` of every layer's vectors; rows run text by text, position by position.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core.activations import Encoded, bare_backend, encode, encode_words
from analysis.core.inputs import CONLLU_SUFFIXES, InputError, TextInputs


@dataclasses.dataclass
class TokenCorpus:
    """``encoded``: the kept texts' token ids (specials included), in order; ``tokens``: one row per counted
    token (columns in :data:`TOKEN_COLUMNS`); ``texts``: one row per kept text (``text_id``, ``text``, and
    ``source_row``, ``label``, ``sent_id`` where known); ``counts[t]`` the counted tokens of text ``t``."""

    encoded: Encoded
    tokens: pd.DataFrame
    texts: pd.DataFrame
    counts: np.ndarray
    source: dict
    data_hash: str

    @property
    def n_rows(self) -> int:
        return len(self.tokens)


TOKEN_COLUMNS = ["row", "text_id", "position", "token_id", "token", "word_index", "word", "first_subword", "start",
                 "end"]  # + label (labelled texts), upos and deprel (CoNLL-U)


def is_conllu(path: Path) -> bool:
    return str(path).lower().endswith(CONLLU_SUFFIXES)


def _hash(*parts) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(json.dumps(part, ensure_ascii=False).encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def _special_ids(tokenizer) -> np.ndarray:
    return np.asarray(sorted(set(tokenizer.all_special_ids)), dtype=np.int64)


def _frame(tokenizer, encoded: Encoded, words: list[list[int | None]], spans: list[list[tuple[int, int] | None]],
           word_text: list[list[str]], extra: dict[str, list[list[str]]], labels: list[str] | None) -> tuple:
    """The metadata rows: every counted token of every text, in order."""
    special = _special_ids(tokenizer)
    cols: dict[str, list] = {c: [] for c in TOKEN_COLUMNS if c != "row"}
    cols.update({name: [] for name in extra})
    if labels is not None:
        cols["label"] = []
    counts = np.zeros(len(encoded), dtype=np.int64)
    vocab = tokenizer.convert_ids_to_tokens
    for t, ids in enumerate(encoded.input_ids):
        arr = np.asarray(ids, dtype=np.int64)
        keep = np.flatnonzero(~np.isin(arr, special))
        counts[t] = len(keep)
        names = vocab(arr[keep].tolist())
        seen: set[int] = set()
        for p, name in zip(keep.tolist(), names, strict=True):
            w = words[t][p] if p < len(words[t]) else None
            span = spans[t][p] if p < len(spans[t]) else None
            cols["text_id"].append(t)
            cols["position"].append(p)
            cols["token_id"].append(int(arr[p]))
            cols["token"].append(name)
            cols["word_index"].append(-1 if w is None else w)
            cols["word"].append("" if w is None else word_text[t][w])
            cols["first_subword"].append(w is not None and w not in seen)
            cols["start"].append(-1 if span is None else span[0])
            cols["end"].append(-1 if span is None else span[1])
            for name_, values in extra.items():
                cols[name_].append("" if w is None else values[t][w])
            if labels is not None:
                cols["label"].append(labels[t])
            if w is not None:
                seen.add(w)
    frame = pd.DataFrame(cols)
    frame.insert(0, "row", np.arange(len(frame), dtype=np.int64))
    for c in ("text_id", "position", "token_id", "word_index", "start", "end"):
        frame[c] = frame[c].astype(np.int64)
    frame["first_subword"] = frame["first_subword"].astype(bool)
    return frame, counts


def from_texts(tokenizer, inputs: TextInputs, max_length: int) -> TokenCorpus:
    """Plain texts: :func:`analysis.core.activations.encode` (head truncation); the word of each token from the
    tokenizer's own pre-tokenisation of the text (the same encoding ``encode`` starts from), spelled as in the
    text by its character offsets."""
    if inputs.pairs is not None:
        raise InputError("token vectors read single texts, not text pairs")
    encoded = encode(tokenizer, inputs, max_length, "head")
    backend = bare_backend(tokenizer)
    firsts = backend.encode_batch(list(inputs.texts), add_special_tokens=False)
    special = set(tokenizer.all_special_ids)
    probe = backend.encode("a", add_special_tokens=True)
    lead = probe.special_tokens_mask.index(0) if 0 in probe.special_tokens_mask else 0  # [CLS] / <s> before a text
    words, spans, word_text = [], [], []
    for t, (ids, first) in enumerate(zip(encoded.input_ids, firsts, strict=True)):
        text = inputs.texts[t]
        wid: list[int | None] = [None] * len(ids)
        span: list[tuple[int, int] | None] = [None] * len(ids)
        bounds: dict[int, list[int]] = {}
        for j, (w, off) in enumerate(zip(first.word_ids, first.offsets, strict=True)):
            if w is not None:
                b = bounds.setdefault(w, [off[0], off[1]])
                b[0], b[1] = min(b[0], off[0]), max(b[1], off[1])
            p = lead + j
            if p < len(ids) and ids[p] == first.ids[j] and ids[p] not in special:
                wid[p], span[p] = w, (off[0], off[1])
        order = {w: i for i, w in enumerate(sorted(bounds))}  # word ids as 0..n-1
        words.append([None if w is None else order[w] for w in wid])
        spans.append(span)
        word_text.append([text[bounds[w][0]:bounds[w][1]] for w in sorted(bounds)])
    labels = list(inputs.labels) if inputs.labels is not None else None
    tokens, counts = _frame(tokenizer, encoded, words, spans, word_text, {}, labels)
    texts = pd.DataFrame({"text_id": np.arange(len(encoded)), "source_row": list(inputs.ids),
                          "text": list(inputs.texts)})
    if labels is not None:
        texts["label"] = labels
    source = {"kind": "texts", "texts": len(encoded), "truncated": encoded.truncated,
              "skipped_empty": inputs.skipped_empty}
    return TokenCorpus(encoded, tokens, texts, counts, source,
                       _hash("texts", list(inputs.texts), labels or [], list(inputs.ids)))


def from_treebank(tokenizer, treebank, max_length: int) -> TokenCorpus:
    """A treebank's sentences through :func:`analysis.core.activations.encode_words` (the structure analysis's
    alignment); sentences over ``max_length`` tokens or with a word without subwords are left out (counted)."""
    sentences = [list(s.words) for s in treebank.sentences]
    enc = encode_words(tokenizer, sentences, max_length)
    bad = set(enc.too_long) | set(enc.no_subword)
    kept = [i for i in range(len(sentences)) if i not in bad]
    if not kept:
        raise InputError(f"every sentence is longer than the model's {max_length} tokens or has a word without "
                         "subwords")
    encoded = Encoded([enc.input_ids[i] for i in kept],
                      [enc.token_type_ids[i] for i in kept] if enc.token_type_ids is not None else None,
                      max_length, 0)
    texts, spans = [], []
    for i in kept:  # the sentence as its words joined by spaces; a token's span is its word's
        starts, pos = [], 0
        for w in sentences[i]:
            starts.append(pos)
            pos += len(w) + 1
        texts.append(" ".join(sentences[i]))
        spans.append([None if w is None else (starts[w], starts[w] + len(sentences[i][w]))
                      for w in enc.word_ids[i]])
    extra = {"upos": [list(treebank.sentences[i].upos) for i in kept],
             "deprel": [list(treebank.sentences[i].deprels) for i in kept]}
    tokens, counts = _frame(tokenizer, encoded, [enc.word_ids[i] for i in kept], spans,
                            [sentences[i] for i in kept], extra, None)
    frame = pd.DataFrame({"text_id": np.arange(len(kept)), "source_row": kept,
                          "sent_id": [treebank.sentences[i].sent_id for i in kept], "text": texts})
    source = {"kind": "conllu", "sentences": len(sentences), "texts": len(kept), "truncated": 0,
              "dropped_too_long": len(enc.too_long), "dropped_no_subword": len(enc.no_subword),
              **treebank.to_dict()}
    data_hash = _hash("conllu", sentences, extra["upos"], extra["deprel"],
                      [s.sent_id for s in treebank.sentences])
    return TokenCorpus(encoded, tokens, frame, counts, source, data_hash)


def read_corpus(tokenizer, path: Path, max_length: int, column: str = "text", label_column: str | None = None,
                limit: int | None = None) -> TokenCorpus:
    """``path`` as a treebank (``.conllu``, ``.conllu.gz``) or as texts (``.txt``, ``.csv``, ``.tsv``,
    ``.jsonl``; ``.txt.gz`` read as one text per line), tokenised."""
    source = read_source(path, column, label_column, limit)
    return (from_treebank if is_conllu(Path(path)) else from_texts)(tokenizer, source, max_length)


def read_source(path: Path, column: str = "text", label_column: str | None = None, limit: int | None = None):
    """:func:`read_corpus`'s file before tokenisation: a treebank (``read_conllu``) or texts (``TextInputs``, through
    :func:`analysis.core.inputs.read_file`: any of its formats, gzipped too), streamed and read up to ``limit`` only;
    bad input is an :class:`InputError` naming it (a job checks its corpus with this at submit)."""
    path = Path(path)
    if is_conllu(path):
        from analysis.core.treebank import read_conllu

        return read_conllu(path, limit)
    from analysis.core.inputs import read_file

    return read_file(path, column, limit=limit, label_column=label_column)
