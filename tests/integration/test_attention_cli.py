"""``layerlens heads stats|parse|importance|view``: the files and their columns, the numbers equal to the engine's,
and each bad input one line on stderr with exit status 2."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from analysis.core.inputs import TextInputs
from analysis.core.treebank import read_conllu
from analysis.heads.importance import mlm_importance
from analysis.heads.model import load_eager
from analysis.heads.run import analyse
from analysis.heads.stats import STATISTICS
from analysis.heads.view import head_view
from cli.main import main
from models.loading import ModelSpec, load_model
from tests.support.data import FIXTURES
from tests.support.models import tiny_tokenizer

TEXTS = ("the film is good .", "i liked the movie , and it was fun !", "not very good", "it was a bad film ?")
TREEBANK = FIXTURES / "ud_tiny_train.conllu"


@pytest.fixture
def texts(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


def run(argv, capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def test_stats_writes_the_engines_tables(tiny_dirs, tmp_path, texts, capsys):
    model = str(tiny_dirs["bert"])
    code, err = run(["heads", "stats", "--model", model, "--input", str(texts), "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    expected = analyse(load_eager(ModelSpec(model, device="cpu")), TextInputs(TEXTS), parse=False)
    heads = pd.read_csv(tmp_path / "o" / "heads.csv")
    assert list(heads.columns) == ["layer", "head", "sentences", *[f"{s}{x}" for s in STATISTICS
                                                                   for x in ("", "_low", "_high")]]
    pd.testing.assert_frame_equal(heads, expected.heads, check_dtype=False)
    clusters = pd.read_csv(tmp_path / "o" / "clusters.csv")
    assert list(clusters.columns) == ["layer", "head", "x", "y"]
    pd.testing.assert_frame_equal(clusters, expected.clusters, check_dtype=False)
    info = json.loads((tmp_path / "o" / "run.json").read_text())
    assert info["model"] == model and info["sentences"] == 4 and info["options"]["cluster_tokens"] == 2048
    assert "Student t" in info["intervals"]["heads.csv"] and "transformers" in info["versions"]


def test_parse_writes_relations_accuracies_and_uuas(tiny_dirs, tmp_path, capsys):
    model = str(tiny_dirs["bert"])
    out = tmp_path / "o"
    code, err = run(["heads", "parse", "--model", model, "--treebank", str(TREEBANK), "--out", str(out),
                     "--min-count", "2", "--reading", "row", "--tree", "max"], capsys)
    assert code == 0, err
    expected = analyse(load_eager(ModelSpec(model, device="cpu")), read_conllu(TREEBANK), statistics=False,
                       clusters=False, min_count=2, reading="row", symmetry="max")
    assert len(expected.relations) and "left out" in err
    relations = pd.read_csv(out / "relations.csv")
    assert list(relations.columns) == ["relation", "direction", "layer", "head", "accuracy", "low", "high",
                                       "baseline_offset", "baseline_accuracy", "count", "selection_accuracy",
                                       "selection_count"]
    pd.testing.assert_frame_equal(relations, expected.relations, check_dtype=False)
    pd.testing.assert_frame_equal(pd.read_csv(out / "head_accuracies.csv"), expected.accuracies, check_dtype=False)
    pd.testing.assert_frame_equal(pd.read_csv(out / "uuas.csv"), expected.uuas, check_dtype=False)
    info = json.loads((out / "run.json").read_text())
    assert "Wilson" in info["intervals"]["relations.csv"] and "fixed offset" in info["baseline"]
    assert "Student t" not in json.dumps(info)  # issue 43 item 8: a parse run has no t interval


def test_importance_on_texts_equals_the_engine(tiny_dirs, tmp_path, texts, capsys):
    model = str(tiny_dirs["bert"])
    out = tmp_path / "o"
    code, err = run(["heads", "importance", "--model", model, "--input", str(texts), "--steps", "3", "--out",
                     str(out)], capsys)
    assert code == 0, err
    expected = mlm_importance(load_model(ModelSpec(model, device="cpu")), TextInputs(TEXTS), batch_size=32, steps=3)
    importance = pd.read_csv(out / "importance.csv")
    assert list(importance.columns) == ["layer", "head", "importance", "importance_low", "importance_high",
                                        "normalized", "order", "layer_prunable_share"]
    pd.testing.assert_frame_equal(importance, expected.importance, check_dtype=False)
    pruning = pd.read_csv(out / "pruning.csv")
    assert list(pruning.columns) == ["order", "seed", "fraction", "masked", "accuracy"]
    np.testing.assert_allclose(pruning.accuracy, expected.pruning.accuracy)
    assert json.loads((out / "run.json").read_text())["base_accuracy"] == expected.info["base_accuracy"]


@pytest.fixture
def classifier(tmp_path):
    config = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, num_labels=2,
                        id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    torch.manual_seed(0)
    directory = tmp_path / "classifier"
    BertForSequenceClassification(config).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def test_importance_of_a_classifier_on_a_labelled_set(classifier, tmp_path, capsys):
    data = tmp_path / "data.tsv"
    data.write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in zip(TEXTS, ("pos", "pos", "neg", "neg"),
                                                                         strict=True)))
    code, err = run(["heads", "importance", "--model", str(classifier), "--data", str(data), "--steps", "2",
                     "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    importance = pd.read_csv(tmp_path / "o" / "importance.csv")
    assert len(importance) == 4 and importance.importance.ge(0).all()
    assert json.loads((tmp_path / "o" / "run.json").read_text())["targets"] == 4
    bad = tmp_path / "bad.tsv"
    bad.write_text("text\tlabel\nthe film\tmaybe\n")
    code, err = run(["heads", "importance", "--model", str(classifier), "--data", str(bad), "--out",
                     str(tmp_path / "b")], capsys)
    assert code == 2 and "is not one of the classifier's classes" in err


def test_view_writes_every_head_and_one_heads_rows(tiny_dirs, tmp_path, capsys):
    model = str(tiny_dirs["bert"])
    out = tmp_path / "o"
    code, err = run(["heads", "view", "--model", model, "--text", "the film is good .", "--layer", "2", "--head",
                     "1", "--compare", "random", "--out", str(out)], capsys)
    assert code == 0, err
    view = head_view(load_eager(ModelSpec(model, device="cpu")), "the film is good .")
    twin = head_view(load_eager(ModelSpec(f"random:{model}", device="cpu")), "the film is good .")
    saved = np.load(out / "attention.npz")
    np.testing.assert_allclose(saved["attention"], view.attention)
    np.testing.assert_allclose(saved["attention_compared"], twin.attention)
    np.testing.assert_allclose(saved["difference"], twin.attention - view.attention, atol=1e-7)
    assert list(saved["tokens"]) == view.tokens
    rows = pd.read_csv(out / "attention.csv")
    assert list(rows.columns) == ["layer", "head", "from_position", "from_token", "to_position", "to_token", "weight"]
    np.testing.assert_allclose(rows.weight.to_numpy().reshape(7, 7), view.attention[1, 1], rtol=1e-6)
    info = json.loads((out / "run.json").read_text())
    assert info["tokens"] == view.tokens and info["compared"]["model"] == f"random:{model}"


def test_bad_inputs_are_one_line_and_exit_2(tiny_dirs, tmp_path, texts, capsys):
    model = str(tiny_dirs["bert"])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    cases = [
        (["view", "--text", "the film", "--layer", "1", "--head", "5"], "head 5 is out of range: each layer has "
                                                                         "heads 0 to 1"),
        (["view", "--text", "the film", "--layer", "9"], "layer 9 is out of range"),
        (["view", "--text", "film " * 80], "over the model's limit of 64"),
        (["view", "--text", "film", "--head", "1"], "--head needs --layer"),
        (["stats", "--input", str(empty)], "empty"),
        (["stats", "--input", str(tmp_path / "missing.txt")], "no such file"),
        (["parse", "--treebank", str(TREEBANK), "--relations", "frobnicate"], "none of the relations asked for"),
        (["importance", "--data", str(texts)], "no sequence-classification head"),
    ]
    for argv, message in cases:
        out = tmp_path / f"out{len(argv)}"
        code, err = run(["heads", argv[0], "--model", model, *argv[1:], "--out", str(out)], capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], (argv, err)
        assert not out.exists()  # nothing half-written
    code, err = run(["heads", "stats", "--model", model, "--input", str(texts)], capsys)
    assert code == 2 and "--out DIR is required" in err
