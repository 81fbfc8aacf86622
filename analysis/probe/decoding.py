"""The predicted text of many rows of token ids at once, for decoded.csv (issue 44 item 3: no strings per row).

A fast tokenizer's decoder turns a row's tokens into text. For the three decoders of the BERT families each token's
piece of the text depends only on the token and on whether it is the row's first, so the vocabulary is decoded once
(:func:`pieces`) and every row is a join of table entries, made for all rows in one pass:

- WordPiece (BERT, DistilBERT, ELECTRA; ``tokenizers`` ``decoders::wordpiece``): the first token as is, the others
  with their ``##`` prefix removed or a space before them, then its per-token clean-up;
- Metaspace (SentencePiece: ALBERT, XLM-R): ``▁`` is a space, except at the start of the first token;
- ByteLevel (RoBERTa): every token is a run of bytes (the GPT-2 byte-to-character table read backwards; a token
  with a character outside it, an added token, is its own UTF-8), the row's bytes joined and decoded as UTF-8 with
  invalid sequences replaced, as the decoder's ``from_utf8_lossy`` does. A character split across tokens is joined
  before it is decoded.

The tables are built with the tokenizer's own backend (``decode([id])`` and ``decode([ref, id])`` minus
``decode([ref])``), and checked against the backend's ``decode_batch`` on a sample of the rows before they are
used; any other decoder, or a sample that disagrees, takes ``decode_batch`` for every row. Equal to
``convert_tokens_to_string(convert_ids_to_tokens(ids))`` on every row: ``tests/unit/probe/test_decoded.py``.
"""

from __future__ import annotations

import functools

import numpy as np

SEPARABLE = ("WordPiece", "Metaspace")  # decoders whose pieces depend on the token and on being first
CHECK_ROWS = 64  # rows decoded both ways before a table is trusted


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """The GPT-2 byte-level alphabet read backwards: character -> byte (``tokenizers``' ``bytes_char``)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _token_bytes(token: str) -> bytes:
    table = _byte_of_char()
    if all(c in table for c in token):
        return bytes(table[c] for c in token)
    return token.encode("utf-8")


def pieces(tokenizer) -> tuple[str, np.ndarray, np.ndarray] | None:
    """``(kind, first, other)``: each id's piece of text as a row's first token and as a later one (object arrays;
    bytes for ``ByteLevel``), or None where the decoder is not one of the three."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    kind = type(getattr(backend, "decoder", None)).__name__
    if backend is None or kind not in (*SEPARABLE, "ByteLevel"):
        return None
    n = backend.get_vocab_size(with_added_tokens=True)
    ids = list(range(n))
    if kind == "ByteLevel":
        names = [backend.id_to_token(i) or "" for i in ids]
        table = np.empty(n, dtype=object)
        table[:] = [_token_bytes(t) for t in names]
        return kind, table, table
    first = np.empty(n, dtype=object)
    first[:] = backend.decode_batch([[i] for i in ids], skip_special_tokens=False)
    ref = next((i for i in ids if first[i]), 0)  # a token with text of its own
    other = np.empty(n, dtype=object)
    other[:] = [s[len(first[ref]):] for s in backend.decode_batch([[ref, i] for i in ids], skip_special_tokens=False)]
    return kind, first, other


_TABLES: dict[int, tuple] = {}  # id(tokenizer) -> (tokenizer, its tables): the tokenizers of the models in use


def tables(tokenizer):
    entry = _TABLES.get(id(tokenizer))
    if entry is None or entry[0] is not tokenizer:
        while len(_TABLES) >= 4:
            _TABLES.pop(next(iter(_TABLES)))
        entry = _TABLES[id(tokenizer)] = (tokenizer, pieces(tokenizer))
    return entry[1]


def _join(kind: str, first: np.ndarray, other: np.ndarray, flat: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Each row's text from the tables: the rows' pieces joined once, then cut at the rows' offsets."""
    starts = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    is_first = np.zeros(len(flat), bool)
    is_first[starts[:-1][lengths > 0]] = True
    chosen = np.where(is_first, first[flat], other[flat]) if len(flat) else np.empty(0, object)
    sizes = np.fromiter(map(len, chosen), np.int64, len(chosen))
    ends = np.zeros(len(chosen) + 1, np.int64)
    np.cumsum(sizes, out=ends[1:])
    cut = ends[starts].tolist()
    if kind == "ByteLevel":
        whole = b"".join(chosen)
        return [whole[a:b].decode("utf-8", errors="replace") for a, b in zip(cut[:-1], cut[1:], strict=True)]
    whole = "".join(chosen)
    return [whole[a:b] for a, b in zip(cut[:-1], cut[1:], strict=True)]


def decode_rows(tokenizer, flat: np.ndarray, lengths: np.ndarray) -> list[str]:
    """The text of each row of token ids: row ``i`` is ``flat[sum(lengths[:i]) : sum(lengths[:i + 1])]``."""
    found = tables(tokenizer)
    if found is not None and len(flat) and (flat.min() < 0 or flat.max() >= len(found[1])):
        found = None  # ids the tables do not hold: the backend says what they are
    if found is not None:
        texts = _join(*found, flat, lengths)
        sample = _rows(flat, lengths, np.linspace(0, len(lengths) - 1, min(CHECK_ROWS, len(lengths))).astype(int))
        backend = tokenizer.backend_tokenizer
        if backend.decode_batch(sample[1], skip_special_tokens=False) == [texts[i] for i in sample[0]]:
            return texts
    rows = _rows(flat, lengths, range(len(lengths)))[1]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.decode_batch(rows, skip_special_tokens=False)
    return [tokenizer.convert_tokens_to_string(tokenizer.convert_ids_to_tokens(r)) for r in rows]  # a slow one


def _rows(flat: np.ndarray, lengths: np.ndarray, which) -> tuple[list[int], list[list[int]]]:
    starts = np.concatenate([[0], np.cumsum(lengths)])
    which = list(which)
    return which, [flat[starts[i]:starts[i + 1]].tolist() for i in which]
