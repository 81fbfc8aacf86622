"""AppTests of the fine-tuning jobs page and the layer-weights page, with the runner faked (no worker)."""

import json

import pandas as pd
import pytest

from analysis.training.finetune import Splits
from tests.support.data import synthetic
from tests.support.jobs import finished_job
from tests.support.pages import run_page
from ui.sidebar import KEY_MODEL

JOBS, WEIGHTS = "pages/5_Fine_Tune_Jobs.py", "pages/3_Layer_Weights.py"


def test_submit_from_the_page_queues_a_job(home, tiny_dirs):
    at = run_page(JOBS, model=str(tiny_dirs["bert"]))
    assert not at.exception and not at.error
    at.selectbox(key="job_head").set_value("cls").run()
    at.button(key="job_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "queued" in at.success[0].value
    jobs = home.list()
    assert len(jobs) == 1 and jobs[0].status == "queued" and jobs[0].config["head"] == "cls"
    assert jobs[0].config["train"] == "demo"
    assert at.dataframe[0].value["status"].tolist() == ["queued"]


def test_the_form_says_where_its_defaults_come_from(home):
    at = run_page(JOBS)  # the demo model: hidden size 256
    assert at.session_state["job_lr"] == 1e-4
    assert any("lr from the default for models of hidden size < 512" in c.value for c in at.caption)
    at.selectbox(key="job_preset").set_value("grubert").run()
    assert at.session_state["job_lr"] == 1e-5 and at.session_state["job_head"] == "gru-share-3"
    assert any("from the preset grubert" in c.value for c in at.caption)


def test_bad_options_are_a_message_and_nothing_is_queued(home, tiny_dirs):
    at = run_page(JOBS, model=str(tiny_dirs["bert"]))
    at.radio(key="job_source").set_value("Hugging Face dataset").run()
    for hostile in ("hf:/etc:train", "hf:..:train", "hf:analysis:train"):  # paths and local folders, not names
        at.text_input(key="job_path").set_value(hostile).run()
        assert not at.exception and "is not a Hugging Face dataset name" in at.error[0].value
        assert at.button(key="job_submit").disabled
    assert home.list() == []


def test_server_files_are_picked_from_the_data_roots_only(home, tiny_dirs, tmp_path, monkeypatch):
    """Issue 20.3: the page offers the files under LAYERLENS_DATA_DIRS in a select box (no free path); a symlink
    leading out of the roots is not offered."""
    root = tmp_path / "data"
    root.mkdir()
    (root / "train.csv").write_text("text,label\n" + "".join(f"good film {i},pos\nbad film {i},neg\n"
                                                               for i in range(5)))
    (root / "escape.txt").symlink_to("/etc/hostname")
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(root))
    at = run_page(JOBS, model=str(tiny_dirs["bert"]))
    at.radio(key="job_source").set_value("A file on the server").run()
    assert not at.exception
    box = at.selectbox(key="job_server_file")
    # the bundled demo sets too (always a data root), labelled tables only (a job needs a label column)
    assert [str(o) for o in box.options] == ["bundled/demo_sentiment.csv", "bundled/demo_wordorder.csv",
                                             "data/train.csv"]
    box.set_value((root / "train.csv").resolve()).run()
    at.selectbox(key="job_head").set_value("cls").run()
    at.button(key="job_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert home.list()[0].config["train"] == str(root / "train.csv")


@pytest.mark.slow
def test_finished_runs_are_compared_and_voted(home, bert4):  # noqa: F811
    first, second = finished_job(home, bert4, "attention"), finished_job(home, bert4, "cls")
    at = run_page(JOBS, model=str(bert4))
    assert not at.exception
    compare = at.dataframe[1].value
    assert compare["job"].tolist() == [second, first]
    expected = json.loads((home.directory(first) / "artifacts" / "metrics.json").read_text())["accuracy"]
    assert float(compare.set_index("job").loc[first, "accuracy"]) == pytest.approx(expected, abs=5e-4)  # 3 places
    assert {"model", "data", "head", "lr", "epochs", "layer decay", "majority class", "macro_f1"} <= set(compare)
    baseline = json.loads((home.directory(first) / "artifacts" / "metrics.json").read_text())["baseline"]
    assert float(compare.set_index("job").loc[first, "majority class"]) == pytest.approx(baseline["accuracy"], abs=5e-4)
    at.multiselect(key="job_ensemble").set_value([first, second]).run()
    assert not at.exception and any("**Ensemble**" in m.value and "majority class" in m.value for m in at.markdown)


@pytest.mark.slow
def test_the_ensemble_baseline_is_the_runs_own_training_majority(home, bert4):  # noqa: F811
    """One definition of the baseline on every view: the majority class of the training rows, scored on the
    evaluated rows. Here training is mostly 'pos' and validation mostly 'neg', so the two definitions differ."""
    import dataclasses

    def cut(data, keep):
        return dataclasses.replace(data, texts=tuple(data.texts[i] for i in keep),
                                   labels=tuple(data.labels[i] for i in keep))

    train, val = synthetic(30), synthetic(16, seed=1)
    train = cut(train, [i for i in range(30) if train.labels[i] == "pos" or i < 8])  # 15 pos, 4 neg
    val = cut(val, [i for i in range(16) if val.labels[i] == "neg" or i < 4])  # 2 pos, 8 neg
    jobs = [finished_job(home, bert4, head, Splits(train, val)) for head in ("attention", "cls")]
    baselines = [json.loads((home.directory(j) / "artifacts" / "metrics.json").read_text())["baseline"]
                 for j in jobs]
    assert [b["class"] for b in baselines] == ["pos", "pos"] and baselines[0]["accuracy"] == pytest.approx(0.2)
    at = run_page(JOBS, model=str(bert4))
    at.multiselect(key="job_ensemble").set_value(jobs).run()
    line = next(m.value for m in at.markdown if "**Ensemble**" in m.value)
    assert "majority class 0.200" in line and "training rows" in line, line


def test_cancel_a_queued_job_from_the_page(home, tiny_dirs):
    job_id = home.submit({"model": str(tiny_dirs["bert"]), "train": "demo"}, "cpu", "waiting")
    at = run_page(JOBS, model=str(tiny_dirs["bert"]))
    at.button(key=f"cancel_{job_id}").click().run()
    assert not at.exception and home.get(job_id).status == "cancelled"


def test_layer_weights_page_shows_the_saved_weights(home, bert4):  # noqa: F811
    job_id = finished_job(home, bert4, "attention")
    at = run_page(WEIGHTS, model=str(bert4))
    assert not at.exception and not at.error
    charts = at.get("plotly_chart")
    assert len(charts) == 5  # heat map, by class, by epoch, atlas after epoch 1 and after epoch 2
    art = home.directory(job_id) / "artifacts"
    heat = json.loads(charts[0].proto.spec)["data"][0]
    weights = pd.read_csv(art / "layer_weights.csv")
    shape = heat["z"]["shape"] if isinstance(heat["z"], dict) else f"{len(heat['z'])}, {len(heat['z'][0])}"
    assert shape == f"{len(weights)}, 4"  # examples x layers 1..4 of a 4-layer model
    sidebar_before = at.session_state[KEY_MODEL]
    at.button(key="lw_go_probe_compare").click().run()  # to the probe, the fine-tuned model as the comparison
    assert not at.exception
    assert at.text_input(key="probe_compare").value == f"job:{job_id}"
    assert at.session_state[KEY_MODEL] == sidebar_before  # the sidebar's model is not switched


def test_layer_weights_page_without_jobs_says_what_to_do(home, tiny_dirs):
    at = run_page(WEIGHTS, model=str(tiny_dirs["bert"]))
    assert not at.exception and "No finished job yet" in at.info[0].value


def test_a_head_without_weights_is_explained(home, bert4):  # noqa: F811
    finished_job(home, bert4, "cls")
    at = run_page(WEIGHTS, model=str(bert4))
    assert not at.exception and "learns no layer weights" in at.info[0].value


def test_a_one_class_run_shows_its_baseline_and_confusion_matrix(home, bert4, monkeypatch):  # noqa: F811
    job_id = finished_job(home, bert4, "cls")
    metrics = home.get(job_id).metrics
    metrics.update(one_class=True, accuracy=metrics["baseline"]["accuracy"])
    home.finish(job_id, "succeeded", metrics=metrics)
    at = run_page(JOBS, model=str(bert4))
    assert not at.exception
    table = at.dataframe[0].value
    assert table.set_index("id").loc[job_id, "one class"] and "majority class" in table
    assert any("not a sign that the model learned" in w.value for w in at.warning)
    assert any("Confusion matrix" in json.loads(c.proto.spec)["layout"]["title"]["text"]
               for c in at.get("plotly_chart"))


def test_weights_that_learned_nothing_are_called_so(home, bert4):  # noqa: F811
    job_id = finished_job(home, bert4, "attention")
    path = home.directory(job_id) / "artifacts" / "layer_weights.csv"
    weights = pd.read_csv(path)
    weights.iloc[:, 1:] = 0.25 + 1e-4 * (weights.iloc[:, 1:] > weights.iloc[:, 1:].mean())  # ~uniform over 4
    weights.to_csv(path, index=False)
    at = run_page(WEIGHTS, model=str(bert4))
    assert not at.exception and any("within 1% of the uniform" in i.value for i in at.info)


@pytest.mark.slow
def test_the_atlas_comparison_uses_the_jobs_held_out_rows(home, bert4, tmp_path):  # noqa: F811
    from analysis.training.options import resolve
    from tests.unit.training.test_training import write_tsv

    train, val = write_tsv(tmp_path / "train.tsv", synthetic(24)), write_tsv(tmp_path / "val.tsv", synthetic(12, 1))
    options = resolve({"model": str(bert4), "train": str(train), "val": str(val), "head": "attention", "epochs": 1,
                       "batch_size": 8})
    job_id = home.submit(options.to_dict(), "cpu", "held-out")
    home.claim("cpu", 10)
    from analysis.training.finetune import run_options

    home.finish(job_id, "succeeded", metrics=run_options(options, home.directory(job_id) / "artifacts"))
    at = run_page(WEIGHTS, model=str(bert4))
    at.button(key="lw_go_atlas_compare").click().run()
    assert not at.exception and at.text_input(key="atlas_compare").value == f"job:{job_id}"
    assert at.radio(key="atlas_source").value == f"Held-out rows of job #{job_id}"
    assert any("the 12 validation rows of" in c.value for c in at.caption)
    at.switch_page("pages/2_Layer_Atlas.py").run()  # AppTest reruns the page it was sent to, not the app's
    at.button(key="atlas_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any(f"job #{job_id} (attention, {bert4})" in e.label for e in at.expander)


@pytest.mark.slow
def test_a_sweep_from_the_page_queues_its_jobs_in_one_group_and_compares_by_group(home, tiny_dirs, bert4):  # noqa: F811
    at = run_page(JOBS, model=str(tiny_dirs["bert"]))
    at.text_input(key="job_grid").set_value("heads=cls,attention lr=1e-4,3e-4").run()
    assert at.button(key="job_submit").label == "Submit 4 jobs"
    at.button(key="job_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    jobs = home.list()
    assert len(jobs) == 4 and len({j.group for j in jobs}) == 1 and "4 jobs queued in group" in at.success[0].value
    assert set(at.dataframe[0].value["group"]) == {jobs[0].group}
    assert set(at.dataframe[0].value["runs on"]) == {"this machine"}
    at.text_input(key="job_grid").set_value("nope=1").run()
    assert "unknown option 'nope'" in at.error[0].value and at.button(key="job_submit").disabled
    # the comparison can be narrowed to one sweep
    first, second = finished_job(home, bert4, "attention"), finished_job(home, bert4, "cls")
    with home._connect() as db:
        db.execute("UPDATE jobs SET grp='mine' WHERE id=?", (first,))
    at = run_page(JOBS, model=str(bert4))
    at.selectbox(key="job_compare_group").set_value("mine").run()
    assert not at.exception and at.dataframe[1].value["job"].tolist() == [first]
    assert second not in at.dataframe[1].value["job"].tolist()


def test_a_form_filled_by_another_page_keeps_the_users_first_change(home, tiny_dirs):
    """The duplication page hands its export to the jobs form; the user's first change (Head: attention) must
    stay, and the job must run with it."""
    at = run_page("pages/4_Layer_Duplication.py", model=str(tiny_dirs["bert"]))
    at.text_input(key="dup_target").set_value("deeper").run()
    at.button(key="dup_export").click().run()
    at.button(key="dup_finetune").click().run()
    assert not at.exception and at.text_input(key="job_model").value.endswith("deeper")
    at.switch_page(JOBS).run()  # AppTest's later runs stay on the page it was opened with; a browser's move on
    assert at.text_input(key="job_model").value.endswith("deeper")
    at.selectbox(key="job_head").set_value("attention").run()
    assert at.selectbox(key="job_head").value == "attention"
    at.number_input(key="job_epochs").set_value(2).run()
    assert at.selectbox(key="job_head").value == "attention" and at.number_input(key="job_epochs").value == 2
    at.button(key="job_submit").click().run()
    assert not at.exception
    (job,) = home.list()
    assert (job.config["head"], job.config["epochs"]) == ("attention", 2) and job.config["model"].endswith("deeper")


def test_the_jobs_table_leaves_missing_values_empty(home, tiny_dirs):
    """A queued job has no loss, accuracy or baseline yet: its cells are empty, never 'None' or 'nan'."""
    from ui.jobs import job_table, shown

    home.submit({"model": "demo", "train": "demo", "head": "cls"}, "cpu", "cls · demo · demo set · defaults")
    table = job_table(home.list())
    assert table["accuracy"].isna().all()
    frame = shown(table)
    assert not frame.isna().any().any() and (frame["accuracy"] == "").all()
    assert "cls · demo · demo set" in frame["name"].iloc[0]


def labelled_csv(path, label="secret-label"):
    """A small labelled file the browser must not reach (issue 25.1)."""
    path.write_text("text,label\n" + "".join(f"private text {i},{label}{i % 2}\n" for i in range(12)))
    return path


def test_a_sweep_cannot_reach_data_models_or_code_loading(home, tiny_dirs, tmp_path):
    """Issue 25.1: the Sweep field varies the training options only; a sweep naming the data, the model, the
    backend or pickle loading is refused with a message and nothing is queued."""
    private = labelled_csv(tmp_path / "private.csv")
    at = run_page(JOBS, model=str(tiny_dirs["bert"]))
    for hostile in (f"head=attention train={private} epochs=1", f"val={private}", f"tests={private}",
                    "text_column=label", f"model={tiny_dirs['albert']}", "allow_pickle=true", "backend=slurm",
                    "preset=sun2019"):
        at.text_input(key="job_grid").set_value(hostile).run()
        assert not at.exception
        assert at.error and "cannot be swept from the browser" in at.error[0].value, (hostile, at.error)
        assert at.button(key="job_submit").disabled  # a browser cannot click it (AppTest refuses too)
    assert home.list() == []
    assert any("training options" in (w.help or "") for w in [at.text_input(key="job_grid")])


@pytest.mark.slow
def test_values_the_run_would_refuse_are_refused_on_the_page(home):
    """Issue 25.10: a validation fraction that leaves a class without a row is refused at Submit; the seed
    field stops at the largest seed."""
    at = run_page(JOBS)
    assert at.number_input(key="job_seed").max == 2**32 - 1
    for fraction in (0.999, 0.001):
        at.number_input(key="job_val_fraction").set_value(fraction).run()
        at.button(key="job_submit").click().run()
        assert not at.exception and "Not queued: val_fraction (validation fraction)" in at.error[0].value
    assert home.list() == []


@pytest.mark.slow
def test_an_upload_that_fails_midway_leaves_nothing_offered(home, monkeypatch):
    """Issue 25.9a: a full disk while an upload is saved is a message; no partial file is left under the uploads
    folder, so none is offered as a server file to any session. A complete upload is offered."""
    import errno
    from pathlib import Path

    from analysis.core.dataroots import server_files, uploads

    data = b"text,label\n" + b"".join(b"good film %d,pos\nbad film %d,neg\n" % (i, i) for i in range(200))
    real = Path.write_bytes

    def disk_full(self, content):
        real(self, content[: len(content) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    at = run_page(JOBS)
    at.radio(key="job_source").set_value("Upload a file").run()
    with monkeypatch.context() as patch:
        patch.setattr(Path, "write_bytes", disk_full)
        at.file_uploader(key="job_upload").set_value(("films.csv", data, "text/csv")).run()
    assert not at.exception and "No space left on device" in at.error[0].value
    assert at.button(key="job_submit").disabled
    assert not [p for p in server_files() if p.is_relative_to(uploads().resolve())]
    assert not [p for p in uploads().iterdir() if p.suffix == ".csv"]
    at.run()  # the disk has room again
    assert not at.exception and not at.error
    (saved,) = [p for p in server_files() if p.is_relative_to(uploads().resolve())]
    assert saved.read_bytes() == data


def test_model_folders_typed_in_the_browser_stay_in_the_model_roots(home, tiny_dirs, monkeypatch):
    """Issue 25.14b: the sidebar's typed model, its MLM-head donor and the jobs page's Model field take hub ids
    and folders under LAYERLENS_MODEL_DIRS only; a folder outside and a missing one get the same message, and
    nothing outside is read or queued."""
    monkeypatch.setenv("LAYERLENS_MODEL_DIRS", str(tiny_dirs["bert"]))
    from ui.sidebar import KEY_HEAD_FROM

    outside, absent = str(tiny_dirs["albert"]), str(tiny_dirs["bert"].parent / "absent")
    shown = []
    for typed in (outside, absent):
        at = run_page("app.py", model=typed)
        assert not at.exception and at.sidebar.error
        shown.append(at.sidebar.error[0].value.replace(typed, "NAME"))
        assert not at.sidebar.success  # nothing loaded
    assert shown[0] == shown[1] and "model folders" in shown[0]
    at = run_page(JOBS, model=str(tiny_dirs["bert"]))  # inside the root: loads
    assert not at.exception and not at.error and at.sidebar.success
    at.text_input(key="job_model").set_value(outside).run()
    assert not at.exception and "model folders" in at.error[0].value
    assert at.button(key="job_submit").disabled
    assert home.list() == []
    at.text_input(key="job_model").set_value(str(tiny_dirs["bert"])).run()
    at.sidebar.text_input(key=KEY_HEAD_FROM).set_value(outside).run()
    assert not at.exception and any("model folders" in e.value for e in at.sidebar.error)


@pytest.mark.parametrize(("config", "page"), [
    ({"kind": "tokens index", "model": "demo", "input": "job:1"}, "pages/8_Token_atlas.py"),
    ({"kind": "heads", "action": "parse", "model": "demo", "treebank": "t.conllu"}, "pages/9_Attention_heads.py"),
    ({"kind": "structure", "model": "demo"}, "pages/6_Linguistic_structure.py"),
    ({"kind": "probe", "model": "demo", "input": "x.csv"}, None)])
def test_a_finished_job_says_where_it_opens(home, config, page):
    """A succeeded job of a kind some page opens links there with how (a 'tokens index' job's index lies beside its
    extraction: it said nothing); a task's job no page opens names its files and offers its report."""
    job_id = home.submit(config, "cpu", config["kind"])
    home.claim("cpu", 1)
    (home.directory(job_id) / "artifacts").mkdir(parents=True, exist_ok=True)
    (home.directory(job_id) / "artifacts" / "run.json").write_text("{}")
    home.finish(job_id, "succeeded", metrics={"kind": config["kind"], "files": ["layers.csv", "run.json"]})
    at = run_page(JOBS)
    assert not at.exception
    opens = [b for b in at.button if b.key == f"job_open_{job_id}"]
    if page is None:
        assert not opens
        assert any("layers.csv, run.json" in c.value and "artifacts" in c.value for c in at.caption)
        assert at.button(key=f"job_{job_id}_files_report") is not None
    else:
        title = page.split("/")[1].split("_", 1)[1].removesuffix(".py").replace("_", " ")
        assert len(opens) == 1 and opens[0].label.lower() == f"open it on the {title.lower()} page ↗"
        opens[0].click().run()  # the page opens on this job
        assert not at.exception
        if "structure" in page:
            assert at.session_state["structure_mode"] == "Open a finished job"
            assert at.session_state["structure_job"] == job_id
        if "heads" in page.lower():
            assert at.session_state["heads_corpus"] == "A finished job" and at.session_state["heads_open"] == job_id


def test_one_point_typed_in_the_sweep_box_is_one_job_without_a_group(home, tiny_dirs):
    """Issue 53 item 17: a single job from the Sweep box was filed under a "sweep" group of one."""
    at = run_page(JOBS, model=str(tiny_dirs["bert"]))
    at.text_input(key="job_grid").set_value("lr=3e-4").run()
    assert at.button(key="job_submit").label == "Submit the job"
    at.button(key="job_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (job,) = home.list()
    assert job.group is None and job.config["lr"] == 3e-4
