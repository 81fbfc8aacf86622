"""AppTest of the reconstruction page: the numbers it shows are the engine's, bad input is a message."""

import pandas as pd

from analysis.inputs import TextInputs
from analysis.reconstruction import ProbeConfig, probe
from models.loading import ModelSpec, load_model
from tests.test_app import run_page

PAGE = "pages/1_Reconstruction.py"


def test_probe_page_shows_the_engine_numbers(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    assert not at.exception
    at.text_area(key="probe_text").set_value("the film is good .\nfun and very dull !").run()
    at.button(key="probe_run").click().run()
    assert not at.exception and not at.error
    shown = at.dataframe[0].value
    expected = probe(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")),
                     TextInputs(("the film is good .", "fun and very dull !")), ProbeConfig()).layers
    pd.testing.assert_frame_equal(shown.reset_index(drop=True), expected, check_dtype=False)
    assert len(at.get("plotly_chart")) == 2  # accuracy curve, token heat map
    # another sentence: the page re-renders from the cached result
    at.selectbox(key="probe_sentence").set_value(1).run()
    assert not at.exception


def test_compare_overlays_a_second_model(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_input(key="probe_compare").set_value(str(tiny_dirs["albert"])).run()
    at.button(key="probe_run").click().run()
    assert not at.exception and not at.error
    assert len(at.dataframe) == 2  # one layers table per model
    assert at.radio(key="probe_view").options == [str(tiny_dirs["bert"]), str(tiny_dirs["albert"])]


def test_bad_second_model_is_a_message(tiny_dirs, tmp_path):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_input(key="probe_compare").set_value(str(tmp_path / "missing")).run()
    at.button(key="probe_run").click().run()
    assert not at.exception
    assert "Second model" in at.error[0].value and "is not a directory" in at.error[0].value
    assert len(at.dataframe) == 1  # the first model's results are still shown
    assert not at.get("progress")  # and the failed run left no progress bar behind


def test_empty_text_is_a_message(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_area(key="probe_text").set_value("   \n").run()
    assert not at.exception
    assert "no text given" in at.error[0].value
