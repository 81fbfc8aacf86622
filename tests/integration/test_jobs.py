"""The job runner: submit -> succeeded on a tiny model, cancel, crash -> failed, restart recovery, the CLI."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cli.main import main
from jobs.store import JobStore
from jobs.submit import SubmitError, submit, validate
from jobs.worker import Worker
from tests.support.data import synthetic
from tests.unit.training.test_training import write_tsv


def wait(store, job_id, statuses=("succeeded", "failed", "cancelled"), timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = store.get(job_id)
        if job.status in statuses:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {store.get(job_id).status}")


def drive(worker: Worker, store, job_id, until=("succeeded", "failed", "cancelled"), timeout=120, each=None):
    """Run the worker loop in this thread until the job reaches one of ``until``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        worker.step()
        if each:
            each()
        status = store.get(job_id).status
        if status in until and (status == "running" or not worker.running):
            return store.get(job_id)
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {store.get(job_id).status}")


@pytest.fixture
def setup(bert4, tmp_path):  # noqa: F811
    store = JobStore(tmp_path / "jobs")
    train = write_tsv(tmp_path / "train.tsv", synthetic(32))
    val = write_tsv(tmp_path / "val.tsv", synthetic(16, seed=1))
    config = {"model": str(bert4), "train": str(train), "val": str(val), "head": "attention", "epochs": 2,
              "batch_size": 8, "lr": 0.003}
    return store, config


@pytest.mark.slow
def test_submit_runs_to_success_with_artifacts(setup):
    store, config = setup
    job_id = submit(config, store, start_worker=False)
    job = drive(Worker(store), store, job_id)
    assert job.status == "succeeded", job.error
    assert 0 <= job.metrics["accuracy"] <= 1 and "macro_f1" in job.metrics
    assert job.progress["epoch"] == 2 and len(job.progress["history"]) == 2
    art = job.directory / "artifacts"
    for name in ("metrics.json", "predictions.csv", "layer_weights.csv", "run.json", "checkpoint/head.json",
                 "epochs/1/layer_weights.csv", "epochs/2/val_cls.npy"):
        assert (art / name).exists(), name
    assert json.loads((art / "metrics.json").read_text())["accuracy"] == job.metrics["accuracy"]
    log = job.log_path.read_text()  # for people: plain lines, an epoch line each, no progress-bar debris
    assert "\r" not in log and "\x1b" not in log and "Loading weights" not in log, log
    assert "epoch 1/2: train loss" in log and "epoch 2/2" in log and "encoder: " in log and "learning rate" in log


@pytest.mark.slow
def test_cancel_stops_a_running_job_within_seconds(setup):
    store, config = setup
    job_id = submit({**config, "epochs": 100_000}, store, start_worker=False)
    worker = Worker(store)
    drive(worker, store, job_id, until=("running",), timeout=30)
    while not store.get(job_id).progress:  # it is really training
        worker.step()
        time.sleep(0.2)
    store.request_cancel(job_id)
    start = time.time()
    job = drive(worker, store, job_id)
    assert job.status == "cancelled" and time.time() - start < 10
    assert job.log_path.read_text().rstrip().splitlines()[-1].startswith("cancelled on request at ")


def test_job_names_say_which_model_when_its_folder_is_generic(tmp_path):
    from jobs.submit import job_name

    run = tmp_path / "runs" / "sst2-seed3" / "model"
    run.mkdir(parents=True)
    assert job_name({"model": str(run), "head": "attention", "train": "demo"}).startswith(
        "attention · sst2-seed3/model · demo set")
    assert job_name({"model": "textattack/bert-base-uncased-SST-2", "train": "demo"}).startswith(
        "cls · textattack/bert-base-uncased-SST-2 · ")
    assert job_name({"model": "demo", "train": "demo"}).startswith("cls · demo · demo set")


def test_cancel_a_queued_job_at_once(setup):
    store, config = setup
    job_id = submit(config, store, start_worker=False)
    assert store.request_cancel(job_id) == "cancelled"
    assert store.claim("cpu", 1) is None
    assert "cancelled on request at " in store.get(job_id).log_path.read_text()


@pytest.mark.slow
def test_a_crash_is_failed_with_the_log_tail(setup, tmp_path):
    store, config = setup
    job_id = submit(config, store, start_worker=False)
    (tmp_path / "train.tsv").write_text("text\tlabel\n")  # the data vanishes after submit
    job = drive(Worker(store), store, job_id)
    assert job.status == "failed" and "no usable rows" in job.error


def test_restart_marks_interrupted_jobs_failed(setup):
    store, config = setup
    job_id = submit(config, store, start_worker=False)
    assert store.claim("cpu", 1).id == job_id
    store.set_pid(job_id, 2**22 + 12345)  # a process that does not exist: the worker died with it
    assert store.recover() == [job_id]
    job = store.get(job_id)
    assert job.status == "failed" and "interrupted" in job.error


def test_two_sessions_submitting_at_once_get_two_jobs(setup):
    store, config = setup
    ids = []
    threads = [threading.Thread(target=lambda: ids.append(submit(config, store, start_worker=False)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 2
    first, second = store.claim("cpu", 2), store.claim("cpu", 2)
    assert {first.id, second.id} == set(ids) and store.claim("cpu", 2) is None


def test_at_most_n_per_device(setup):
    store, config = setup
    for _ in range(2):
        submit(config, store, start_worker=False)
    assert store.claim("cpu", 1) is not None and store.claim("cpu", 1) is None


@pytest.mark.parametrize("change, message", [
    ({"lr": -1}, "learning rate"), ({"head": "gru-share-5"}, "must be one of"),
    ({"label_column": "gold"}, "no column 'gold'"), ({"epochs": "many"}, "epochs"),
    ({"learning_rate": 1}, "unknown option"), ({"model": "/nowhere"}, "not a directory"),
])
def test_bad_options_are_rejected_and_nothing_is_queued(setup, change, message):
    store, config = setup
    with pytest.raises(SubmitError, match=message):
        submit({**config, **change}, store, start_worker=False)
    assert store.list() == []


def test_single_class_is_rejected(setup, tmp_path):
    store, config = setup
    one = tmp_path / "one.tsv"
    one.write_text("text\tlabel\na\tx\nb\tx\n")
    with pytest.raises(SubmitError, match="single class"):
        validate({**config, "train": str(one)})


def test_cli_submit_show_list_cancel_logs(setup, tmp_path, capsys, monkeypatch):
    store, config = setup
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))  # JobStore() -> tmp_path/jobs, the fixture's store
    path = tmp_path / "job.json"
    path.write_text(json.dumps(config))
    assert main(["jobs", "submit", "--config", str(path), "--no-worker"]) == 0
    job_id = int(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["jobs", "show", str(job_id), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == job_id and shown["status"] == "queued" and "progress" in shown
    assert main(["jobs", "list"]) == 0 and "queued" in capsys.readouterr().out
    assert main(["jobs", "cancel", str(job_id)]) == 0 and "cancelled" in capsys.readouterr().out
    assert main(["jobs", "logs", str(job_id)]) == 0
    path.write_text(json.dumps({**config, "lr": 0}))
    assert main(["jobs", "submit", "--config", str(path), "--no-worker"]) == 2
    assert f"not queued ({path}): lr (learning rate): must be greater than 0" in capsys.readouterr().err
    assert [j.status for j in JobStore(tmp_path / "jobs").list()] == ["cancelled"]


@pytest.mark.slow
def test_submit_starts_a_worker_that_runs_the_job(setup, tmp_path):
    store, config = setup
    job_id = submit(config, store)  # starts a detached worker process
    job = wait(store, job_id)
    assert job.status == "succeeded", job.error
    out = subprocess.run([sys.executable, "-m", "jobs.worker", "--root", str(store.root), "--idle-exit", "0"],
                         capture_output=True, text=True, timeout=60, env={**os.environ})
    assert out.returncode == 0  # a second worker exits at once (the first holds the lock) or when idle


def test_a_worker_that_exits_is_reaped(setup):
    """The worker a page starts ends when idle; it must not linger as a defunct child of the server."""
    from jobs.worker import ensure_worker

    store, _ = setup
    proc = ensure_worker(store, idle_exit=0)
    assert proc is not None
    deadline = time.time() + 60
    while time.time() < deadline and proc.returncode is None:
        time.sleep(0.2)  # the reaper thread's wait() sets returncode once it has collected the exit status
    assert proc.returncode == 0
    status = Path(f"/proc/{proc.pid}/status")
    assert not status.exists() or "zombie" not in status.read_text()


@pytest.mark.slow
def test_a_killed_worker_never_blocks_the_queue(setup):
    """Issue 20.1 as found: SIGKILL the worker while a job runs, submit another (a new worker starts while the
    old job's process lives), then the old job's process dies. The new worker watches it, records it failed,
    and the next job runs."""
    from jobs.worker import ensure_worker

    store, config = setup
    first = submit({**config, "epochs": 100_000}, store, start_worker=False)
    worker = ensure_worker(store, idle_exit=60)
    wait(store, first, ("running",), timeout=60)
    deadline = time.time() + 60
    while not store.get(first).progress and time.time() < deadline:
        time.sleep(0.2)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    second = submit(config, store)  # a new worker: the old job's process is still alive and holds the device
    time.sleep(2)
    assert store.get(first).status == "running" and store.get(second).status == "queued"
    os.killpg(store.get(first).pid, signal.SIGKILL)
    assert "exit status is unknown" in wait(store, first, timeout=30).error
    assert wait(store, second, timeout=120).status == "succeeded"


def test_cancel_reaches_a_job_whose_worker_died(setup):
    store, config = setup
    job_id = submit(config, store, start_worker=False)
    store.claim("cpu", 1)
    orphan = subprocess.Popen(["sleep", "600"], start_new_session=True)  # the job's process, its worker gone
    store.set_pid(job_id, orphan.pid)
    worker = Worker(store)
    worker.step()
    assert store.get(job_id).status == "running" and job_id in worker.running
    store.request_cancel(job_id)
    job = drive(worker, store, job_id, timeout=15)
    assert job.status == "cancelled" and orphan.poll() == -signal.SIGTERM


def test_a_job_killed_by_a_signal_says_so(setup):
    store, config = setup
    job_id = submit({**config, "epochs": 100_000}, store, start_worker=False)
    worker = Worker(store)
    drive(worker, store, job_id, until=("running",), timeout=30)
    os.killpg(store.get(job_id).pid, signal.SIGKILL)
    job = drive(worker, store, job_id, timeout=30)
    assert job.status == "failed" and job.error.startswith("killed by SIGKILL (exit status -9)")


def test_recovery_removes_the_staging_folder_of_a_dead_job(setup):
    """Issue 25.13: a killed job's half-written ``.artifacts.staging-PID-*`` goes when its end is recorded."""
    store, config = setup
    job_id = submit(config, store, start_worker=False)
    store.claim("cpu", 1)
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.set_pid(job_id, dead.pid)
    stage = store.directory(job_id) / f".artifacts.staging-{dead.pid}-abc123"
    stage.mkdir()
    (stage / "predictions.csv").write_text("half")
    assert store.recover() == [job_id]
    assert not stage.exists() and store.get(job_id).status == "failed"
