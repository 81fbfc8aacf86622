import json

import pytest

from analysis.core.inputs import InputError, columns_of, from_text_area, guess_text_column, parse, read_file
from tests.support.data import FIXTURES

SST2_DEV = FIXTURES / "sst2_dev_200.tsv"
SEMEVAL = FIXTURES / "semeval14_laptop_test_100.tsv"


def test_txt_one_text_per_line_blank_lines_skipped():
    got = parse(b"first line\n\n  second  \n", "a.txt")
    assert got.texts == ("first line", "second") and got.pairs is None


def test_tsv_is_read_with_quoting_off():
    data = b'text\tlabel\n"quoted start and no end\t1\nplain\t0\n'
    assert parse(data, "x.tsv").texts == ('"quoted start and no end', "plain")


def test_real_sst2_dev_reads_every_row():
    got = read_file(SST2_DEV)
    assert len(got) == 200 and got.texts[0].startswith("it 's a charming") and set(got.texts[:5]) != {""}


def test_pairs_from_aspect_column():
    got = read_file(SEMEVAL, column="text", pair_column="aspect", label_column="label")
    assert len(got.texts) == len(got.pairs) == 100 and got.pairs[0] == "Boot time"
    assert set(got.labels) <= {"positive", "negative", "neutral", "conflict"}


def test_csv_and_jsonl():
    assert parse(b'text,label\n"a, b",1\nc,0\n', "x.csv").texts == ("a, b", "c")
    rows = [{"text": "one", "text_pair": "two"}, {"text": "three", "text_pair": "four"}]
    data = "\n".join(json.dumps(r) for r in rows).encode()
    got = parse(data, "x.jsonl", pair_column="text_pair")
    assert got.texts == ("one", "three") and got.pairs == ("two", "four")
    assert columns_of(data, "x.jsonl") == ["text", "text_pair"]


def test_limit_and_empty_rows_are_reported():
    got = parse(b"text\na\n\nb\n \nc\nd\n", "x.csv", limit=3)
    assert got.texts == ("a", "b", "c") and got.dropped_over_limit == 1 and got.skipped_empty == 1
    assert any("row limit" in n for n in got.notes())
    got = parse(b"text\na\n\nb\n \nc\n\n \n", "x.csv", limit=3)  # only empty rows after the limit
    assert got.texts == ("a", "b", "c") and got.dropped_over_limit == 0 and got.skipped_empty == 1


@pytest.mark.parametrize("data, name, kwargs, message", [
    (b"", "x.txt", {}, "is empty"),
    (b"text\n\n \n", "x.csv", {}, "no usable rows"),
    (b"sentence,label\na,1\n", "x.csv", {}, "no column 'text' (columns found: sentence, label)"),
    (b"\xff\xfe\x00t\x00e", "x.txt", {}, "binary"),
    (b"caf\xe9\n", "x.txt", {}, "not UTF-8"),
    (b"{not json}\n", "x.jsonl", {}, "line 1: not valid JSON"),
    (b"[1, 2]\n", "x.jsonl", {}, "a JSON object per line"),
    (b"a\n", "x.pdf", {}, "use one of .txt"),
    (b"a\n", "x.txt", {"pair_column": "b"}, "text pairs and labels need"),
])
def test_bad_input_messages(data, name, kwargs, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse(data, name, **kwargs)


def test_text_area_and_missing_file(tmp_path):
    with pytest.raises(InputError, match="no text given"):
        from_text_area("  \n ")
    assert from_text_area("a\nb").texts == ("a", "b")
    with pytest.raises(InputError, match="no such file"):
        read_file(tmp_path / "none.tsv")


@pytest.mark.parametrize("content, name, expected", [
    ("id,sentence,source\n1,the film is good,imdb\n2,a dull movie,rt\n", "x.csv", "sentence"),
    ("id,body,src\n1,the film is good,imdb\n2,a dull movie,rt\n", "x.csv", "body"),  # most letters
    ("n\tReview\n1\tgreat\n", "x.tsv", "Review"),
    ('{"idx": 1, "utterance": "hello there"}\n', "x.jsonl", "utterance"),
])
def test_the_text_column_is_guessed_by_name_then_by_letters(content, name, expected):
    assert guess_text_column(content.encode(), name) == expected


def test_a_missing_column_lists_the_columns(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("id,sentence,source\n1,good,imdb\n")
    with pytest.raises(InputError, match=r"no column 'text' \(columns found: id, sentence, source\)"):
        read_file(path)


@pytest.mark.parametrize("name, content, line, fields", [
    ("rows.tsv", "text\tlabel\ngood film\tpos\nbad\tfilm\tneg\n", 3, 3),  # a tab inside the text: an extra field
    ("rows.tsv", "text\tlabel\ngood film\tpos\nshort row\n", 3, 1),
    ("rows.csv", "text,label\ngood film,pos\nbad, really bad,neg\n", 3, 3),
    ("rows.csv", 'text,label\n"multi\nline",pos\nx\n', 4, 1),  # the csv module's own line count
])
def test_a_row_with_the_wrong_number_of_fields_is_an_error_not_data(name, content, line, fields):
    with pytest.raises(InputError, match=rf"{name}, line {line}: {fields} fields, but the header has 2"):
        parse(content.encode(), name, label_column="label")


def test_quoted_commas_stay_in_their_field():
    data = parse(b'text,label\n"bad, really bad",neg\n', "rows.csv", label_column="label")
    assert data.texts == ("bad, really bad",) and data.labels == ("neg",)


UNCLOSED = 'text,label\ngood film,pos\nbad film,"neg\n' + "fine,pos\n" * 50  # the quote on line 3 swallows the rest


@pytest.mark.parametrize("name, content, where, why", [
    ("rows.csv", "text,text,label\na,b,pos\n", "rows.csv, line 1, column 2", "the header repeats the name of column 1"),
    ("rows.tsv", "label\ttext\tlabel\na\tb\tpos\n", "rows.tsv, line 1, column 3",
     "the header repeats the name of column 1"),
    ("rows.jsonl", '{"text": "a", "label": "pos"}\n{"text": "b", "text": "c", "label": "neg"}\n',
     "rows.jsonl, line 2, column text", "the object names this key twice"),
    ("rows.jsonl", '{"text": "a", "label": "pos"}\n{"text": {"secret": 1}, "label": "neg"}\n',
     "rows.jsonl, line 2, column text", "a JSON object, not a text"),
    ("rows.jsonl", '{"text": "a", "label": "pos"}\n\n{"text": "b", "label": ["neg"]}\n',
     "rows.jsonl, line 3, column label", "a JSON array, not a label"),
    ("rows.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": NaN}\n',
     "rows.jsonl, line 2, column label", "not a finite number"),
    ("rows.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": 1e999}\n',
     "rows.jsonl, line 2, column label", "not a finite number"),
    ("rows.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": -Infinity}\n',
     "rows.jsonl, line 2, column label", "not a finite number"),
    ("rows.csv", UNCLOSED, "rows.csv, line 3, column 10", "a quote opened here is never closed"),
    ("rows.csv", 'text,label\n"good,pos\n' + "fine,pos\n" * 5, "rows.csv, line 2, column 1",
     "a quote opened here is never closed"),
    ("rows.csv", 'text,label\ngood film,pos\nbad film,"neg', "rows.csv, line 3, column 10",
     "a quote opened here is never closed"),  # on the last line, no newline after it
])
def test_malformed_data_is_an_error_naming_file_line_and_column(name, content, where, why):
    with pytest.raises(InputError) as caught:
        parse(content.encode(), name, label_column="label")
    message = str(caught.value)
    assert message.startswith(where + ": ") and why in message and "\n" not in message, message
    assert "secret" not in message and "neg" not in message and "fine" not in message  # never the file's content


def test_labels_are_text_or_finite_numbers():
    data = parse(b'{"text": "a", "label": 1.0}\n{"text": "b", "label": "1"}\n{"text": "c", "label": "NaN"}\n'
                 b'{"text": "d", "label": 2.5}\n', "x.jsonl", label_column="label")
    assert data.labels == ("1", "1", "NaN", "2.5")  # a label typed as text stays text, numbers agree
    data = parse(b"text,label\na,NaN\nb,1e999\nc,1.0\n", "x.csv", label_column="label")
    assert data.labels == ("NaN", "1e999", "1")  # CSV cells are text: kept as typed


def test_a_quoted_field_closed_on_a_later_line_is_still_one_text():
    data = parse(b'text,label\n"two\nlines",pos\n"say ""hi""",neg\n', "x.csv", label_column="label")
    assert data.texts == ("two lines", 'say "hi"') and data.labels == ("pos", "neg")


def test_unnamed_columns_may_repeat():
    """A spreadsheet's export with empty trailing columns: their names (none) repeat, and no one can choose them."""
    data = parse(b"text,label,,\na,pos,,\nb,neg,,\n", "x.csv", label_column="label")
    assert data.texts == ("a", "b") and data.labels == ("pos", "neg")
