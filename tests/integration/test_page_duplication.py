"""AppTest of the layer duplication page: its numbers are the engine's; export and hand-over to the jobs page."""

import json

import pandas as pd
from transformers import AutoModelForMaskedLM

from analysis.core.inputs import TextInputs
from analysis.duplication.plan import duplicate_first
from analysis.tasks.duplication import compare
from models.loading import ModelSpec, load_model
from tests.support.pages import run_page
from ui.results import CHART_FORMAT

PAGE = "pages/4_Layer_Duplication.py"
TEXTS = ("the film is good .", "fun and very dull !")


def test_preview_shows_the_engine_numbers(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    assert not at.exception and not at.error
    at.slider(key="dup_k").set_value(2).run()
    at.text_area(key="dup_text").set_value("\n".join(TEXTS)).run()
    at.button(key="dup_preview").click().run()
    assert not at.exception and not at.error
    expected = compare(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")), duplicate_first(3, 2),
                       TextInputs(TEXTS))
    assert len(at.get("plotly_chart")) == 2  # accuracy curves, CKA
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True), expected["original"].layers)
    shown = at.dataframe[1].value.reset_index(drop=True)
    pd.testing.assert_frame_equal(shown.drop(columns="source"), expected["deeper"].layers)
    assert shown["source"].tolist() == ["embeddings", "1 ← 1", "2 ← 1", "3 ← 2", "4 ← 2", "5 ← 3"]


def chart_downloads(at) -> list[dict]:
    return [json.loads(c.proto.config)["toImageButtonOptions"] for c in at.get("plotly_chart")]


def test_every_chart_downloads_in_the_sidebar_format(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_area(key="dup_text").set_value("\n".join(TEXTS)).run()
    at.button(key="dup_preview").click().run()
    assert [(o["format"], o["filename"]) for o in chart_downloads(at)] == [
        ("png", "layerlens_duplication_accuracy"), ("png", "layerlens_duplication_cka")]
    at.sidebar.radio(key=CHART_FORMAT).set_value("svg").run()  # the preview result is shared: drawn again
    assert [o["format"] for o in chart_downloads(at)] == ["svg", "svg"]


def test_custom_plan_errors_are_messages(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.radio(key="dup_preset").set_value("Custom").run()
    at.text_input(key="dup_custom").set_value("0,5").run()
    assert not at.exception and "do not exist" in at.error[0].value
    at.text_input(key="dup_custom").set_value("").run()
    assert "empty" in at.error[0].value


def test_sweep_export_and_fine_tune_hand_over(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_area(key="dup_text").set_value("\n".join(TEXTS)).run()
    at.button(key="dup_sweep").click().run()
    assert not at.exception and "layerlens_duplication_sweep" in [o["filename"] for o in chart_downloads(at)]
    at.text_input(key="dup_target").set_value("../../escape").run()
    at.button(key="dup_export").click().run()
    assert "plain name" in at.error[0].value and not (tmp_path.parent / "escape").exists()
    at.text_input(key="dup_target").set_value("deeper").run()
    at.button(key="dup_export").click().run()
    assert not at.exception and "Saved to" in at.success[0].value
    target = tmp_path / "exports" / "deeper"  # always inside LAYERLENS_HOME
    assert AutoModelForMaskedLM.from_pretrained(target).config.num_hidden_layers == 6  # 3 + k=3
    at.button(key="dup_finetune").click().run()
    assert not at.exception
    assert at.text_input(key="job_model").value == str(target)


def test_albert_takes_a_depth(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["albert"]))
    assert not at.exception and at.number_input(key="dup_depth").value == 5
    at.text_area(key="dup_text").set_value("\n".join(TEXTS)).run()
    at.button(key="dup_preview").click().run()
    assert not at.exception and not at.error
    assert len(at.dataframe[1].value) == 6  # embeddings + 5 applications of the shared layer
