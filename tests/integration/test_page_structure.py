"""AppTest of the linguistic-structure page: the tables it shows are the engine's; bad input is a message."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis.core.treebank import read_conllu
from analysis.structure.options import StructureOptions
from analysis.structure.run import run_structure
from models.loading import ModelSpec, load_model
from tests.support.data import FIXTURES
from tests.support.pages import run_page

PAGE = "pages/6_Linguistic_structure.py"


def roots(tmp_path, monkeypatch):
    shutil.copy(FIXTURES / "ud_tiny_train.conllu", tmp_path / "en_ewt-ud-dev.conllu")
    shutil.copy(FIXTURES / "ud_tiny_test.conllu", tmp_path / "en_ewt-ud-test.conllu")
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(tmp_path))


def open_page(tiny_dirs, tmp_path):
    """The page on the tiny BERT with the copies :func:`roots` made chosen (the page's default is the bundled
    sample, a data root whatever LAYERLENS_DATA_DIRS adds)."""
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.selectbox(key="structure_train").set_value((tmp_path / "en_ewt-ud-dev.conllu").resolve())
    at.selectbox(key="structure_test").set_value((tmp_path / "en_ewt-ud-test.conllu").resolve()).run()
    return at


@pytest.mark.slow
def test_structure_page_shows_the_engine_numbers(tiny_dirs, tmp_path, monkeypatch):
    roots(tmp_path, monkeypatch)
    at = open_page(tiny_dirs, tmp_path)
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
    at = open_page(tiny_dirs, tmp_path)
    at.text_input(key="structure_layers").set_value("9").run()
    assert not at.exception and "does not exist" in at.error[0].value


SAMPLE = Path(__file__).resolve().parents[2] / "analysis" / "data" / "ud_english_ewt_sample"


def test_the_bundled_sample_parses_is_small_and_carries_its_licence():
    train, test = (read_conllu(SAMPLE / name) for name in ("en_ewt-ud-dev-first300.conllu.gz",
                                                           "en_ewt-ud-test-first150.conllu.gz"))
    assert (len(train.sentences), train.n_words) == (300, 5708) and (len(test.sentences), test.n_words) == (150, 3032)
    assert sum(p.stat().st_size for p in SAMPLE.iterdir()) < 300_000
    readme = (SAMPLE / "README.md").read_text()
    assert "CC BY-SA 4.0" in readme and "Silveira" in readme and "first 300 sentences" in readme
    assert (SAMPLE / "LICENSE").read_text().startswith("Attribution-ShareAlike 4.0 International")
    assert not list(SAMPLE.glob("*.txt"))  # a .txt under the data roots would be offered as texts elsewhere


def test_the_page_defaults_to_the_bundled_sample_and_runs_on_it(tiny_dirs, monkeypatch):
    monkeypatch.delenv("LAYERLENS_DATA_DIRS", raising=False)  # a fresh clone: the bundled data only
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    assert not at.exception and not at.error
    assert Path(at.selectbox(key="structure_train").value).name == "en_ewt-ud-dev-first300.conllu.gz"
    assert Path(at.selectbox(key="structure_test").value).name == "en_ewt-ud-test-first150.conllu.gz"
    assert any("small sample" in c.value and "noisy" in c.value for c in at.caption)
    at.multiselect(key="structure_tasks").set_value(["upos"]).run()
    at.text_input(key="structure_layers").set_value("0").run()
    at.checkbox(key="structure_mdl").uncheck().run()
    at.button(key="structure_run").click().run()
    assert not at.exception and not at.error
    assert at.dataframe[0].value.task.tolist() == ["upos"]


@pytest.mark.slow
def test_the_page_submits_a_structure_job_and_opens_its_results(tiny_dirs, tmp_path, monkeypatch):
    from analysis.structure.output import run_info, write_outputs
    from jobs.store import JobStore

    roots(tmp_path, monkeypatch)
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    at = open_page(tiny_dirs, tmp_path)
    at.multiselect(key="structure_tasks").set_value(["upos", "distance"]).run()
    at.text_input(key="structure_layers").set_value("0,3").run()
    at.button(key="structure_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("queued" in s.value for s in at.success)
    store = JobStore()
    job = store.list()[0]
    assert job.config["kind"] == "structure" and job.config["tasks"] == "upos,distance"
    assert job.config["train"] == str((tmp_path / "en_ewt-ud-dev.conllu").resolve())
    assert job.name.startswith("linguistic structure · bert · upos, distance")
    # the job's process, in short: the run and its files in the artifacts, success recorded
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    expected = run_structure(loaded, read_conllu(tmp_path / "en_ewt-ud-dev.conllu"),
                             read_conllu(tmp_path / "en_ewt-ud-test.conllu"),
                             StructureOptions(tasks="upos,distance", layers="0,3"))
    job.artifacts.mkdir(parents=True)
    write_outputs(expected, job.artifacts, run_info(expected, loaded))
    store.finish(job.id, "succeeded", metrics={"kind": "structure"})
    at.radio(key="structure_mode").set_value("Open a finished job").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.selectbox(key="structure_job").value == job.id
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True), expected.summary)
    assert any(f"Job #{job.id}" in c.value for c in at.caption)
    assert len(at.get("plotly_chart")) == 2


def test_a_job_whose_artifacts_are_gone_is_a_message(tiny_dirs, tmp_path, monkeypatch):
    from jobs.store import JobStore

    roots(tmp_path, monkeypatch)
    store = JobStore()
    job_id = store.submit({"kind": "structure", "model": "demo", "tasks": "upos"}, "cpu", "linguistic structure")
    store.finish(job_id, "succeeded", metrics={"kind": "structure"})
    failed = store.submit({"kind": "structure", "model": "demo", "tasks": "upos"}, "cpu", "linguistic structure")
    store.finish(failed, "failed", "exit status 1; the log ends:\nerror: out of memory")
    at = open_page(tiny_dirs, tmp_path)
    at.radio(key="structure_mode").set_value("Open a finished job").run()
    assert not at.exception and "missing" in at.error[0].value
    assert any(f"#{failed}" in c.value and "failed" in c.value and "out of memory" in c.value for c in at.caption)


@pytest.mark.slow  # two runs of the engine besides the page's two
def test_the_random_weights_twin_is_drawn_from_its_own_run(tiny_dirs, tmp_path, monkeypatch):
    """The grey line is the engine's run on random:<model> (same options, same words), not the model's own."""
    import base64
    import json

    import numpy as np

    roots(tmp_path, monkeypatch)
    at = open_page(tiny_dirs, tmp_path)
    at.multiselect(key="structure_tasks").set_value(["upos", "distance"]).run()
    at.text_input(key="structure_layers").set_value("0,3").run()
    at.checkbox(key="structure_mdl").uncheck().run()
    at.checkbox(key="structure_random").check().run()
    at.button(key="structure_run").click().run()
    assert not at.exception and not at.error
    options = StructureOptions(tasks="upos,distance", layers="0,3", mdl=False)
    banks = [read_conllu(tmp_path / f"en_ewt-ud-{s}.conllu") for s in ("dev", "test")]
    twin = run_structure(load_model(ModelSpec(f"random:{tiny_dirs['bert']}", device="cpu")), *banks, options)
    own = run_structure(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")), *banks, options)
    def values(y):  # a Plotly JSON array: a list, or a typed array ({"dtype": "f8", "bdata": base64})
        return np.frombuffer(base64.b64decode(y["bdata"]), y["dtype"]).tolist() if isinstance(y, dict) else y

    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    grey = [values(t["y"]) for t in fig["data"] if t.get("name") == "random weights"]

    def curve(run, task, metric):
        rows = run.probes[(run.probes.task == task) & (run.probes.metric == metric)].sort_values("layer")
        return rows.value.tolist()

    assert grey == [curve(twin, "upos", "accuracy"), curve(twin, "distance", "uuas")]
    assert grey != [curve(own, "upos", "accuracy"), curve(own, "distance", "uuas")]
    assert any("random weights (seed 0)" in c.value for c in at.caption)
    # the twin's box is part of the request: changing it waits for the button, as every other option does (ticked
    # after a run without it, it ran ~30 s on its own before)
    at.session_state["structure_random"] = False
    at.run()
    assert any("then probe" in c.value for c in at.caption) and not at.exception
    at.button(key="structure_run").click().run()
    assert not any("then probe" in c.value for c in at.caption) and not at.exception
    at.button(key="structure_run").set_value(False)
    at.session_state["structure_random"] = True
    at.run()
    assert any("then probe" in c.value for c in at.caption) and not at.exception


@pytest.mark.slow  # the engine's run besides the page's
def test_a_labelled_set_adds_the_label_task_as_the_engine_computes_it(tiny_dirs, tmp_path, monkeypatch):
    from analysis.core.inputs import parse
    from ui.inputs import DEMO_WORDORDER

    roots(tmp_path, monkeypatch)
    at = open_page(tiny_dirs, tmp_path)
    at.multiselect(key="structure_tasks").set_value(["upos"]).run()
    at.text_input(key="structure_layers").set_value("0,3").run()
    at.checkbox(key="structure_mdl").uncheck().run()
    at.checkbox(key="structure_with_label").check().run()
    at.radio(key="structure_label_source").set_value("Demo word-order set").run()
    at.button(key="structure_run").click().run()
    assert not at.exception and not at.error
    labelled = parse(DEMO_WORDORDER.read_bytes(), DEMO_WORDORDER.name, "text", None, label_column="label")
    expected = run_structure(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")),
                             read_conllu(tmp_path / "en_ewt-ud-dev.conllu"),
                             read_conllu(tmp_path / "en_ewt-ud-test.conllu"),
                             StructureOptions(tasks="upos", layers="0,3", mdl=False), labelled=labelled)
    summary = at.dataframe[0].value.reset_index(drop=True)
    assert summary.task.tolist() == ["upos", "label"]
    pd.testing.assert_frame_equal(summary, expected.summary)


def test_every_page_has_its_own_icon():
    """Model anatomy and Linguistic structure shared one (issue 34, Low)."""
    from ui.sidebar import ANALYSES, HOME

    icons = [p.icon for p in [HOME, *ANALYSES]]
    assert len(icons) == len(set(icons)), icons


def test_submit_as_a_job_passes_the_labelled_set(tiny_dirs, tmp_path, monkeypatch):
    """The page's labelled set goes with the job (it was silently dropped): saved under the uploads folder, read
    back by the job's reader as the very rows the page probes."""
    from analysis.core.inputs import parse, read_file
    from jobs.store import JobStore
    from ui.inputs import DEMO_WORDORDER

    roots(tmp_path, monkeypatch)
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    at = open_page(tiny_dirs, tmp_path)
    at.multiselect(key="structure_tasks").set_value(["upos"]).run()
    at.checkbox(key="structure_with_label").check().run()
    at.radio(key="structure_label_source").set_value("Demo word-order set").run()
    at.radio(key="structure_label_pool").set_value("mean").run()
    assert any("goes with the job" in c.value for c in at.caption)
    at.button(key="structure_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    config = JobStore().list()[0].config
    assert config["label_pooling"] == "mean" and config["pair_column"] is None
    sent = read_file(config["label_data"], config["text_column"], config["pair_column"],
                     label_column=config["label_column"])
    shown = parse(DEMO_WORDORDER.read_bytes(), DEMO_WORDORDER.name, "text", None, label_column="label")
    assert sent.content_hash() == shown.content_hash() and len(sent) == len(shown)


@pytest.mark.slow
def test_the_summary_says_what_its_intervals_cover_and_seeds_widen_them(tiny_dirs, tmp_path, monkeypatch):
    roots(tmp_path, monkeypatch)
    at = open_page(tiny_dirs, tmp_path)
    at.multiselect(key="structure_tasks").set_value(["distance"]).run()
    at.text_input(key="structure_layers").set_value("0,3").run()
    at.number_input(key="structure_seeds").set_value(2).run()
    at.button(key="structure_run").click().run()
    assert not at.exception and not at.error
    summary = next(d.value for d in at.dataframe if "best_layer" in d.value)
    assert summary.seeds.tolist() == [2] and "center_of_gravity_undefined" in summary
    assert any("What the intervals cover" in c.value and "pooled over 2 training seeds" in c.value
               for c in at.caption)
