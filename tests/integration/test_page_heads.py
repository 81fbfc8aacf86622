"""AppTest of the attention-heads page: the statistics table is the engine's, the head view draws the model's
attention, a comparison with `random`, and bad input is one message."""

import base64
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from analysis.core.inputs import TextInputs
from analysis.core.treebank import read_conllu
from analysis.heads.model import load_eager
from analysis.heads.run import analyse
from analysis.heads.view import head_view
from models.loading import ModelSpec
from tests.support.data import FIXTURES
from tests.support.pages import run_page

PAGE = "pages/9_Attention_heads.py"
TEXTS = "the film is good .\ni liked the movie , and it was fun !\nnot very good"


def array(value) -> np.ndarray:
    """A Plotly JSON array: a list (of rows), or a typed array ``{"dtype", "bdata", "shape"}``."""
    if isinstance(value, dict):
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return flat.reshape([int(n) for n in str(value.get("shape", len(flat))).split(",")])
    return np.asarray([array(v) if isinstance(v, dict) else v for v in value], dtype=float)


def test_statistics_and_relations_are_the_engines(tiny_dirs, tmp_path, monkeypatch):
    shutil.copy(FIXTURES / "ud_tiny_train.conllu", tmp_path / "tiny.conllu")
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(tmp_path))
    model = str(tiny_dirs["bert"])
    at = run_page(PAGE, model=model)
    assert not at.exception and not at.error
    at.radio(key="heads_corpus").set_value(at.radio(key="heads_corpus").options[1]).run()
    at.selectbox(key="heads_treebank").set_value((tmp_path / "tiny.conllu").resolve()).run()
    at.button(key="heads_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    expected = analyse(load_eager(ModelSpec(model, device="cpu")), read_conllu(tmp_path / "tiny.conllu", 300))
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True), expected.heads)
    shown = at.dataframe[1].value.reset_index(drop=True)
    rows = expected.relations[expected.relations.direction == "dependent_to_head"].reset_index(drop=True)
    pd.testing.assert_frame_equal(shown, rows)
    charts = at.get("plotly_chart")
    assert len(charts) >= 5  # head view, layer view, statistic, head map, relations


def test_the_head_view_and_a_comparison_with_random(tiny_dirs):
    model = str(tiny_dirs["bert"])
    at = run_page(PAGE, model=model)
    at.text_input(key="heads_sentence").set_value("the film is fun .").run()
    at.select_slider(key="heads_layer").set_value(2).run()
    at.selectbox(key="heads_head").set_value(1).run()
    assert not at.exception and not at.error
    view = head_view(load_eager(ModelSpec(model, device="cpu")), "the film is fun .")
    z = json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]["z"]
    np.testing.assert_allclose(array(z), view.attention[1, 1], rtol=1e-6)
    at.text_input(key="heads_compare").set_value("random").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("with random weights" in s.value for s in at.subheader)
    at.text_input(key="heads_sentence").set_value("film " * 80).run()
    assert not at.exception and len(at.error) == 1 and "over the model's limit" in at.error[0].value


def test_texts_run_and_a_bad_corpus_is_one_message(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_area(key="heads_text").set_value(TEXTS).run()
    at.button(key="heads_run").click().run()
    assert not at.exception and not at.error
    expected = analyse(load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu")),
                       TextInputs(tuple(TEXTS.split("\n"))))
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True), expected.heads)
    at.text_area(key="heads_text").set_value("   ").run()
    assert not at.exception and len(at.error) == 1 and "no text given" in at.error[0].value


@pytest.mark.slow
def test_the_structure_page_opens_the_heads_on_its_treebank(tiny_dirs, tmp_path, monkeypatch):
    shutil.copy(FIXTURES / "ud_tiny_test.conllu", tmp_path / "en_ewt-ud-test.conllu")
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(tmp_path))
    at = run_page("pages/6_Linguistic_structure.py", model=str(tiny_dirs["bert"]))
    at.selectbox(key="structure_test").set_value((tmp_path / "en_ewt-ud-test.conllu").resolve()).run()
    at.button(key="structure_to_heads").click().run()
    assert not at.exception and at.title[0].value == "Attention heads"
    assert at.radio(key="heads_corpus").value.startswith("A treebank")
    assert at.selectbox(key="heads_treebank").value == (tmp_path / "en_ewt-ud-test.conllu").resolve()


@pytest.mark.slow
def test_a_fine_tuning_jobs_classifier_on_its_held_out_rows(bert4, tmp_path, monkeypatch):  # noqa: F811
    """The third tab: a finished job's classifier, scored on its held-out rows; the importance shown is the
    engine's (classifier_importance on load_checkpoint's classifier), its base accuracy the job's own predictions'."""
    from analysis.heads.importance import classifier_importance
    from analysis.training.finetune import held_out_rows, load_checkpoint
    from analysis.training.options import resolve
    from jobs.store import JobStore
    from tests.unit.compare.test_compare_jobs import run_job

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    job = run_job(JobStore(tmp_path / "home" / "jobs"), bert4, tmp_path)
    at = run_page("pages/5_Fine_Tune_Jobs.py", model=str(bert4))  # the jobs page's button opens the tab on the job
    at.selectbox(key="job_compare_one").set_value(job.id).run()
    at.button(key="job_go_heads").click().run()
    assert not at.exception and at.session_state["heads_job"] == job.id
    at.switch_page(PAGE).run()  # AppTest reruns the page it was sent to
    assert not at.exception
    assert at.selectbox(key="heads_job").value == job.id
    at.button(key="heads_job_run").click().run()
    assert not at.exception and not at.error
    model, tokenizer, meta = load_checkpoint(job.artifacts / "checkpoint", "cpu")
    rows, _ = held_out_rows(resolve(job.config), job.artifacts)
    expected = classifier_importance(model, tokenizer, meta["labels"], rows, encoder=model.encoder,
                                     max_length=int(meta["max_length"]), truncation=meta["truncation"])
    saved = pd.read_csv(job.artifacts / "predictions.csv", keep_default_na=False)
    assert expected.info["base_accuracy"] == (saved["prediction"] == saved["label"]).mean()
    caption = " ".join(c.value for c in at.caption)
    assert f"Classification accuracy {expected.info['base_accuracy']:.3f} with every head" in caption
    shown = json.loads(at.get("plotly_chart")[-2].proto.spec)["data"][0]
    np.testing.assert_allclose(np.nan_to_num(array(shown["z"])).sum(),
                               expected.importance["normalized"].sum(), rtol=1e-6)


@pytest.mark.slow
def test_a_model_against_itself_and_against_one_of_another_depth(tiny_dirs):
    """Against itself: a second model named '(again)' and a difference map of zeros on a -1..1 scale; against a
    model of another depth: no difference map, and a caption saying why (the heads cannot be paired)."""
    model = str(tiny_dirs["bert"])
    at = run_page(PAGE, model=model)
    at.text_area(key="heads_text").set_value(TEXTS).run()
    at.text_input(key="heads_compare").set_value(model).run()
    at.button(key="heads_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    options = at.radio(key="heads_shown").options
    assert options == ["bert", "bert (again)", "difference"]  # short names, never the server's path
    at.radio(key="heads_shown").set_value("difference").run()
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if " − " in json.loads(c.proto.spec)["layout"]["title"]["text"])
    assert (array(spec["data"][0]["z"]) == 0).all()
    assert any("Identical on every head" in c.value for c in at.caption)  # said, not only a white map
    assert (spec["data"][0]["zmin"], spec["data"][0]["zmax"]) == (-1.0, 1.0)
    at.text_input(key="heads_compare").set_value("demo").run()  # 4 layers x 4 heads: not the tiny model's shape
    at.button(key="heads_run").click().run()
    assert not at.exception  # the head view's tab refuses the pair in one message (another tokenizer, too)
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "tokenise the sentence differently" in errors[0], errors
    assert "difference" not in at.radio(key="heads_shown").options
    assert any("cannot be paired one to one" in c.value for c in at.caption)


def test_a_heads_job_is_submitted_from_the_page_and_opened_when_finished(tiny_dirs, tmp_path, monkeypatch):
    """Issue 43 item 3: the page's job form queues a heads parse job on a treebank under the data roots; the job,
    run as the worker runs it, is then opened on the page under 'A finished job' and shows the job's own tables
    (relations.csv, read back from its files)."""
    from jobs import run as job_run
    from jobs.store import JobStore

    shutil.copy(FIXTURES / "ud_tiny_train.conllu", tmp_path / "tiny.conllu")
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(tmp_path))
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    model = str(tiny_dirs["bert"])
    at = run_page(PAGE, model=model)
    at.radio(key="heads_job_action").set_value("parse").run()
    at.selectbox(key="heads_job_file_parse").set_value((tmp_path / "tiny.conllu").resolve()).run()
    at.number_input(key="heads_job_parse_min_count").set_value(2).run()
    at.button(key="heads_job_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    store = JobStore(tmp_path / "home" / "jobs")
    (job,) = store.list()
    assert job.config["kind"] == "heads" and job.config["action"] == "parse" and job.config["min_count"] == 2
    assert job.config["treebank"] == str((tmp_path / "tiny.conllu").resolve())
    store.claim(job.device, 1)
    job.artifacts.mkdir(parents=True, exist_ok=True)
    metrics = job_run.run_job(store, store.get(job.id), job.artifacts)
    store.finish(job.id, "succeeded", metrics=metrics)
    at = run_page(PAGE, model=model)
    at.radio(key="heads_corpus").set_value("A finished job").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    relations = pd.read_csv(store.get(job.id).artifacts / "relations.csv", keep_default_na=False, na_values=[""])
    shown = at.dataframe[0].value.reset_index(drop=True)
    rows = relations[relations.direction == "dependent_to_head"].reset_index(drop=True)
    assert len(rows) and list(shown["relation"]) == list(rows["relation"])
    assert any("held-out UUAS" in c.value for c in at.caption)


def test_the_server_reads_at_most_its_cap_and_offers_a_job(tiny_dirs, monkeypatch):
    """Issue 43 items 4 and 13: with LAYERLENS_MAX_SERVER_TEXTS=2 the page reads the first 2 texts and says so;
    head importance shows its passes and time before the click, and over the cap offers a job instead of a
    button."""
    monkeypatch.setenv("LAYERLENS_MAX_SERVER_TEXTS", "2")
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_area(key="heads_text").set_value(TEXTS).run()
    assert any("at most 2" in w.value for w in at.warning)
    at.button(key="heads_run").click().run()
    assert not at.exception and not at.error
    assert any("2 sentences" in c.value for c in at.caption)
    estimate = next(c.value for c in at.caption if "passes over" in c.value)
    assert "min at the rate of the pass above" in estimate
    assert any("run it as a job" in i.value for i in at.info)  # 2 texts x ~40 passes > 2 x 10
    assert not [b for b in at.button if b.key == "heads_importance_run"]
    monkeypatch.setenv("LAYERLENS_MAX_SERVER_TEXTS", "100")
    at.button(key="heads_run").click().run()  # all three texts now: read again
    assert not at.exception and [b for b in at.button if b.key == "heads_importance_run"]


def test_a_parse_job_with_no_relation_over_the_minimum_count_says_so_instead_of_an_empty_chart(tiny_dirs, tmp_path,
                                                                                               monkeypatch):
    """A new user's walk found an empty chart and an empty table when every relation was under the minimum count:
    the page says why nothing is scored and what to change."""
    from jobs import run as job_run
    from jobs.store import JobStore
    from jobs.submit import submit

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    store = JobStore(tmp_path / "home" / "jobs")
    model = str(tiny_dirs["bert"])
    job_id = submit({"kind": "heads", "action": "parse", "model": model, "device": "cpu",
                     "treebank": str(FIXTURES / "ud_tiny_train.conllu"), "min_count": 1000}, store, start_worker=False)
    store.claim("cpu", 1)
    out = store.get(job_id).artifacts
    out.mkdir(parents=True, exist_ok=True)
    store.finish(job_id, "succeeded", metrics=job_run.run_job(store, store.get(job_id), out))
    at = run_page(PAGE, model=model)
    at.radio(key="heads_corpus").set_value("A finished job").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("No relation has 1000 words" in i.value and "Minimum count" in i.value for i in at.info)
