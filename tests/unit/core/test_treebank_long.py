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


def blank_padded(path, blanks: int, crlf: bool = False):
    """Two sentences with ``blanks`` blank lines (some holding spaces) between them, gzipped."""
    import gzip

    one = "# sent_id = a\n1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n"
    two = "# sent_id = b\n1\tYes\tyes\tINTJ\t_\t_\t0\troot\t_\t_\n2\tno\tno\tX\t_\t_\t1\tdep\t_\t_\n"
    text = one + "\n" * (blanks - 1) + "  \t\n" + two + "\n" * blanks
    if crlf:
        text = text.replace("\n", "\r\n")
    path.write_bytes(gzip.compress(text.encode()))
    return path


def test_blank_lines_cost_no_python_work_per_line(tmp_path):
    """Issue 43 item 12: a .conllu.gz of blank lines took ~180 s of server CPU at the cap (one Python step per
    line). Blank runs are now skipped a block at a time: the Python work of reading two sentences does not grow
    with the blank lines between them (a count of line events, the same on any machine)."""
    few, bank_few = steps(blank_padded(tmp_path / "few.conllu.gz", 1_000))
    many, bank_many = steps(blank_padded(tmp_path / "many.conllu.gz", 300_000))
    assert many < 1.5 * few, (few, many)
    for bank in (bank_few, bank_many):
        assert [s.sent_id for s in bank.sentences] == ["a", "b"] and len(bank.sentences[1]) == 2


@pytest.mark.parametrize("crlf", [False, True])
def test_line_numbers_survive_the_skipped_blank_lines(tmp_path, crlf):
    path = blank_padded(tmp_path / "x.conllu.gz", 5_000, crlf)
    bank = read_conllu(path)
    assert [s.line for s in bank.sentences] == [1, 5_003]
    bad = tmp_path / "bad.conllu"
    bad.write_text("1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n" + "\n" * 7 + "1\tYes\tyes\tINTJ\t_\t_\t7\troot\n")
    with pytest.raises(InputError, match=r"bad.conllu.* 9\b|:9:"):
        read_conllu(bad)
