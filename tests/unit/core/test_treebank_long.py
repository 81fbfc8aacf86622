"""A CoNLL-U sentence of many words (issue 34.14): one 20,000-word chain (622 KB) took 36-61 s in the server
process. Reading is linear in a sentence's length, and the words of one sentence are capped, with one line naming
the sentence."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from analysis.core.inputs import InputError
from analysis.core.treebank import read_conllu


def chain(path, n: int, sent_id: str = "long-1"):
    """A sentence of ``n`` words, each the dependent of the next (the last is the root): the deepest tree of its
    length, after a short first sentence."""
    short = "# sent_id = short-1\n1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n\n"
    words = "".join(f"{i}\tw{i}\tw\tNOUN\t_\t_\t{i + 1 if i < n else 0}\t{'dep' if i < n else 'root'}\t_\t_\n"
                    for i in range(1, n + 1))
    path.write_text(short + f"# sent_id = {sent_id}\n# text = a chain\n" + words + "\n")
    return path


def test_a_sentence_over_the_word_cap_is_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv("LAYERLENS_MAX_SENTENCE_WORDS", raising=False)
    path = chain(tmp_path / "chain.conllu", 20_000)
    with pytest.raises(InputError) as caught:
        read_conllu(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:4: ") and "sentence 2 (sent_id long-1)" in message, message
    assert "more than 1,000 words" in message and "LAYERLENS_MAX_SENTENCE_WORDS" in message and "\n" not in message
    assert len(read_conllu(path, limit=1).sentences) == 1  # the limit stops before the long sentence
    monkeypatch.setenv("LAYERLENS_MAX_SENTENCE_WORDS", "20000")
    assert len(read_conllu(path).sentences[1]) == 20_000  # a higher cap reads it
    monkeypatch.setenv("LAYERLENS_MAX_SENTENCE_WORDS", "ten")
    with pytest.raises(InputError, match="LAYERLENS_MAX_SENTENCE_WORDS must be a whole number"):
        read_conllu(path)


def steps(path) -> int:
    """Python line events executed while reading ``path`` (every frame: the reader's and the ``conllu``
    parser's): a count of work done, the same on any machine at any load."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        count += event == "line"
        return trace

    sys.settrace(trace)
    try:
        bank = read_conllu(path)
    finally:
        sys.settrace(None)
    return count, bank


def test_reading_a_sentence_is_linear_in_its_length(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERLENS_MAX_SENTENCE_WORDS", "100000")
    small, bank_small = steps(chain(tmp_path / "a.conllu", 1_000))
    large, bank_large = steps(chain(tmp_path / "b.conllu", 2_000))
    assert large / small < 2.5, (small, large)  # linear: about 2; the quadratic cycle check gave about 4
    for bank, n in ((bank_small, 1_000), (bank_large, 2_000)):
        sentence = bank.sentences[1]
        assert sentence.heads == tuple(range(2, n + 1)) + (0,) and sentence.root == n - 1
        np.testing.assert_array_equal(sentence.depths(), np.arange(n - 1, -1, -1))  # the chain's depths


@pytest.mark.parametrize("heads, line", [((2, 3, 1), 4), ((2, 1, 0), 2), ((0, 3, 4, 2), 3)])
def test_cycles_are_still_found_and_named(tmp_path, heads, line):
    """The linear check finds the same cycles as the old one, naming the line of the first word on one."""
    rows = "".join(f"{i}\tw\tw\tX\t_\t_\t{h}\t{'root' if h == 0 else 'dep'}\t_\t_\n" for i, h in enumerate(heads, 1))
    root = "1\tw\tw\tX\t_\t_\t0\troot\t_\t_\n" if 0 not in heads else ""
    path = tmp_path / "cycle.conllu"
    path.write_text("# sent_id = c\n" + rows + "\n" + (f"# sent_id = r\n{root}\n" if root else ""))
    with pytest.raises(InputError, match="form a cycle" if 0 in heads else "0 roots") as caught:
        read_conllu(path)
    if 0 in heads:
        assert str(caught.value).startswith(f"{path}:{line}: ")
