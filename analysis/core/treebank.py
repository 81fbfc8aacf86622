"""Universal Dependencies treebanks in CoNLL-U (plain or gzipped).

Following the UD guidelines (https://universaldependencies.org/format.html): a sentence's *words* are the lines
with an integer ID; multiword-token ranges (``1-2``, the surface token "don't" above its words "do" "n't") and
empty nodes (``8.1``, enhanced dependencies only) are not words and are skipped (counted). For each word we keep
FORM, UPOS, HEAD (0 = the root) and DEPREL, from the line's ten tab-separated fields; a sentence's ``sent_id`` is
its ``# sent_id = ...`` comment. Malformed input is an :class:`InputError` naming the file and line.

A file is streamed a block of lines at a time (:func:`analysis.core.textfiles.open_blocks`: runs of blank lines
skipped in C; a gzipped file yields at most ``LAYERLENS_MAX_DECOMPRESSED_MB``), reading stops at the sentence limit,
and a sentence may have at most ``LAYERLENS_MAX_SENTENCE_WORDS`` words (default 1,000): reading a sentence is linear
in its length.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from itertools import chain
from pathlib import Path

import numpy as np

from analysis.core.textfiles import InputError, open_blocks, setting

WORD_ID = re.compile(r"^[1-9][0-9]*$")
RANGE_ID = re.compile(r"^[1-9][0-9]*-[1-9][0-9]*$")
EMPTY_ID = re.compile(r"^[0-9]+\.[1-9][0-9]*$")
# The words one sentence may have. Every model family here reads at most 512 tokens and every word is at least one
# of them, so a sentence over ~510 words is always left out as too long (analysis.core.activations.encode_words); UD
# English-EWT's longest dev/test sentence has 81 words. 1,000 reads every sentence a model could take, and bounds
# a sentence's (n, n) tree distances at 8 MB.
MAX_SENTENCE_WORDS = 1000


@dataclasses.dataclass(frozen=True)
class Sentence:
    """One sentence's words (UD integer ids ``1..n`` are positions ``0..n-1`` here); ``heads`` keeps UD's
    numbering (0 = the root, ``i`` = word ``i``, i.e. position ``i - 1``)."""

    sent_id: str
    line: int  # the line of the file where the sentence starts (1-based)
    words: tuple[str, ...]
    upos: tuple[str, ...]
    heads: tuple[int, ...]
    deprels: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.words)

    @property
    def root(self) -> int:
        """Position (0-based) of the word whose head is 0."""
        return self.heads.index(0)

    def depths(self) -> np.ndarray:
        """``(n,)`` tree depth of each word: the root 0, its dependents 1, ... (Hewitt & Manning's depth)."""
        depth = np.full(len(self), -1)
        for i in range(len(self)):
            chain, j = [], i
            while depth[j] < 0 and self.heads[j] != 0:
                chain.append(j)
                j = self.heads[j] - 1
            base = 0 if depth[j] < 0 else depth[j]
            depth[j] = base
            for k, node in enumerate(reversed(chain), 1):
                depth[node] = base + k
        return depth

    def distances(self) -> np.ndarray:
        """``(n, n)`` path length between every two words in the undirected tree (Hewitt & Manning's
        ``d_T``), by breadth-first search from each word."""
        n = len(self)
        neighbours: list[list[int]] = [[] for _ in range(n)]
        for i, h in enumerate(self.heads):
            if h:
                neighbours[i].append(h - 1)
                neighbours[h - 1].append(i)
        out = np.zeros((n, n), dtype=np.int64)
        for start in range(n):
            seen, frontier, d = {start}, [start], 0
            while frontier:
                d += 1
                nxt = []
                for u in frontier:
                    for v in neighbours[u]:
                        if v not in seen:
                            seen.add(v)
                            out[start, v] = d
                            nxt.append(v)
                frontier = nxt
        return out


@dataclasses.dataclass(frozen=True)
class Treebank:
    path: str
    sentences: list[Sentence]
    multiword_tokens: int = 0  # range lines skipped
    empty_nodes: int = 0  # decimal-id lines skipped

    @property
    def n_words(self) -> int:
        return sum(map(len, self.sentences))

    def to_dict(self) -> dict:
        return {"path": self.path, "sentences": len(self.sentences), "words": self.n_words,
                "multiword_tokens_skipped": self.multiword_tokens, "empty_nodes_skipped": self.empty_nodes}


def max_sentence_words() -> int:
    """``LAYERLENS_MAX_SENTENCE_WORDS`` (default :data:`MAX_SENTENCE_WORDS`)."""
    return setting("LAYERLENS_MAX_SENTENCE_WORDS", MAX_SENTENCE_WORDS)


def _check_line(path: Path, number: int, cols: list[str]) -> str:
    """The kind of a token line's fields (``word``, ``range``, ``empty``), or an error naming ``path:number``."""
    if len(cols) != 10:
        raise InputError(f"{path}:{number}: expected 10 tab-separated CoNLL-U columns, found {len(cols)}")
    if WORD_ID.match(cols[0]):
        if not (cols[6].isascii() and cols[6].isdigit()):
            raise InputError(f"{path}:{number}: HEAD '{cols[6][:20]}' of word {cols[0]} is not a word number")
        if not cols[7] or cols[7] == "_":
            raise InputError(f"{path}:{number}: word {cols[0]} has no DEPREL")
        return "word"
    if RANGE_ID.match(cols[0]):
        return "range"
    if EMPTY_ID.match(cols[0]):
        return "empty"
    raise InputError(f"{path}:{number}: '{cols[0][:20]}' is not a CoNLL-U ID (a number, a range 1-2 or an empty "
                     "node 8.1)")


def _sentence(path: Path, start: int, words: list[tuple[int, list[str]]], sent_id: str | None,
              index: int) -> Sentence:
    """A sentence from its word lines (line number, fields), checked: ids 1..n, each HEAD another word or 0, one
    root, no cycle. Linear in its length: each word is walked towards the root once."""
    if not words:
        raise InputError(f"{path}:{start}: a sentence without words")
    n = len(words)
    heads = []
    for k, (number, cols) in enumerate(words, 1):
        if int(cols[0]) != k:
            raise InputError(f"{path}:{number}: word ids must run 1, 2, 3, ...; found {int(cols[0])} where {k} "
                             "belongs")
        head = int(cols[6])
        if not 0 <= head <= n or head == k:
            raise InputError(f"{path}:{number}: HEAD {head} of word {k} is not another word of the sentence "
                             f"(1..{n}) or 0")
        heads.append(head)
    if heads.count(0) != 1:
        raise InputError(f"{path}:{start}: the sentence starting here has {heads.count(0)} roots (HEAD 0); UD "
                         "trees have exactly one")
    state = [0] * n  # 0 not seen, 1 on the walk from the current word, 2 reaches the root
    for k in range(n):  # every word reaches the root: no cycle
        walk, j = [], k
        while state[j] == 0 and heads[j] != 0:
            state[j] = 1
            walk.append(j)
            j = heads[j] - 1
        if state[j] == 1:
            raise InputError(f"{path}:{words[k][0]}: the HEADs of the sentence starting at line {start} form a "
                             "cycle")
        for node in walk:
            state[node] = 2
        state[j] = 2
    return Sentence(sent_id or str(index + 1), start, tuple(c[1] for _, c in words),
                    tuple(c[3] or "_" for _, c in words), tuple(heads), tuple(c[7] for _, c in words))


_TEXT = re.compile(r"[^\n]+")  # a line that is not empty


def _lines_with_text(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of every line of ``path`` holding more than white space, streamed
    (:func:`analysis.core.textfiles.open_blocks`). Runs of blank lines are skipped a block at a time in C (a block
    of nothing but blank lines costs one ``strip``; the lines between two kept ones are counted, not visited): a
    file of blank lines reads at the text reader's speed, not at one Python step per line."""
    before = 0  # lines in the blocks before this one
    for block in open_blocks(path, str(path)):
        block = block.replace("\r\n", "\n")
        if block.strip():
            seen, at = before, 0  # lines before position ``at`` of the block
            for match in _TEXT.finditer(block):
                seen += block.count("\n", at, match.start())
                at = match.start()
                if not match.group().isspace():
                    yield seen + 1, match.group()
        before += block.count("\n") + (not block.endswith("\n"))


def read_conllu(path: str | Path, limit: int | None = None) -> Treebank:
    """The sentences of ``path`` (``.conllu`` or ``.conllu.gz``), at most ``limit`` of them (the first), read one
    line at a time; a sentence of more than :func:`max_sentence_words` words is an error naming it."""
    path = Path(path)
    cap = max_sentence_words()
    sentences: list[Sentence] = []
    ranges = empties = 0
    words: list[tuple[int, list[str]]] = []
    tokens = block_ranges = block_empties = 0  # token lines of the sentence being read, and of which kinds
    sent_id: str | None = None
    start = 0
    previous = 0
    for number, line in chain(_lines_with_text(path), [(None, "")]):
        if number is None or number > previous + 1:  # a blank line (or more) before this one, or the end
            if tokens:
                sentences.append(_sentence(path, start, words, sent_id, len(sentences)))
                ranges += block_ranges
                empties += block_empties
                if limit is not None and len(sentences) >= limit:
                    break
            words, tokens, block_ranges, block_empties, sent_id, start = [], 0, 0, 0, None, 0
            if number is None:
                break
        previous = number
        if not start:
            start = number
        if line.startswith("#"):  # a comment: only sent_id is kept (the last one with a value, as conllu does)
            key, _, value = line[1:].partition("=")
            if key.strip() == "sent_id" and value.strip():
                sent_id = value.strip()
            continue
        cols = line.split("\t")
        kind = _check_line(path, number, cols)
        tokens += 1
        if kind == "word":
            if len(words) >= cap:
                named = f"sentence {len(sentences) + 1}" + (f" (sent_id {sent_id})" if sent_id else "")
                raise InputError(f"{path}:{start}: {named} has more than {cap:,} words, the most one sentence may "
                                 "have (LAYERLENS_MAX_SENTENCE_WORDS; the models read at most 512 tokens)")
            words.append((number, cols))
        elif kind == "range":
            block_ranges += 1
        else:
            block_empties += 1
    if not sentences:
        raise InputError(f"{path}: no CoNLL-U sentences found")
    return Treebank(str(path), sentences, ranges, empties)
