"""decoded.csv without a Python step per row (issue 44, item 3): :func:`analysis.probe.reconstruction.decoded_table`
decodes every (text, state) row in one batched call of the tokenizer's backend, and must equal the per-row
``convert_tokens_to_string(convert_ids_to_tokens(ids))`` it replaced on every row of a 2,000-text run, for each
kind of decoder: WordPiece, SentencePiece (Metaspace) and byte-level BPE, with special tokens, multi-byte
characters split across byte-level tokens, and attention halves."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tokenizers import ByteLevelBPETokenizer, SentencePieceBPETokenizer
from transformers import PreTrainedTokenizerFast

from analysis.probe.reconstruction import decoded_table
from tests.support.models import tiny_tokenizer

CORPUS = ["the film is good , très bien !", "i liked the movie — and it was fun 😀", "naïve café déjà vu ?",
          "not very good, dull… 東京 and 北京"] * 50


def per_row(tokenizer, predicted, n_states, labels=None) -> pd.DataFrame:
    """The table as it was built before: one decode per text and state."""
    rows = []
    for text_id in sorted(predicted):
        for state in range(n_states):
            tokens = tokenizer.convert_ids_to_tokens(predicted[text_id][state].tolist())
            layer, half = labels[state] if labels else (state, None)
            rows.append({"text_id": text_id, "layer": layer, "half": half,
                         "text": tokenizer.convert_tokens_to_string(tokens)})
    columns = ["text_id", "layer", "half", "text"] if labels else ["text_id", "layer", "text"]
    return pd.DataFrame(rows, columns=["text_id", "layer", "half", "text"])[columns]


def byte_level() -> PreTrainedTokenizerFast:
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1, special_tokens=["<s>", "<pad>", "</s>", "<mask>"])
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", mask_token="<mask>")


def sentencepiece() -> PreTrainedTokenizerFast:
    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1, special_tokens=["<pad>", "<unk>", "[MASK]"])
    return PreTrainedTokenizerFast(tokenizer_object=sp._tokenizer, pad_token="<pad>", unk_token="<unk>",
                                   mask_token="[MASK]")


@pytest.mark.parametrize("make", [tiny_tokenizer, byte_level, sentencepiece], ids=["wordpiece", "byte-level",
                                                                                   "sentencepiece"])
@pytest.mark.parametrize("halves", [False, True])
def test_the_batched_table_equals_one_decode_per_row(make, halves):
    tokenizer = make()
    rng = np.random.default_rng(0)
    n_states = 5 if halves else 3
    labels = [(0, "output"), (1, "attention"), (1, "output"), (2, "attention"), (2, "output")] if halves else None
    predicted = {}
    for text_id in range(2000):
        n = int(rng.integers(1, 12))
        ids = rng.integers(0, len(tokenizer), (n_states, n))
        if text_id % 7 == 0:  # a real text's own pieces: multi-byte characters split across tokens
            own = tokenizer(CORPUS[text_id % len(CORPUS)], add_special_tokens=False)["input_ids"]
            ids = np.tile(np.asarray(own), (n_states, 1))
        predicted[text_id] = ids
    got = decoded_table(tokenizer, predicted, n_states, labels)
    expected = per_row(tokenizer, predicted, n_states, labels)
    pd.testing.assert_frame_equal(got, expected)
    assert len(got) == 2000 * n_states


@pytest.mark.parametrize("make", [tiny_tokenizer, byte_level, sentencepiece], ids=["wordpiece", "byte-level",
                                                                                   "sentencepiece"])
def test_the_vocabulary_tables_alone_give_every_row(make):
    """The tables' join itself (no sample check, no fallback) equals one decode per row, empty rows included."""
    from analysis.probe.decoding import _join, pieces

    tokenizer = make()
    found = pieces(tokenizer)
    assert found is not None and found[0] in ("WordPiece", "Metaspace", "ByteLevel")
    rng = np.random.default_rng(1)
    rows = [rng.integers(0, len(tokenizer), int(rng.integers(0, 9))).tolist() for _ in range(3000)]
    rows += [tokenizer(text, add_special_tokens=False)["input_ids"] for text in CORPUS[:8]]
    flat = np.asarray([i for r in rows for i in r], dtype=np.int64)
    got = _join(*found, flat, np.asarray([len(r) for r in rows]))
    assert got == [tokenizer.convert_tokens_to_string(tokenizer.convert_ids_to_tokens(r)) for r in rows]


def test_another_decoder_is_decoded_by_the_backend_row_by_row():
    from tokenizers import decoders

    from analysis.probe.decoding import decode_rows, pieces

    tokenizer = byte_level()
    tokenizer.backend_tokenizer.decoder = decoders.Sequence([decoders.ByteLevel()])
    assert pieces(tokenizer) is None
    rows = [[5, 6, 7], [], [8]]
    assert decode_rows(tokenizer, np.asarray([5, 6, 7, 8]), np.asarray([3, 0, 1])) == [
        tokenizer.convert_tokens_to_string(tokenizer.convert_ids_to_tokens(r)) for r in rows]
