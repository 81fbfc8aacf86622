"""The ``heads`` job kind (issue 36, "Jobs"): bad input refused at submit with one message and nothing queued; a
job writes what ``layerlens heads ACTION`` writes for the same options; Cancel stops it at its next progress
report, writing nothing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pandas as pd
import pytest

from cli.main import main
from jobs import run as job_run
from jobs.store import JobStore
from jobs.submit import SubmitError, job_name, submit
from tests.support.data import FIXTURES

TREEBANK = FIXTURES / "ud_tiny_test.conllu"
TEXTS = "the film is good .\ni hated it , very dull !\nfun and not bad\n"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    texts = tmp_path / "texts.txt"
    texts.write_text(TEXTS)
    return JobStore(tmp_path / "home" / "jobs"), texts


def config(model, **changes) -> dict:
    return {"kind": "heads", "model": str(model), "device": "cpu", "batch_size": 2, **changes}


def run_in_process(store, job_id) -> Path:
    out = Path(store.directory(job_id)) / "out"
    out.mkdir()
    job_run.run_job(store, store.get(job_id), out)
    return out


@pytest.mark.parametrize("change, message", [
    ({"action": "stats"}, "a heads stats job reads input (one of them), not nothing"),
    ({"action": "parse", "input": "{texts}"}, "a heads parse job reads treebank (one of them), not input"),
    ({"action": "stats", "input": "missing.txt"}, "input missing.txt: no such file"),
    ({"action": "parse", "treebank": "{texts}"}, "no such CoNLL-U treebank"),
    ({"action": "importance", "input": str(TREEBANK)}, "importance reads texts (the MLM loss) or a labelled set"),
    ({"action": "importance", "input": "{texts}", "mask_prob": 1.5}, "mask_prob"),
    ({"action": "views", "input": "{texts}"}, "action"),
])
def test_bad_input_is_refused_with_one_message_and_nothing_is_queued(home, tiny_dirs, change, message):
    store, texts = home
    change = {k: v.format(texts=texts) if isinstance(v, str) else v for k, v in change.items()}
    with pytest.raises(SubmitError, match=message.replace("(", r"\(").replace(")", r"\)")) as refused:
        submit(config(tiny_dirs["bert"], **change), store, start_worker=False)
    assert "\n" not in str(refused.value) and "Traceback" not in str(refused.value)
    assert store.list() == []


def test_a_stats_job_writes_what_the_cli_writes(home, tiny_dirs, tmp_path):
    store, texts = home
    model = tiny_dirs["roberta"]
    job_id = submit(config(model, action="stats", input=str(texts), cluster_tokens=16), store, start_worker=False)
    assert job_name(store.get(job_id).config) == "head statistics · roberta · texts.txt"
    art = run_in_process(store, job_id)
    cli = tmp_path / "cli"
    assert main(["heads", "stats", "--model", str(model), "--device", "cpu", "--batch-size", "2", "--input",
                 str(texts), "--cluster-tokens", "16", "--out", str(cli)]) == 0
    assert sorted(p.name for p in art.iterdir()) == ["clusters.csv", "heads.csv", "run.json"]
    for name in ("heads.csv", "clusters.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(art / name), pd.read_csv(cli / name), check_exact=True)
    info = json.loads((art / "run.json").read_text())
    assert info["action"] == "stats" and info["intervals"] == json.loads((cli / "run.json").read_text())["intervals"]


def test_a_parse_job_writes_what_the_cli_writes(home, tiny_dirs, tmp_path):
    store, _ = home
    model = tiny_dirs["bert"]
    job_id = submit(config(model, action="parse", treebank=str(TREEBANK)), store, start_worker=False)
    art = run_in_process(store, job_id)
    cli = tmp_path / "cli"
    assert main(["heads", "parse", "--model", str(model), "--device", "cpu", "--batch-size", "2", "--treebank",
                 str(TREEBANK), "--out", str(cli)]) == 0
    for name in ("relations.csv", "head_accuracies.csv", "uuas.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(art / name), pd.read_csv(cli / name), check_exact=True)
    job_info, cli_info = (json.loads((d / "run.json").read_text()) for d in (art, cli))
    assert job_info["best_tree"] == cli_info["best_tree"]


def test_an_importance_job_on_texts_writes_what_the_cli_writes(home, tiny_dirs, tmp_path):
    store, texts = home
    model = tiny_dirs["bert"]
    job_id = submit(config(model, action="importance", input=str(texts), steps=2), store, start_worker=False)
    art = run_in_process(store, job_id)
    cli = tmp_path / "cli"
    assert main(["heads", "importance", "--model", str(model), "--device", "cpu", "--batch-size", "2", "--input",
                 str(texts), "--steps", "2", "--out", str(cli)]) == 0
    for name in ("importance.csv", "pruning.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(art / name), pd.read_csv(cli / name), check_exact=True)


def test_cancel_stops_the_job_at_its_next_progress_report_and_writes_nothing(home, tiny_dirs, monkeypatch):
    store, texts = home
    job_id = submit(config(tiny_dirs["bert"], action="stats", input=str(texts), batch_size=1), store,
                    start_worker=False)
    reports = []
    real = job_run.Reporter.__call__

    def report(self, line, progress, force=False):
        reports.append(progress)
        real(self, line, progress, force)

    monkeypatch.setattr(job_run.Reporter, "__call__", report)
    before = signal.getsignal(signal.SIGTERM)
    out = Path(store.directory(job_id)) / "out"
    out.mkdir()
    real_listen = job_run.Control.listen

    def listen_then_sigterm(self):
        real_listen(self)
        os.kill(os.getpid(), signal.SIGTERM)  # recorded by the handler the job just installed

    monkeypatch.setattr(job_run.Control, "listen", listen_then_sigterm)
    try:
        with pytest.raises(job_run.Cancelled):
            job_run.run_job(store, store.get(job_id), out)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert reports == [] and list(out.iterdir()) == []


@pytest.mark.slow
def test_importance_of_a_fine_tuning_jobs_classifier_from_the_cli(bert4, tmp_path, monkeypatch, capsys):  # noqa: F811
    """`heads importance --model job:N --data ROWS`: the job's own classifier (its pooling head on its fine-tuned
    encoder) scored on the rows it was validated on; with every head kept its accuracy is the accuracy of the
    predictions the job itself saved (predictions.csv); a job that kept no checkpoint is one line."""
    from tests.unit.compare.test_compare_jobs import run_job

    store = JobStore(tmp_path / "home" / "jobs")
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    job = run_job(store, bert4, tmp_path)
    out = tmp_path / "out"
    assert main(["heads", "importance", "--model", f"job:{job.id}", "--data", str(tmp_path / "val.tsv"),
                 "--steps", "2", "--batch-size", "4", "--out", str(out)]) == 0
    saved = pd.read_csv(job.artifacts / "predictions.csv", keep_default_na=False)
    rows = pd.read_csv(tmp_path / "val.tsv", sep="\t", keep_default_na=False)
    expected = float((saved.set_index("example_id")["prediction"].astype(str).sort_index().to_numpy()
                      == rows["label"].astype(str).to_numpy()).mean())
    pruning = pd.read_csv(out / "pruning.csv")
    base = pruning[(pruning.order == "importance") & (pruning.masked == 0)]["accuracy"].item()
    assert base == pytest.approx(expected)
    info = json.loads((out / "run.json").read_text())
    # job:N is resolved by the door to the job's encoder; the classifier read is the job's saved one beside it
    assert Path(info["model"]) == job.artifacts / "checkpoint" / "encoder"
    assert Path(info["model_spec"]["checkpoint"]) == job.artifacts / "checkpoint"
    assert "fine-tuning job's classifier" in info["loss"]
    assert len(pd.read_csv(out / "importance.csv")) == 4 * 2  # bert4: 4 layers x 2 heads
    mlm = tmp_path / "mlm"  # --input: the fine-tuned encoder read by the MLM head it started from
    assert main(["heads", "importance", "--model", f"job:{job.id}", "--input", str(tmp_path / "val.tsv"),
                 "--steps", "1", "--out", str(mlm)]) == 0
    assert "MLM" in json.loads((mlm / "run.json").read_text())["loss"]
    capsys.readouterr()
    assert main(["heads", "importance", "--model", "job:99", "--data", str(tmp_path / "val.tsv"),
                 "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


@pytest.mark.slow
def test_a_cancelled_stats_job_submitted_again_resumes_and_writes_what_the_cli_writes(home, tiny_dirs, tmp_path,
                                                                                       monkeypatch):
    """Issue 36, "Jobs: ... cancel and resume": the sums of a cancelled stats job are kept under
    LAYERLENS_HOME/cache/heads_progress; the same options submitted again go on after them."""
    store, texts = home
    model = tiny_dirs["bert"]
    options = config(model, action="stats", input=str(texts), batch_size=1, cluster_tokens=16)
    first = submit(options, store, start_worker=False)
    real = job_run.Reporter.__call__
    before = signal.getsignal(signal.SIGTERM)

    def report_then_cancel(self, line, progress, force=False):
        real(self, line, progress, force)
        os.kill(os.getpid(), signal.SIGTERM)  # Cancel pressed after the first sentence's report

    monkeypatch.setattr(job_run.Reporter, "__call__", report_then_cancel)
    try:
        with pytest.raises(job_run.Cancelled):
            run_in_process(store, first)
    finally:
        signal.signal(signal.SIGTERM, before)
    monkeypatch.setattr(job_run.Reporter, "__call__", real)
    assert len(list((tmp_path / "home" / "cache" / "heads_progress").glob("*.npz"))) == 1
    art = run_in_process(store, submit(options, store, start_worker=False))
    # Cancel came after the first report; the job saw it before its second sentence (should_stop), the first kept
    assert json.loads((art / "run.json").read_text())["resumed_after"] == 1
    assert not list((tmp_path / "home" / "cache" / "heads_progress").glob("*.npz"))
    cli = tmp_path / "cli"
    assert main(["heads", "stats", "--model", str(model), "--device", "cpu", "--batch-size", "1", "--input",
                 str(texts), "--cluster-tokens", "16", "--out", str(cli)]) == 0
    for name in ("heads.csv", "clusters.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(art / name), pd.read_csv(cli / name), check_exact=True)
