"""AppTest of the linguistic-structure page: the tables it shows are the engine's; bad input is a message."""

import shutil

import pandas as pd

from analysis.structure.options import StructureOptions
from analysis.structure.run import run_structure
from analysis.structure.treebank import read_conllu
from models.loading import ModelSpec, load_model
from tests.conftest import FIXTURES
from tests.test_app import run_page

PAGE = "pages/6_Linguistic_structure.py"


def roots(tmp_path, monkeypatch):
    shutil.copy(FIXTURES / "ud_tiny_train.conllu", tmp_path / "en_ewt-ud-dev.conllu")
    shutil.copy(FIXTURES / "ud_tiny_test.conllu", tmp_path / "en_ewt-ud-test.conllu")
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(tmp_path))


def test_structure_page_shows_the_engine_numbers(tiny_dirs, tmp_path, monkeypatch):
    roots(tmp_path, monkeypatch)
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    assert not at.exception and not at.error
    at.multiselect(key="structure_tasks").set_value(["upos", "distance"]).run()
    at.text_input(key="structure_layers").set_value("0,3").run()
    at.button(key="structure_run").click().run()
    assert not at.exception and not at.error
    expected = run_structure(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")),
                             read_conllu(tmp_path / "en_ewt-ud-dev.conllu"),
                             read_conllu(tmp_path / "en_ewt-ud-test.conllu"),
                             StructureOptions(tasks="upos,distance", layers="0,3"))
    summary = at.dataframe[0].value.reset_index(drop=True)
    pd.testing.assert_frame_equal(summary, expected.summary)
    assert any("first subword of each word" in c.value for c in at.caption)
    assert len(at.get("plotly_chart")) == 2  # the curves and the sentence's trees
    upos = at.dataframe[1].value
    assert list(upos.columns) == ["word", "gold", "layer 0", "layer 3"]
    at.select_slider(key="structure_layer").set_value("0").run()
    assert not at.exception


def test_bad_layers_are_a_message(tiny_dirs, tmp_path, monkeypatch):
    roots(tmp_path, monkeypatch)
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_input(key="structure_layers").set_value("9").run()
    assert not at.exception and "does not exist" in at.error[0].value
