"""AppTest of the reconstruction page: the numbers it shows are the engine's, bad input is a message."""

import numpy as np
import pandas as pd
import pytest

from analysis.core.inputs import TextInputs
from analysis.probe.reconstruction import ProbeConfig, probe
from models.loading import ModelSpec, load_model
from models.spec import short_name
from tests.support.pages import run_page

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


def test_the_attention_halves_are_two_points_per_layer(tiny_dirs):
    """The page's 'attention half' box: its table is the engine's with the half column, the curve has the
    attention half of layer l at l - 0.5, and the one-sentence views name each half."""
    at = run_page(PAGE, model=str(tiny_dirs["roberta"]))
    at.text_area(key="probe_text").set_value("the film is good .\nfun and very dull !").run()
    at.checkbox(key="probe_half").check().run()
    at.button(key="probe_run").click().run()
    assert not at.exception and not at.error
    shown = at.dataframe[0].value
    expected = probe(load_model(ModelSpec(str(tiny_dirs["roberta"]), device="cpu")),
                     TextInputs(("the film is good .", "fun and very dull !")), ProbeConfig(half="attention")).layers
    pd.testing.assert_frame_equal(shown.reset_index(drop=True), expected, check_dtype=False)
    curve, heatmap = (c.proto for c in at.get("plotly_chart"))
    import json

    traces = json.loads(curve.spec)["data"]
    accuracy = next(t for t in traces if t.get("name", "").endswith(": token accuracy"))
    assert accuracy["x"] == [0, 1, 2]  # the layers' outputs, joined by the line
    halves = next(t for t in traces if "attention half" in t.get("name", ""))  # their own markers and legend entry
    assert halves["x"] == [0.5, 1.5] and halves["mode"] == "markers" and halves["marker"]["symbol"] == "diamond-open"
    from tests.integration.test_page_heads import array

    np.testing.assert_allclose(array(halves["y"]), expected[expected.half == "attention"]["accuracy"])
    assert json.loads(heatmap.spec)["data"][0]["y"][1].endswith("attention half")


def test_compare_overlays_a_second_model(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_input(key="probe_compare").set_value(str(tiny_dirs["albert"])).run()
    at.button(key="probe_run").click().run()
    assert not at.exception and not at.error
    assert len(at.dataframe) == 2  # one layers table per model
    assert at.radio(key="probe_view").options == ["bert", "albert"]  # short names, never the server's path


def test_bad_second_model_is_a_message(tiny_dirs, tmp_path):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_input(key="probe_compare").set_value(str(tmp_path / "missing")).run()
    at.button(key="probe_run").click().run()
    assert not at.exception
    assert "Second model" in at.error[0].value
    assert "is not a model folder under the dashboard's model folders" in at.error[0].value
    assert len(at.dataframe) == 1  # the first model's results are still shown
    assert not at.get("progress")  # and the failed run left no progress bar behind


def test_empty_text_is_a_message(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_area(key="probe_text").set_value("   \n").run()
    assert not at.exception
    assert "no text given" in at.error[0].value


@pytest.mark.slow
def test_a_tuned_lens_overlays_raw_and_tuned_readings(tmp_path, monkeypatch):
    """The demo model's bundled lens: raw and tuned tables are the engine's, the divergence chart is shown, the
    per-token view can show either."""
    from analysis.probe import lens
    from models.spec import DEMO_DIR

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    at = run_page(PAGE, model="demo")
    assert at.selectbox(key="probe_lens").options[1:] == ["bundled lens"]
    at.checkbox(key="probe_half").check().run()  # ticked before a lens of the outputs only is chosen
    at.selectbox(key="probe_lens").set_value(DEMO_DIR / "lens").run()
    box = at.checkbox(key="probe_half_off")  # the bundled lens reads the layer outputs only: unticked, disabled
    assert box.disabled and not box.value and "trained on the layer outputs only" in box.help
    at.text_area(key="probe_text").set_value("the film is good .\nit was a dull movie .").run()
    at.button(key="probe_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    demo = load_model(ModelSpec("demo", device="cpu"))
    inputs = TextInputs(("the film is good .", "it was a dull movie ."))
    raw = probe(demo, inputs, ProbeConfig(), divergence=True).layers
    tuned = probe(demo, inputs, ProbeConfig(), lens=lens.load(DEMO_DIR / "lens", demo)).layers
    for shown, expected in zip(at.dataframe[:2], (raw, tuned), strict=True):
        pd.testing.assert_frame_equal(shown.value.reset_index(drop=True), expected, check_dtype=False)
    assert len(at.get("plotly_chart")) == 3  # accuracy, raw vs tuned divergence, token heat map
    assert at.radio(key="probe_view").options == ["demo", "demo · tuned lens (bundled lens)"]
    at.selectbox(key="probe_lens").set_value("(none)").run()  # back to no lens: the user's tick is still there
    assert at.checkbox(key="probe_half").value


def test_a_lens_job_is_queued_from_the_page(tmp_path, monkeypatch):
    from jobs.store import JobStore

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    at = run_page(PAGE, model="demo")
    at.number_input(key="lens_steps").set_value(20).run()
    at.button(key="lens_submit").click().run()
    assert not at.exception and "queued" in at.success[0].value
    job = JobStore(tmp_path / "jobs").list()[0]
    assert (job.config["kind"], job.config["steps"], job.config["corpus"], job.status) == ("lens", 20, "demo", "queued")


def test_a_second_model_of_another_depth_is_drawn_at_its_own_layers(tiny_dirs, tmp_path_factory):
    """Issue 24.2: the 3-layer curve was drawn under the 5-layer export's ticks ("3 ← 2"); each curve now sits at
    its own indices with its own names in the hover, or at relative depth i / L."""
    import json

    import pytest

    from tests.integration.test_page_atlas import deeper_export

    deeper = deeper_export(tiny_dirs, tmp_path_factory)
    own = {short_name(str(tiny_dirs["bert"])): load_model(ModelSpec(str(tiny_dirs["bert"]),
                                                                   device="cpu")).anatomy.layer_names(),
           short_name(str(deeper)): load_model(ModelSpec(str(deeper), device="cpu")).anatomy.layer_names()}
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_input(key="probe_compare").set_value(str(deeper)).run()
    at.button(key="probe_run").click().run()
    assert not at.exception and not at.error
    curve = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert "ticktext" not in curve["layout"]["xaxis"]  # no model's names under the other's points
    for label, names in own.items():
        traces = [t for t in curve["data"] if t.get("legendgroup") == label and t.get("customdata")]
        assert traces and all(t["x"] == list(range(len(names))) for t in traces)
        assert all([c[0] for c in t["customdata"]] == names for t in traces)
    at.checkbox(key="probe_relative").check().run()
    assert not at.exception
    curve = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert "relative depth" in curve["layout"]["xaxis"]["title"]["text"]
    for label, names in own.items():
        for t in (t for t in curve["data"] if t.get("legendgroup") == label and t.get("customdata")):
            assert t["x"] == pytest.approx([i / (len(names) - 1) for i in range(len(names))])


@pytest.mark.slow
def test_a_lens_of_both_halves_reads_the_attention_halves_on_the_page(tmp_path, monkeypatch):
    """Issue 36 item 5 on the page: a lens trained with half=attention is listed as '· both halves'; with the
    attention halves ticked its table is the engine's, two rows per layer."""
    from analysis.probe import lens
    from analysis.probe import lens_training as LT
    from analysis.probe.options import LensOptions

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    demo = load_model(ModelSpec("demo", device="cpu"))
    texts = ["the film is good .", "it was a dull movie .", "a fine and fun film", "not good at all"] * 5
    LT.train(demo, texts, LensOptions(model="demo", steps=2, batch_size=4, eval_texts=4, half="attention"),
             tmp_path / "lenses" / "halves")
    at = run_page(PAGE, model="demo")
    assert at.selectbox(key="probe_lens").options[1:] == ["bundled lens", "halves · both halves"]
    at.selectbox(key="probe_lens").set_value(tmp_path / "lenses" / "halves").run()
    at.checkbox(key="probe_half").check().run()
    at.text_area(key="probe_text").set_value("the film is good .\nit was a dull movie .").run()
    at.button(key="probe_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    inputs = TextInputs(("the film is good .", "it was a dull movie ."))
    tuned = probe(demo, inputs, ProbeConfig(half="attention"), lens=lens.load(tmp_path / "lenses" / "halves", demo))
    shown = at.dataframe[1].value.reset_index(drop=True)
    assert shown["half"].tolist() == ["output"] + ["attention", "output"] * demo.num_layers
    pd.testing.assert_frame_equal(shown, tuned.layers, check_dtype=False)
