"""A model whose own activations are not finite is refused by every analysis with one line naming the layer (issue
43, item 2): one check in the core (:func:`analysis.core.activations.check_finite`), on the hidden states every
extraction reads and on the attention weights the heads analysis reads.

The model: the tiny BERT with its embedding LayerNorm's gain times 1e5, run in float16. Its embedding output is
beyond float16's range (65,504), so from there on the states hold infinities and NaN (checked below with a plain
transformers forward, the premise)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

from cli.main import main
from tests.integration.test_attention_cli import TREEBANK

TEXTS = ["the film is good .", "i liked the movie , and it was fun !", "not very good", "it was a bad film ?"] * 3


@pytest.fixture(scope="module")
def overflowing(tiny_dirs, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("overflow")
    model = AutoModelForMaskedLM.from_pretrained(tiny_dirs["bert"])
    with torch.no_grad():
        model.bert.embeddings.LayerNorm.weight.mul_(1e5)
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(tiny_dirs["bert"]).save_pretrained(directory)
    return directory


def first_nonfinite(directory: Path, dtype=torch.float16) -> int:
    """The first hidden state that is not finite, from a plain transformers forward in ``dtype``."""
    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory, dtype=dtype).eval()
    with torch.no_grad():
        states = model(**tok(TEXTS[:2], padding=True, return_tensors="pt"), output_hidden_states=True).hidden_states
    return next(i for i, s in enumerate(states) if not torch.isfinite(s).all())


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("inputs")
    texts = folder / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    labelled = folder / "labelled.tsv"
    labelled.write_text("text\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(TEXTS)))
    return {"texts": texts, "labelled": labelled}


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err and "unexpected" not in err, err
    return lines[0]


COMMANDS = {
    "heads stats": lambda m, f, o: ["heads", "stats", "--model", m, "--input", str(f["texts"]), "--out", o],
    "heads parse": lambda m, f, o: ["heads", "parse", "--model", m, "--treebank", str(TREEBANK), "--out", o],
    "heads importance": lambda m, f, o: ["heads", "importance", "--model", m, "--input", str(f["texts"]),
                                         "--out", o],
    "atlas": lambda m, f, o: ["atlas", "--model", m, "--data", str(f["labelled"]), "--out", o],
    "probe": lambda m, f, o: ["probe", "--model", m, "--input", str(f["texts"]), "--out", o],
    "structure": lambda m, f, o: ["structure", "--model", m, "--train", str(TREEBANK), "--test",
                                  str(TREEBANK.with_name("ud_tiny_test.conllu")), "--out", o],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_analysis_refuses_a_model_whose_states_are_not_finite(command, overflowing, files, tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    first = first_nonfinite(overflowing)
    out = tmp_path / "out"
    argv = COMMANDS[command](str(overflowing), files, str(out)) + ["--device", "cpu", "--dtype", "float16"]
    assert main(argv) == 2
    line = one_line(capsys)
    assert "not finite" in line and "float16" in line and "float32" in line, line
    assert (f"hidden state {first}" in line or f"attention layer {first}" in line
            or f"attention layer {first + 1}" in line), line
    assert not out.exists() or not any(out.iterdir())  # nothing written that looks like a result


def test_the_same_model_in_float32_runs(overflowing, files, tmp_path, capsys, monkeypatch):
    """The premise of the refusals: the weights are fine, float16 is what overflows."""
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    with pytest.raises(StopIteration):
        first_nonfinite(overflowing, torch.float32)
    out = tmp_path / "out"
    assert main(["heads", "stats", "--model", str(overflowing), "--input", str(files["texts"]), "--out", str(out),
                 "--device", "cpu", "--dtype", "float32", "--no-clusters"]) == 0, capsys.readouterr().err
    assert json.loads((out / "run.json").read_text())["sentences"] == len(TEXTS)
