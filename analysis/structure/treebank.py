"""Universal Dependencies treebanks in CoNLL-U (plain or gzipped), read with the ``conllu`` parser.

Following the UD guidelines (https://universaldependencies.org/format.html): a sentence's *words* are the lines
with an integer ID; multiword-token ranges (``1-2``, the surface token "don't" above its words "do" "n't") and
empty nodes (``8.1``, enhanced dependencies only) are not words and are skipped (counted). For each word we keep
FORM, UPOS, HEAD (0 = the root) and DEPREL. Malformed input is an :class:`InputError` naming the file and line.
"""

from __future__ import annotations

import dataclasses
import gzip
import re
from pathlib import Path

import conllu
import numpy as np

from analysis.inputs import InputError

WORD_ID = re.compile(r"^[1-9][0-9]*$")
RANGE_ID = re.compile(r"^[1-9][0-9]*-[1-9][0-9]*$")
EMPTY_ID = re.compile(r"^[0-9]+\.[1-9][0-9]*$")


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


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="") as f:
            return f.read().replace("\r\n", "\n").split("\n")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a CoNLL-U file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except (OSError, EOFError) as exc:  # a damaged .gz
        raise InputError(f"{path}: cannot be read ({exc.__class__.__name__})") from None


def _check_line(path: Path, number: int, line: str) -> str:
    """The kind of a token line (``word``, ``range``, ``empty``), or an error naming ``path:number``."""
    cols = line.split("\t")
    if len(cols) != 10:
        raise InputError(f"{path}:{number}: expected 10 tab-separated CoNLL-U columns, found {len(cols)}")
    if WORD_ID.match(cols[0]):
        if not cols[6].isdigit():
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


def _sentence(path: Path, start: int, block: list[str], kinds: list[str], index: int) -> Sentence:
    try:
        tokens = conllu.parse("\n".join(block) + "\n\n")[0]
    except conllu.exceptions.ParseException as exc:
        raise InputError(f"{path}:{start}: the sentence starting here cannot be parsed ({exc})") from None
    numbers = [n for n, k in zip(range(start, start + len(block)), kinds, strict=True) if k == "word"]
    words = [t for t in tokens if isinstance(t["id"], int)]
    if not words:
        raise InputError(f"{path}:{start}: a sentence without words")
    n = len(words)
    for k, (t, number) in enumerate(zip(words, numbers, strict=True), 1):
        if t["id"] != k:
            raise InputError(f"{path}:{number}: word ids must run 1, 2, 3, ...; found {t['id']} where {k} belongs")
        if not 0 <= t["head"] <= n or t["head"] == k:
            raise InputError(f"{path}:{number}: HEAD {t['head']} of word {k} is not another word of the sentence "
                             f"(1..{n}) or 0")
    heads = tuple(t["head"] for t in words)
    if heads.count(0) != 1:
        raise InputError(f"{path}:{start}: the sentence starting here has {heads.count(0)} roots (HEAD 0); UD "
                         "trees have exactly one")
    for k in range(n):  # every word reaches the root: no cycle
        seen, j = set(), k
        while heads[j] != 0:
            if j in seen:
                raise InputError(f"{path}:{numbers[k]}: the HEADs of the sentence starting at line {start} form a "
                                 "cycle")
            seen.add(j)
            j = heads[j] - 1
    sent_id = tokens.metadata.get("sent_id") or str(index + 1)
    return Sentence(sent_id, start, tuple(t["form"] for t in words), tuple(t["upos"] or "_" for t in words),
                    heads, tuple(t["deprel"] for t in words))


def read_conllu(path: str | Path, limit: int | None = None) -> Treebank:
    """The sentences of ``path`` (``.conllu`` or ``.conllu.gz``), at most ``limit`` of them (the first)."""
    path = Path(path)
    lines = _lines(path)
    sentences: list[Sentence] = []
    ranges = empties = 0
    block: list[str] = []
    kinds: list[str] = []
    start = 0
    for number, line in enumerate(lines + [""], 1):
        if not line.strip():
            if any(k != "comment" for k in kinds):
                sentences.append(_sentence(path, start, block, kinds, len(sentences)))
                ranges += kinds.count("range")
                empties += kinds.count("empty")
                if limit is not None and len(sentences) >= limit:
                    break
            block, kinds = [], []
            continue
        if not block:
            start = number
        block.append(line)
        kinds.append("comment" if line.startswith("#") else _check_line(path, number, line))
    if not sentences:
        raise InputError(f"{path}: no CoNLL-U sentences found")
    return Treebank(str(path), sentences, ranges, empties)
