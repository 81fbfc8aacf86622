"""AppTests of the Compare checkpoints page: the tables it shows are the engine's; a bad B is a message; the jobs
page opens it on a job's epochs and on a sweep group."""

import numpy as np
import pandas as pd
import pytest

from analysis.compare.run import CompareConfig
from analysis.core.inputs import read_file
from analysis.tasks.comparing import compare
from models.loading import ModelSpec, load_model
from tests.support.pages import run_page
from tests.unit.compare.test_compare_jobs import run_job
from ui.inputs import DEMO_LABELLED

PAGE, JOBS = "pages/7_Compare_checkpoints.py", "pages/5_Fine_Tune_Jobs.py"


def shown_summary(at) -> pd.DataFrame:
    return at.dataframe[0].value.reset_index(drop=True)


@pytest.mark.slow
def test_the_page_shows_the_engines_layer_summary_and_refuses_other_tokenizers(tiny_dirs):
    at = run_page(PAGE)  # the demo model as A
    assert not at.exception and not at.error
    at.text_input(key="compare_model").set_value("random").run()
    at.button(key="compare_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    demo = load_model(ModelSpec("demo", device="cpu"))
    random = load_model(ModelSpec("random:demo", device="cpu"))
    want = compare([demo, random], read_file(DEMO_LABELLED, label_column="label"), CompareConfig()).layer_summary
    pd.testing.assert_frame_equal(shown_summary(at), want.drop(columns=["model_a", "model_b"]), check_exact=False,
                                  atol=1e-9)
    assert len(at.get("plotly_chart")) == 5  # CKA, probe and reconstruction curves, the cross matrix, the shared map
    at.text_input(key="compare_model").set_value(str(tiny_dirs["roberta"])).run()
    at.button(key="compare_run").click().run()
    assert not at.exception and "different tokenizers" in at.error[0].value


@pytest.mark.slow
def test_a_classifier_is_read_with_the_head_named_for_b_and_its_own_predictions_shown(tiny_dirs, tmp_path):
    from tests.unit.compare.test_compare import fine_tuned_classifier

    base = tiny_dirs["bert"]
    clf = fine_tuned_classifier(base, tmp_path / "clf")
    at = run_page(PAGE, model=str(base))
    at.text_input(key="compare_model").set_value(str(clf)).run()
    at.button(key="compare_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert shown_summary(at)["recon_accuracy_b"].isna().all()
    assert any("Read B's layers with the MLM head of" in c.value for c in at.caption)
    at.text_input(key="compare_head_from").set_value(str(base)).run()
    at.button(key="compare_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    a = load_model(ModelSpec(str(base), device="cpu"))
    b = load_model(ModelSpec(str(clf), device="cpu", head_from=str(base)))
    want = compare([a, b], read_file(DEMO_LABELLED, label_column="label"), CompareConfig()).layer_summary
    pd.testing.assert_frame_equal(shown_summary(at), want.drop(columns=["model_a", "model_b"]), check_exact=False,
                                  atol=1e-9)
    assert any(f"read by the MLM head from {base}" in c.value for c in at.caption)
    assert any("BertForSequenceClassification" in c.value for c in at.caption)
    movers = at.dataframe[1].value
    assert {"probe_prediction_a", "probe_prediction_b", "head_prediction_b"} <= set(movers.columns)
    assert "head_prediction_a" not in movers.columns  # a masked LM has no classifier head: not shown


@pytest.mark.slow
def test_the_jobs_page_opens_a_jobs_epochs_and_a_group_on_the_compare_page(home, bert4, tmp_path):  # noqa: F811
    from analysis.tasks.epochs import compare_epochs
    from analysis.training.runs import job_run

    job = run_job(home, bert4, tmp_path, group="sweep-1")
    second = run_job(home, bert4, tmp_path, group="sweep-1", seed=1)
    at = run_page(JOBS, model=str(bert4))
    at.selectbox(key="job_compare_one").set_value(job.id).run()
    at.button(key="job_go_compare_base").click().run()
    assert not at.exception
    assert at.session_state["compare_what"] == "epochs" and at.session_state["compare_epochs_job"] == job.id
    at.switch_page(PAGE).run()  # AppTest reruns the page it was sent to, not the app's
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.button(key="compare_epochs_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    run = job_run(job.artifacts, job.config, job.metrics, job.label)
    base = load_model(ModelSpec(str(bert4), device="cpu"))
    want = compare_epochs(base, run, CompareConfig(), load_model(run.checkpoint_spec()))
    pd.testing.assert_frame_equal(shown_summary(at), want.layer_summary.drop(columns=["model_a"]),
                                  check_exact=False, atol=1e-9)
    assert at.select_slider(key="compare_epoch").value == 3
    at.select_slider(key="compare_epoch").set_value(1).run()
    assert not at.exception and not at.error
    # the group
    at = run_page(JOBS, model=str(bert4))
    at.selectbox(key="job_compare_group").set_value("sweep-1").run()
    at.button(key="job_go_compare_group").click().run()
    at.switch_page(PAGE).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.radio(key="compare_source").value == f"Held-out rows of job #{job.id}"
    at.button(key="compare_group_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert set(shown_summary(at)["model_b"]) == {job.label, second.label}


@pytest.mark.slow
def test_the_atlas_and_probe_second_model_fields_open_the_compare_page():
    at = run_page("pages/2_Layer_Atlas.py")
    assert at.button(key="atlas_to_compare").disabled  # nothing to compare with yet
    at.radio(key="atlas_source").set_value("Demo word-order set").run()
    at.text_input(key="atlas_compare").set_value("random").run()
    at.button(key="atlas_to_compare").click().run()
    assert not at.exception
    assert at.session_state["compare_model"] == "random" and at.session_state["compare_what"] == "pair"
    at.switch_page(PAGE).run()
    assert not at.exception and not at.error
    assert at.text_input(key="compare_model").value == "random"
    assert at.radio(key="compare_source").value == "Demo word-order set"
    at = run_page("pages/1_Reconstruction.py")
    at.text_input(key="probe_compare").set_value("random").run()
    at.button(key="probe_to_compare").click().run()
    at.switch_page(PAGE).run()
    assert not at.exception and at.text_input(key="compare_model").value == "random"


# --- issue 34 ------------------------------------------------------------------------------------------------------

def figures(at) -> list:
    """Every Plotly chart the page shows, as figures."""
    import plotly.io

    return [plotly.io.from_json(c.proto.spec, skip_invalid=True) for c in at.get("plotly_chart")]


def values(v) -> np.ndarray:
    """A trace's array as numpy, whether Plotly wrote it as a list or as a typed array (``dtype`` + base64)."""
    import base64

    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
    return np.asarray(v)


def open_pair(monkeypatch, model: str | None = None):
    """The page on 40 of the demo sentiment set's rows (its sample of the row limit), A the sidebar's ``model``."""
    monkeypatch.setenv("LAYERLENS_ATLAS_MAX_ROWS", "40")
    at = run_page(PAGE, model=model)
    at.checkbox(key="compare_sample").check().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    return at


def compare_with(at, other: str):
    at.text_input(key="compare_model").set_value(other).run()
    at.button(key="compare_run").click().run()
    return at


def forty_rows():
    from analysis.core.inputs import parse

    return parse(DEMO_LABELLED.read_bytes(), DEMO_LABELLED.name, "text", None, label_column="label").sample(40, seed=0)


@pytest.mark.slow
def test_a_model_against_itself_on_the_page_gives_cka_1_no_movement_and_b_on_a(monkeypatch):
    at = compare_with(open_pair(monkeypatch), "demo")
    assert not at.exception and not at.error, [e.value for e in at.error]
    s = shown_summary(at)
    defined = s["cka"].notna()
    assert defined.sum() == len(s) - 1  # layer 0's [CLS]: undefined
    np.testing.assert_allclose(s.loc[defined, "cka"], 1, atol=1e-5)
    np.testing.assert_allclose(s.loc[defined, "mean_movement"], 0, atol=1e-6)
    assert not any("Read movement with CKA" in c.value for c in at.caption)  # CKA 1: nothing to warn of
    (shared,) = [f for f in figures(at) if "PC 1" in (f.layout.xaxis.title.text or "")]
    (ax, ay), (bx, by) = ((values(t.x), values(t.y)) for t in shared.data[:2])
    assert len(ax) == len(bx) == 40
    np.testing.assert_allclose(np.c_[ax, ay], np.c_[bx, by], atol=1e-6)


@pytest.mark.slow
def test_a_tokenizer_that_differs_only_in_normalisation_is_refused_on_the_page(monkeypatch, tmp_path):
    from transformers import AutoTokenizer

    from models.spec import DEMO_DIR
    from tests.unit.compare.test_compare_checks import cased_demo

    cased = cased_demo(tmp_path / "cased")
    rows = forty_rows()
    tok_a, tok_b = AutoTokenizer.from_pretrained(DEMO_DIR), AutoTokenizer.from_pretrained(cased)
    first = next(i for i, t in zip(rows.ids, rows.texts, strict=True)
                 if tok_a(t)["input_ids"] != tok_b(t)["input_ids"])
    at = compare_with(open_pair(monkeypatch), str(cased))
    assert not at.exception and len(at.error) == 1
    message = at.error[0].value
    assert f"row {first}" in message and "\n" not in message
    assert not at.dataframe  # nothing shown as if the two were comparable


@pytest.mark.slow
def test_another_depth_shows_each_models_layers_says_how_they_are_paired_and_offers_relative_depth(
        monkeypatch, tmp_path):
    from tests.unit.compare.test_compare_checks import deep_demo

    deep = deep_demo(tmp_path / "deep")
    deep_names = load_model(ModelSpec(str(deep), device="cpu")).anatomy.layer_names()
    at = compare_with(open_pair(monkeypatch), str(deep))
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.tabs[0].label.startswith("Every layer")  # the cross matrix is the first view when depths differ
    said = " ".join(c.value for c in at.caption)
    assert "paired by index" in said and "left out" in said and "5, 6, 7" in said
    (heat,) = [f for f in figures(at) if f.data and f.data[0].type == "heatmap"]
    assert list(heat.data[0].x) == deep_names and len(heat.data[0].y) == 5  # each model's own layer names
    assert shown_summary(at)["layer_b"].tolist() == [0, 1, 2, 3, 4]
    at.radio(key="compare_pairing").set_value("relative").run()
    at.button(key="compare_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert shown_summary(at)["layer_b"].tolist() == [0, 2, 4, 5, 7]
    said = " ".join(c.value for c in at.caption)
    assert "relative depth" in said and "1, 3, 6" in said


@pytest.mark.slow
def test_the_page_says_what_the_map_layer_0_and_few_rows_mean_and_draws_the_probes_baseline(monkeypatch):
    at = compare_with(open_pair(monkeypatch), "random")
    assert not at.exception and not at.error, [e.value for e in at.error]
    said = " ".join(c.value for c in [*at.caption, *at.warning, *at.info])
    assert "rotated onto A" in said  # the map is drawn as movement is measured
    assert "same vector for every text" in said  # why layer 0's cells are empty
    assert "40 rows" in said and "256" in said  # Procrustes with fewer rows than dimensions
    assert "Read movement with CKA" in said  # unrelated models barely 'move' ([CLS], uncentred): said next to it
    s = shown_summary(at)
    assert s.loc[s["layer"] == 0, ["cka", "mean_movement", "neighbours_mostly_changed"]].isna().all(axis=None)
    (probe,) = [f for f in figures(at) if "Linear-probe" in (f.layout.title.text or "")]
    labels = np.asarray(forty_rows().labels)
    majority = max(np.mean(labels == c) for c in set(labels))
    (baseline,) = [t for t in probe.data if t.name == "majority class"]
    np.testing.assert_allclose(values(baseline.y), majority)


@pytest.mark.slow
def test_a_sentence_encoder_defaults_to_its_own_pooling_and_a_headless_pair_skips_reconstruction(
        monkeypatch, tmp_path):
    from tests.unit.compare.test_compare_checks import headless_demo

    st_dir = headless_demo(tmp_path / "st", pooling="mean")
    at = open_pair(monkeypatch, str(st_dir))
    assert at.radio(key="compare_pool").value == "model"
    compare_with(at, "random")
    assert not at.exception and not at.error, [e.value for e in at.error]
    s = shown_summary(at)
    assert s["recon_accuracy_a"].isna().all() and s["recon_accuracy_b"].isna().all()
    said = " ".join(c.value for c in at.caption)
    assert "skipped" in said and "mean" in said


@pytest.mark.slow
def test_a_jobs_recorded_base_outside_the_model_roots_is_refused(home, bert4, tmp_path, monkeypatch):  # noqa: F811
    job = run_job(home, bert4, tmp_path)
    monkeypatch.setenv("LAYERLENS_MODEL_DIRS", str(tmp_path / "no-models"))
    at = run_page(PAGE)
    at.radio(key="compare_what").set_value("epochs").run()
    assert not at.exception and at.error and "not a model folder under" in at.error[0].value
    assert not at.dataframe
    at = run_page(PAGE)
    compare_with(at, f"job:{job.id}")
    assert not at.exception and at.error and "not a model folder under" in at.error[0].value
    assert not at.dataframe

