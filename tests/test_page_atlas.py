"""AppTest of the layer atlas page: the numbers it shows are the engine's; bad input is a message."""

import pandas as pd

from analysis.inputs import read_file
from analysis.projection import AtlasConfig, atlas
from models.loading import ModelSpec, load_model
from tests.test_app import run_page
from ui.inputs import DEMO_LABELLED

PAGE = "pages/2_Layer_Atlas.py"


def test_atlas_page_shows_the_engine_numbers(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    assert not at.exception and not at.error
    at.button(key="atlas_run").click().run()
    assert not at.exception and not at.error
    expected = atlas(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")),
                     read_file(DEMO_LABELLED, label_column="label"), AtlasConfig())
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True), expected.separability)
    assert len(at.get("plotly_chart")) == 3  # small multiples, separability curve, CKA
    assert "[CLS] is just its token and position embedding" in at.info[0].value


def test_pairs_mean_pooling_and_a_second_model(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.checkbox(key="atlas_demo_pair").check().run()
    at.radio(key="atlas_pool").set_value("mean").run()
    at.text_input(key="atlas_layers").set_value("all").run()
    at.text_input(key="atlas_compare").set_value(str(tiny_dirs["roberta"])).run()
    at.button(key="atlas_run").click().run()
    assert not at.exception and not at.error
    assert len(at.get("plotly_chart")) == 4  # two grids, one curve, one CKA
    assert at.radio(key="atlas_cka").options == [str(tiny_dirs["bert"]), str(tiny_dirs["roberta"])]
    expected = atlas(load_model(ModelSpec(str(tiny_dirs["roberta"]), device="cpu")),
                     read_file(DEMO_LABELLED, pair_column="aspect", label_column="label"),
                     AtlasConfig(pooling="mean", layers="all"))
    pd.testing.assert_frame_equal(at.dataframe[1].value.reset_index(drop=True), expected.separability)


def test_bad_layers_and_missing_model_are_messages(tiny_dirs, tmp_path):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_input(key="atlas_layers").set_value("9").run()
    assert not at.exception and "does not exist" in at.error[0].value
    at.text_input(key="atlas_layers").set_value("-2:").run()
    at.text_input(key="atlas_compare").set_value(str(tmp_path / "missing")).run()
    at.button(key="atlas_run").click().run()
    assert not at.exception
    assert "Second model" in at.error[0].value and len(at.get("plotly_chart")) == 3


def test_more_rows_than_the_limit_needs_an_explicit_sample(tiny_dirs, monkeypatch):
    monkeypatch.setenv("LAYERLENS_ATLAS_MAX_ROWS", "100")
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    assert not at.exception and "more than this page's limit of 100" in at.warning[0].value
    assert "atlas_run" not in [b.key for b in at.button]  # nothing runs until the sample is chosen
    at.checkbox(key="atlas_sample").check().run()
    at.button(key="atlas_run").click().run()
    assert not at.exception and not at.error
    assert any(c.value.startswith("100 rows") for c in at.caption)
