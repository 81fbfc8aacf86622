"""The ``structure`` job kind (issue 27, "Jobs"): bad input refused at submit with one message, a local job on the
tiny treebanks writes what the CLI writes for the same options, a cancelled job stops and is marked cancelled."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from cli.main import main
from jobs.store import JobStore
from jobs.submit import SubmitError, job_name, submit, validate
from jobs.worker import Worker
from tests.integration.test_jobs import drive
from tests.support.data import FIXTURES

TRAIN, TEST = FIXTURES / "ud_tiny_train.conllu", FIXTURES / "ud_tiny_test.conllu"
FAST = {"max_epochs": 2, "rank": 8, "tree_layers": "0,4"}  # the demo model: 4 layers, hidden 256


@pytest.fixture
def home(tmp_path, monkeypatch):
    """LAYERLENS_HOME (job store, word-vector cache, uploads) under tmp_path, and a data root holding copies of
    the tiny treebanks."""
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    data = tmp_path / "data"
    data.mkdir()
    for path in (TRAIN, TEST):
        (data / path.name).write_bytes(path.read_bytes())
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(data))
    return JobStore(tmp_path / "home" / "jobs"), data


def config(data: Path, **changes) -> dict:
    return {"kind": "structure", "model": "demo", "device": "cpu", "train": str(data / TRAIN.name),
            "test": str(data / TEST.name), **FAST, **changes}


@pytest.mark.parametrize("change, message", [
    ({"train": "missing.conllu"}, "train missing.conllu: no such file"),
    ({"tasks": "upos,pos"}, "unknown task(s) pos"),
    ({"layers": "9"}, "layer 9 does not exist"),
    ({"rank": 999}, "more than the model's hidden size 256"),
    ({"word_vector": "last"}, "word_vector"),
    ({"backend": "cloud"}, "backend"),
])
def test_bad_input_is_refused_with_one_message_and_nothing_is_queued(home, change, message):
    store, data = home
    with pytest.raises(SubmitError, match=message.replace("(", r"\(").replace(")", r"\)")) as refused:
        submit(config(data, **change), store, start_worker=False)
    assert "\n" not in str(refused.value) and "Traceback" not in str(refused.value)
    assert store.list() == []


def test_a_malformed_treebank_is_refused_at_submit_naming_its_line(home):
    store, data = home
    bad = data / "bad.conllu"
    bad.write_text(TEST.read_text().replace("2\tfilm\tfilm\tNOUN\t_\t_\t4", "2\tfilm\tfilm\tNOUN\t_\t_\tfour", 1))
    with pytest.raises(SubmitError, match=f"{bad}:4: HEAD 'four'"):
        submit(config(data, test=str(bad)), store, start_worker=False)


def test_the_browser_may_submit_only_treebanks_under_the_data_roots(home, tmp_path, monkeypatch):
    store, data = home
    monkeypatch.setenv("LAYERLENS_MODEL_DIRS", str(data))
    outside = tmp_path / "private.conllu"
    outside.write_bytes(TEST.read_bytes())
    for key in ("train", "test"):
        with pytest.raises(SubmitError, match="not under the dashboard's data folders"):
            submit(config(data, **{key: str(outside)}), store, start_worker=False, browser=True)
    with pytest.raises(SubmitError, match="not under the dashboard's data folders"):
        submit(config(data, train=str(data / ".." / "private.conllu")), store, start_worker=False, browser=True)
    with pytest.raises(SubmitError, match="pickle"):
        submit(config(data, allow_pickle=True), store, start_worker=False, browser=True)
    with pytest.raises(SubmitError, match="not a model folder"):
        submit(config(data, model=str(tmp_path)), store, start_worker=False, browser=True)
    assert store.list() == []
    # the CLI trusts its user: the same file outside the roots is queued
    options, device = validate(config(data, test=str(outside)))
    assert options["kind"] == "structure" and options["test"] == str(outside) and device == "cpu"
    job_id = submit(config(data), store, start_worker=False, browser=True)
    assert store.get(job_id).config["train"] == str((data / TRAIN.name).resolve())


def test_the_job_is_named_for_what_it_is(home):
    store, data = home
    name = job_name(validate(config(data, tasks="upos,distance"))[0])
    assert name == "linguistic structure · demo · upos, distance · ud_tiny_train.conllu → ud_tiny_test.conllu"
    job_id = submit(config(data), store, start_worker=False)
    assert store.get(job_id).label == f"job #{job_id} (linguistic structure, demo)"


def test_cli_jobs_submit_queues_a_structure_job(home, tmp_path, capsys, monkeypatch):
    store, data = home
    path = tmp_path / "structure.json"
    path.write_text(json.dumps(config(data)))
    assert main(["jobs", "submit", "--config", str(path), "--no-worker"]) == 0
    job_id = int(capsys.readouterr().out.strip().splitlines()[-1])
    assert store.get(job_id).config["kind"] == "structure"
    path.write_text(json.dumps(config(data, tasks="pos")))
    assert main(["jobs", "submit", "--config", str(path), "--no-worker"]) == 2
    assert "not queued" in capsys.readouterr().err


def test_a_sigterm_stops_the_run_at_its_next_progress_report(home, monkeypatch):
    """In process: Cancel's SIGTERM makes the next progress report raise, so the run ends there, writing
    nothing."""
    from jobs import run as job_run

    store, data = home
    job_id = submit(config(data), store, start_worker=False)
    job = store.get(job_id)
    reports = []
    real = job_run.Reporter.__call__

    def report(self, line, progress, force=False):
        reports.append(progress)
        if len(reports) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler the job installed records the request
        real(self, line, progress, force)

    monkeypatch.setattr(job_run.Reporter, "__call__", report)
    before = signal.getsignal(signal.SIGTERM)
    out = Path(store.directory(job_id)) / "out"
    out.mkdir()
    try:
        with pytest.raises(job_run.Cancelled):
            job_run.run_job(store, job, out)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert len(reports) == 1 and list(out.iterdir()) == []
    assert reports[0]["stage"] == "train word vectors" and 0 < reports[0]["fraction"] < 1


@pytest.mark.slow
def test_a_local_job_writes_what_the_cli_writes(home, tmp_path):
    store, data = home
    job_id = submit(config(data), store, start_worker=False)
    job = drive(Worker(store), store, job_id, timeout=300)
    assert job.status == "succeeded", job.error
    art = job.artifacts
    assert sorted(p.name for p in art.iterdir()) == ["mdl.csv", "probes.csv", "run.json", "summary.csv", "trees.jsonl"]
    out = tmp_path / "cli"
    assert main(["structure", "--model", "demo", "--device", "cpu", "--train", str(data / TRAIN.name), "--test",
                 str(data / TEST.name), "--out", str(out), "--max-epochs", "2", "--rank", "8",
                 "--tree-layers", "0,4"]) == 0
    for name in ("probes.csv", "mdl.csv", "summary.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(art / name), pd.read_csv(out / name), check_exact=True)
    assert (art / "trees.jsonl").read_text() == (out / "trees.jsonl").read_text()
    job_info, cli_info = (json.loads((d / "run.json").read_text()) for d in (art, out))
    for info in (job_info, cli_info):
        info.pop("cache_hit")  # the CLI's run read the word vectors the job cached
    assert job_info == cli_info
    assert job.progress["stage"] == "probes" and job.progress["fraction"] == 1.0
    summary = pd.read_csv(art / "summary.csv")
    assert [r["task"] for r in job.metrics["summary"]] == list(summary.task)
    assert job.metrics["kind"] == "structure" and job.metrics["test_sentences_scored"] == 18
    log = job.log_path.read_text()
    assert "model: demo (4 layers) on cpu" in log and "upos: best layer" in log
    assert "summary intervals: 95% percentile bootstrap over the test sentences" in log and "one seed" in log
    assert re.search(r"train word vectors: (\d+) of \1 sentences", log)
    assert re.search(r"probes: (\d+) of \1 steps \(fits, MDL blocks, structural epochs\)", log)
    assert "Traceback" not in log


@pytest.mark.slow
def test_a_cancelled_job_stops_and_is_marked_cancelled(home):
    """A real job process: Cancel while it extracts word vectors (one sentence a batch, so it is still at it);
    it stops at its next report, leaves no artifacts, and is listed cancelled."""
    store, _ = home
    sample = Path(__file__).resolve().parents[2] / "analysis" / "data" / "ud_english_ewt_sample"
    data = Path(os.environ["LAYERLENS_DATA_DIRS"])
    for path in sample.glob("*.conllu.gz"):
        (data / path.name).write_bytes(path.read_bytes())
    job_id = submit(config(data, train=str(data / "en_ewt-ud-dev-first300.conllu.gz"),
                           test=str(data / "en_ewt-ud-test-first150.conllu.gz"), batch_size=1), store,
                    start_worker=False)
    worker = Worker(store)
    deadline = time.time() + 120
    while not store.get(job_id).progress and time.time() < deadline:  # it is running and has reported
        worker.step()
        time.sleep(0.1)
    assert store.get(job_id).progress, store.get(job_id).error
    store.request_cancel(job_id)
    job = drive(worker, store, job_id, timeout=60)
    assert job.status == "cancelled"
    assert not job.artifacts.exists()
    log = job.log_path.read_text()
    assert "stopped: cancelled on request" in log and "Traceback" not in log
    assert log.rstrip().splitlines()[-1].startswith("cancelled on request at ")


def test_the_jobs_table_shows_a_structure_jobs_progress_over_its_stages(home):
    from jobs.kinds import stage as structure_stage
    from ui.jobs import job_table

    store, data = home
    job_id = submit(config(data), store, start_worker=False)
    store.claim("cpu", 1)
    store.update_progress(job_id, {"stage": "probes", "step": 5, "total_steps": 20, "fraction": 0.8125})
    row = job_table(store.list()).iloc[0]
    assert row["progress"] == 0.8125 and row["epoch"] == "" and row["name"].startswith("linguistic structure")
    assert structure_stage(store.get(job_id)) == "probes: 5 of 20 steps · 81% of the job"
