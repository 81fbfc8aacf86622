"""The ``tokens`` job kind (issue 29, "Jobs"): a job extracts a corpus's token vectors (and builds each layer's
neighbour index) exactly as ``tokens extract`` / ``tokens index`` do, reports its progress in words, stops on
Cancel between batches and shards keeping the shards it wrote, and a job of the same options resumes from them;
bad input is refused at submit with one message."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pandas as pd
import pytest

from analysis.tokens.vectors import TokenVectors
from cli.main import main
from jobs.store import JobStore
from jobs.submit import SubmitError, job_name, submit, validate
from tests.integration.test_job_faults import hook, reached  # noqa: F401  (hook is a fixture)
from tests.integration.test_jobs import drive
from tests.support.data import FIXTURES

TRAIN = FIXTURES / "ud_tiny_train.conllu"
SHARD_ROWS = 40  # the tiny treebank's 232 tokens in 6 shards


@pytest.fixture
def home(tmp_path, monkeypatch, tiny_dirs):
    """LAYERLENS_HOME (job store, token-vector cache) under tmp_path, a data root holding a copy of the tiny
    treebank, and the job's options on the tiny BERT (3 layers, hidden 16)."""
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    data = tmp_path / "data"
    data.mkdir()
    (data / TRAIN.name).write_bytes(TRAIN.read_bytes())
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(data))
    config = {"kind": "tokens", "model": str(tiny_dirs["bert"]), "device": "cpu", "corpus": str(data / TRAIN.name),
              "shard_rows": SHARD_ROWS, "batch_size": 4, "index": "flat"}
    return JobStore(tmp_path / "home" / "jobs"), data, config


def cli(home_dir: Path, monkeypatch, *argv: str) -> None:
    """``python -m analysis tokens ...`` with LAYERLENS_HOME at ``home_dir`` (its own cache: nothing is found in
    the job's), then back."""
    before = os.environ["LAYERLENS_HOME"]
    monkeypatch.setenv("LAYERLENS_HOME", str(home_dir))
    try:
        assert main(["tokens", *argv]) == 0
    finally:
        monkeypatch.setenv("LAYERLENS_HOME", before)


def run_in_process(store: JobStore, job_id: int, out: Path, on_report=None):
    """:func:`jobs.run.run_job` (a tokens job) in this process (the SIGTERM handler it installs restored after); every
    progress report goes through ``on_report(line, progress)`` first."""
    from jobs import run as job_run

    real = job_run.Reporter.__call__

    def report(self, line, progress, force=False):
        if on_report:
            on_report(line, progress)
        real(self, line, progress, force)

    before = signal.getsignal(signal.SIGTERM)
    job_run.Reporter.__call__ = report
    out.mkdir(parents=True, exist_ok=True)
    try:
        return job_run.run_job(store, store.get(job_id), out)
    finally:
        job_run.Reporter.__call__ = real
        signal.signal(signal.SIGTERM, before)


def shard_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("shard_*.npy"))}


# --- submit -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"corpus": "missing.conllu"}, "corpus missing.conllu: no such file"),
    ({"layers": "9"}, "9"),
    ({"index": "annoy"}, "index"),
    ({"batch_size": 0}, "batch_size"),
    ({"backend": "cloud"}, "backend"),
    ({"model": "/no/such/model"}, "/no/such/model"),
    ({"colour": "red"}, "colour"),
])
def test_bad_input_is_refused_with_one_message_and_nothing_is_queued(home, change, message):
    store, _, config = home
    with pytest.raises(SubmitError, match=message) as refused:
        submit({**config, **change}, store, start_worker=False)
    assert "\n" not in str(refused.value) and "Traceback" not in str(refused.value)
    assert store.list() == []


def test_the_corpus_is_read_at_submit(home):
    """A malformed treebank line and a missing text column are refused at submit, naming them."""
    store, data, config = home
    bad = data / "bad.conllu"
    bad.write_text(TRAIN.read_text().replace("\t0\troot\t", "\tzero\troot\t", 1))
    with pytest.raises(SubmitError, match=f"{bad}:\\d+: HEAD 'zero'"):
        submit({**config, "corpus": str(bad)}, store, start_worker=False)
    table = data / "texts.csv"
    table.write_text("sentence\nthe film is good\n")
    with pytest.raises(SubmitError, match="text"):
        submit({**config, "corpus": str(table)}, store, start_worker=False)
    assert validate({**config, "corpus": str(table), "text_column": "sentence"})[0]["text_column"] == "sentence"
    assert store.list() == []


def test_the_browser_may_submit_only_a_corpus_under_the_data_roots(home, tmp_path, monkeypatch):
    store, data, config = home
    monkeypatch.setenv("LAYERLENS_MODEL_DIRS", str(Path(config["model"]).parent))
    outside = tmp_path / "private.conllu"
    outside.write_bytes(TRAIN.read_bytes())
    for corpus in (outside, data / ".." / "private.conllu"):
        with pytest.raises(SubmitError, match="not under the dashboard's data folders"):
            submit({**config, "corpus": str(corpus)}, store, start_worker=False, browser=True)
    with pytest.raises(SubmitError, match="pickle"):
        submit({**config, "allow_pickle": True}, store, start_worker=False, browser=True)
    with pytest.raises(SubmitError, match="not a model folder"):
        submit({**config, "model": str(data)}, store, start_worker=False, browser=True)
    assert store.list() == []
    assert validate({**config, "corpus": str(outside)})[0]["corpus"] == str(outside)  # the CLI trusts its user
    job_id = submit(config, store, start_worker=False, browser=True)
    assert store.get(job_id).config["corpus"] == str((data / TRAIN.name).resolve())


def test_the_job_is_named_for_what_it_is(home):
    store, _, config = home
    options, device = validate({**config, "layers": "0,3"})
    assert device == "cpu" and options["kind"] == "tokens" and options["index"] == "flat"
    assert job_name(options) == "token vectors · bert · ud_tiny_train.conllu · layers 0,3 · index flat"
    assert job_name({**options, "index": "none"}).endswith("· no index")
    job_id = submit(config, store, start_worker=False)
    assert store.get(job_id).label == f"job #{job_id} (token vectors, {config['model']})"


def test_cli_jobs_submit_queues_a_tokens_job(home, tmp_path, capsys):
    store, _, config = home
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(config))
    assert main(["jobs", "submit", "--config", str(path), "--no-worker"]) == 0
    job_id = int(capsys.readouterr().out.strip().splitlines()[-1])
    assert store.get(job_id).config["kind"] == "tokens"
    path.write_text(json.dumps({**config, "layers": "7"}))
    assert main(["jobs", "submit", "--config", str(path), "--no-worker"]) == 2
    assert "not queued" in capsys.readouterr().err


# --- the job's work -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_job_writes_what_tokens_extract_and_index_write(home, tmp_path, monkeypatch, capsys):
    """In process: the job's shards, metadata and exact index equal the CLI's byte for byte (each in its own
    cache), its run.json is extract's (and says the index), its index.csv is index's; the progress says the shard
    and the layer in words and reaches the whole job."""
    store, _, config = home
    job_id = submit(config, store, start_worker=False)
    reports = []
    metrics = run_in_process(store, job_id, tmp_path / "art", lambda line, p: reports.append((line, p)))
    tv = TokenVectors.open(tmp_path / "art")
    assert metrics["vectors"] == str(tv.directory) and metrics["computed_shards"] == metrics["shards"] == 6
    assert Path(metrics["vectors"]).is_relative_to(tmp_path / "home" / "cache" / "token_vectors")

    cli(tmp_path / "cli_home", monkeypatch, "extract", "--model", config["model"], "--device", "cpu", "--input",
        config["corpus"], "--shard-rows", str(SHARD_ROWS), "--batch-size", "4", "--out", str(tmp_path / "ex"))
    cli(tmp_path / "cli_home", monkeypatch, "index", "--vectors", str(tmp_path / "ex"), "--index", "flat",
        "--out", str(tmp_path / "ix"))
    ref = TokenVectors.open(tmp_path / "ex")
    assert ref.directory != tv.directory and ref.directory.name == tv.directory.name  # same key, other cache
    assert shard_files(tv.directory) == shard_files(ref.directory)
    for name in ("tokens.parquet", "texts.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(tv.directory / name), pd.read_parquet(ref.directory / name))
    for layer in tv.layers:
        name = f"index/layer{layer:02d}.flat.npy"
        assert (tv.directory / name).read_bytes() == (ref.directory / name).read_bytes()

    job_info, cli_info = (json.loads((d / "run.json").read_text()) for d in (tmp_path / "art", tmp_path / "ex"))
    for info in (job_info, cli_info):
        info.pop("seconds")
        info.pop("vectors")
        info.pop("input")  # the job's copy of the treebank is the CLI's file
    assert job_info.pop("index") == "flat" and job_info == cli_info
    volatile = ["build_seconds", "cached"]
    job_index, cli_index = (pd.read_csv(d / "index.csv") for d in (tmp_path / "art", tmp_path / "ix"))
    pd.testing.assert_frame_equal(job_index.drop(columns=volatile), cli_index.drop(columns=volatile))
    assert [r["layer"] for r in metrics["index"]] == [0, 1, 2, 3]

    lines = [line for line, _ in reports]
    assert lines[0].startswith("extract: shard 1 of 6 (")
    assert "extract: shard 6 of 6 written" in " ".join(lines)
    assert [line.split(" (")[0] for line in lines if line.startswith("index: layer") and "flat" in line] == [
        f"index: layer {n} of 4" for n in range(1, 5)]
    fractions = [p["fraction"] for _, p in reports]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and 0 < fractions[0] < 0.5
    steps = [p["step"] for _, p in reports if p["stage"] == "extract"]
    assert steps == sorted(steps) and steps[-1] == 6
    log = capsys.readouterr().out
    assert "extract: 6 shards to compute" in log and "model: " in log


def test_a_cancel_stops_between_batches_and_a_resubmitted_job_computes_only_the_missing_shards(
        home, tmp_path, monkeypatch):
    """In process: Cancel's SIGTERM during the third shard stops the job at its next batch (Cancelled); the two
    shards written stay, the third is absent (no temporary file left); a job of the same options computes the
    four missing shards only (the two kept are not rewritten) and ends with the vectors of an uninterrupted
    run."""
    from jobs import run as job_run

    store, _, config = home
    first = submit(config, store, start_worker=False)
    seen = []

    def cancel_in_third_shard(line, progress):
        seen.append(progress)
        if progress.get("shard") == 3 and progress["tokens"] and len([p for p in seen if p.get("shard") == 3]) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler the job installed records the request

    with pytest.raises(job_run.Cancelled):
        run_in_process(store, first, tmp_path / "art1", cancel_in_third_shard)
    assert seen[-1]["shard"] == 3 and seen[-1]["step"] == 2  # stopped at the first report after the signal
    (directory,) = (tmp_path / "home" / "cache" / "token_vectors").iterdir()
    assert sorted(shard_files(directory)) == ["shard_00000.npy", "shard_00001.npy"]
    assert not list(directory.glob(".*.tmp")) and not (directory / "index").exists()
    kept = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.glob("shard_*.npy")}

    second = submit(config, store, start_worker=False)
    reports = []
    metrics = run_in_process(store, second, tmp_path / "art2", lambda line, p: reports.append((line, p)))
    assert metrics["computed_shards"] == 4 and metrics["shards"] == 6
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.glob("shard_*.npy")
            if p.name in kept} == kept
    assert reports[0][0].startswith("extract: shard 3 of 6") and reports[0][1]["step"] == 2

    cli(tmp_path / "cli_home", monkeypatch, "extract", "--model", config["model"], "--device", "cpu", "--input",
        config["corpus"], "--shard-rows", str(SHARD_ROWS), "--batch-size", "4", "--out", str(tmp_path / "ex"))
    assert shard_files(directory) == shard_files(TokenVectors.open(tmp_path / "ex").directory)


def test_a_cancel_while_indexing_stops_before_the_next_layer(home, tmp_path):
    """Cancel during the index stage: the layers indexed stay (cached for the next job), no half index file."""
    from jobs import run as job_run

    store, _, config = home
    job_id = submit(config, store, start_worker=False)

    def cancel_at_layer_two(line, progress):
        if progress["stage"] == "index" and progress.get("layer") == 1 and progress["step"] == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(job_run.Cancelled):
        run_in_process(store, job_id, tmp_path / "art", cancel_at_layer_two)
    (directory,) = (tmp_path / "home" / "cache" / "token_vectors").iterdir()
    assert sorted(p.name for p in (directory / "index").iterdir()) == ["layer00.flat.json", "layer00.flat.npy"]
    metrics = run_in_process(store, submit(config, store, start_worker=False), tmp_path / "art2")
    assert [r["cached"] for r in metrics["index"]] == [True, False, False, False]


def test_an_approximate_index_reports_its_recall(home, tmp_path):
    """index ivf on two layers: index.csv has the measured recall@10 against exact search, as `tokens index`."""
    store, _, config = home
    job_id = submit({**config, "index": "ivf", "layers": "0,3", "recall_queries": 20}, store, start_worker=False)
    lines = []
    metrics = run_in_process(store, job_id, tmp_path / "art", lambda line, p: lines.append(line))
    table = pd.read_csv(tmp_path / "art" / "index.csv")
    assert table["layer"].tolist() == [0, 3] and set(table["kind"]) == {"ivf"}
    assert table["recall@10"].between(0, 1).all()
    assert [r["recall@10"] for r in metrics["index"]] == pytest.approx(table["recall@10"].tolist(), abs=1e-12)
    assert json.loads(table["params"][0])["nprobe"] >= 1
    assert sum("ivf, recall@10" in line for line in lines) == 2


def test_the_jobs_table_and_the_atlas_helpers_show_a_tokens_job(home):
    from jobs.kinds import stage as tokens_stage
    from ui.jobs import finished_tokens_jobs, job_table, tokens_jobs

    store, _, config = home
    job_id = submit(config, store, start_worker=False)
    store.claim("cpu", 1)
    store.update_progress(job_id, {"stage": "extract", "step": 2, "total_steps": 6, "shard": 3, "tokens": 130,
                                   "total_tokens": 232, "fraction": 0.197})
    row = job_table(store.list()).iloc[0]
    assert row["progress"] == 0.197 and row["epoch"] == "" and row["name"].startswith("token vectors")
    assert tokens_stage(store.get(job_id)) == "extract: shard 3 of 6 (130 of 232 tokens) · 20% of the job"
    store.update_progress(job_id, {"stage": "index", "step": 1, "total_steps": 4, "layer": 1, "fraction": 0.625})
    assert tokens_stage(store.get(job_id)) == "index: layer 2 of 4 · 62% of the job"
    assert [j.id for j in tokens_jobs(store)] == [job_id] and finished_tokens_jobs(store) == []
    store.finish(job_id, "succeeded", metrics={"kind": "tokens"})
    assert [j.id for j in finished_tokens_jobs(store)] == [job_id]


def test_the_jobs_page_says_where_a_running_tokens_job_is(home, monkeypatch):
    from tests.support.pages import run_page

    store, _, config = home
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    job_id = submit(config, store, start_worker=False)
    store.claim("cpu", 1)
    store.update_progress(job_id, {"stage": "extract", "step": 2, "total_steps": 6, "shard": 3, "tokens": 130,
                                   "total_tokens": 232, "fraction": 0.28})
    at = run_page("pages/5_Fine_Tune_Jobs.py", model=config["model"])
    assert not at.exception
    assert "extract: shard 3 of 6 (130 of 232 tokens) · 28% of the job" in [c.value for c in at.caption]
    assert at.button(key=f"cancel_{job_id}")
    store.finish(job_id, "succeeded", metrics={"kind": "tokens", "rows": 232, "layers": [0, 1, 2, 3], "hidden": 16,
                                               "shards": 6, "computed_shards": 4, "disk_bytes": 3 * 2**20,
                                               "index": [{"kind": "flat"}] * 4})
    at = run_page("pages/5_Fine_Tune_Jobs.py", model=config["model"])
    assert not at.exception and ("232 tokens x 4 hidden states x 16 in 6 shards (3.0 MiB; 4 computed by this job), "
                                 "index flat on 4 layers") in [c.value for c in at.caption]
    assert at.button(key=f"job_open_{job_id}").label == "Open it on the Token atlas page ↗"


def test_the_form_queues_a_tokens_job_from_the_browser(home, monkeypatch):
    from streamlit.testing.v1 import AppTest

    store, data, config = home
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")

    def page(model, corpus):
        from models.spec import ModelSpec
        from ui.jobs import tokens_job_form

        tokens_job_form(ModelSpec(model, device="cpu"), corpus, layers="0,3")

    at = AppTest.from_function(page, args=(config["model"], config["corpus"]), default_timeout=60).run()
    assert not at.exception
    at.selectbox(key="tokens_job_index").set_value("none")
    at.button(key="tokens_job_submit").click().run()
    assert not at.exception and "queued" in at.success[0].value
    (job,) = store.list()
    assert (job.config["kind"], job.config["index"], job.config["layers"]) == ("tokens", "none", "0,3")
    at = AppTest.from_function(page, args=(config["model"], "/etc/passwd"), default_timeout=60).run()
    at.button(key="tokens_job_submit").click().run()
    assert "Not queued" in at.error[0].value and len(store.list()) == 1


# --- real job processes ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_local_job_runs_to_success_with_its_artifacts(home):
    from jobs.worker import Worker

    store, _, config = home
    job = drive(Worker(store), store, submit(config, store, start_worker=False), timeout=300)
    assert job.status == "succeeded", job.error
    assert sorted(p.name for p in job.artifacts.iterdir()) == ["index.csv", "run.json"]
    assert TokenVectors.open(job.artifacts).rows == job.metrics["rows"] > 0
    assert job.progress["stage"] == "index" and job.progress["fraction"] == 1.0
    log = job.log_path.read_text()
    assert "extract: shard 6 of 6 written" in log and "index: layer 4 of 4 (hidden state 3): flat" in log
    assert "Traceback" not in log


# the job process waits at its first progress write after a shard was written
GATE_AFTER_FIRST_SHARD = """
if 'jobs.run' in sys.orig_argv:
    import jobs.store
    _update = jobs.store.JobStore.update_progress
    def update_progress(self, job_id, progress):
        if progress.get('stage') == 'extract' and progress.get('step', 0) >= 1:
            gate('progress')
        return _update(self, job_id, progress)
    jobs.store.JobStore.update_progress = update_progress
"""


@pytest.mark.slow
def test_a_cancelled_job_is_marked_cancelled_and_the_same_options_resume_it(home, hook):  # noqa: F811
    """A real job process, held after its first shard: Cancel stops it (status cancelled, no artifacts, the
    shard kept in the cache); a job of the same options says so and computes the other five."""
    from jobs.worker import Worker

    store, _, config = home
    gates = hook(GATE_AFTER_FIRST_SHARD)
    job_id = submit(config, store, start_worker=False)
    worker = Worker(store)
    def ended() -> bool:
        worker.step()
        return store.get(job_id).status in ("failed", "succeeded")

    assert reached(gates, "progress", until=ended), store.get(job_id).error
    store.request_cancel(job_id)
    worker.step()  # SIGTERM to the job's process: its handler records it
    (gates / "progress.open").touch()
    job = drive(worker, store, job_id, timeout=60)
    assert job.status == "cancelled" and not job.artifacts.exists()
    log = job.log_path.read_text()
    assert "extract: shard 1 of 6 written" in log and "stopped: cancelled on request" in log
    assert "Traceback" not in log and "shard 2 of 6 written" not in log
    (directory,) = (Path(os.environ["LAYERLENS_HOME"]) / "cache" / "token_vectors").iterdir()
    assert sorted(shard_files(directory)) == ["shard_00000.npy"]

    again = drive(worker, store, submit(config, store, start_worker=False), timeout=300)
    assert again.status == "succeeded", again.error
    assert again.metrics["computed_shards"] == 5
    assert "extract: 1 of 6 shards already on disk, computing the other 5" in again.log_path.read_text()


@pytest.mark.slow
def test_a_tokens_job_runs_through_submitit(home, monkeypatch):
    """backend slurm, with submitit's local executor (no Slurm here): the same job, the same artifacts."""
    from tests.integration.test_jobs import wait

    monkeypatch.setenv("LAYERLENS_SUBMITIT_CLUSTER", "local")
    store, _, config = home
    job_id = submit({**config, "backend": "slurm", "slurm_time": 10, "slurm_gpus": 0, "index": "none"}, store)
    assert store.get(job_id).backend == "slurm"
    job = wait(store, job_id, timeout=300)
    assert job.status == "succeeded", job.error
    assert sorted(p.name for p in job.artifacts.iterdir()) == ["run.json"]
    assert json.loads((job.artifacts / "run.json").read_text())["shards"] == 6

