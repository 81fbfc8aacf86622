"""AppTests of the Compare checkpoints page: the tables it shows are the engine's; a bad B is a message; the jobs
page opens it on a job's epochs and on a sweep group."""

import pandas as pd

from analysis.compare.run import CompareConfig, compare
from analysis.inputs import read_file
from models.loading import ModelSpec, load_model
from tests.test_app import run_page
from tests.test_compare_jobs import home, run_job  # noqa: F401  (home is a fixture)
from tests.test_training import bert4  # noqa: F401  (a fixture)
from ui.inputs import DEMO_LABELLED

PAGE, JOBS = "pages/7_Compare_checkpoints.py", "pages/5_Fine_Tune_Jobs.py"


def shown_summary(at) -> pd.DataFrame:
    return at.dataframe[0].value.reset_index(drop=True)


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


def test_a_classifier_is_read_with_the_head_named_for_b_and_its_own_predictions_shown(tiny_dirs, tmp_path):
    from tests.test_compare import fine_tuned_classifier

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


def test_the_jobs_page_opens_a_jobs_epochs_and_a_group_on_the_compare_page(home, bert4, tmp_path):  # noqa: F811
    from analysis.compare.epochs import compare_epochs, job_run

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
