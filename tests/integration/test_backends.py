"""Job backends: the slurm mapping through submitit's local executor (no Slurm here), sweeps, old stores."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import stat
import time

import pytest

from analysis.core.inputs import InputError
from analysis.training.options import grid
from jobs import backends
from jobs.store import JobStore, pid_alive
from jobs.submit import SubmitError, submit, submit_sweep
from tests.integration.test_job_faults import GATE_FINISH, hook, reached  # noqa: F401  (hook is a fixture)
from tests.integration.test_jobs import setup, wait  # noqa: F401  (setup is a fixture)

pytestmark = pytest.mark.slow  # every test here takes more than ~5 s


@pytest.fixture
def slurm(setup, monkeypatch):  # noqa: F811
    monkeypatch.setenv("LAYERLENS_SUBMITIT_CLUSTER", "local")
    store, config = setup
    return store, {**config, "backend": "slurm", "slurm_time": 10, "slurm_gpus": 0}


def test_slurm_job_succeeds_through_submitit(slurm):
    store, config = slurm
    job_id = submit(config, store)
    job = store.get(job_id)
    assert job.backend == "slurm" and job.backend_id and f"slurm job {job.backend_id}" in job.where
    job = wait(store, job_id)
    assert job.status == "succeeded", job.error
    assert (job.artifacts / "metrics.json").is_file() and (job.directory / "submitit").is_dir()
    assert "epoch 2/2" in job.log_path.read_text()
    assert store.claim("cpu", 5) is None  # the local worker never takes a slurm job


def test_slurm_job_cancel_stops_it(slurm):
    store, config = slurm
    job_id = submit({**config, "epochs": 100_000}, store)
    wait(store, job_id, ("running",), timeout=60)
    deadline = time.time() + 60
    while not store.get(job_id).progress and time.time() < deadline:  # really training
        time.sleep(0.2)
    assert backends.cancel(store, job_id) == "running"
    start = time.time()
    job = wait(store, job_id, timeout=30)
    assert job.status == "cancelled" and time.time() - start < 15


def test_slurm_job_crash_is_failed_with_the_log_tail(slurm, tmp_path):
    store, config = slurm
    (tmp_path / "late.tsv").write_text((tmp_path / "train.tsv").read_text())
    job_id = submit({**config, "train": str(tmp_path / "late.tsv")}, store)
    (tmp_path / "late.tsv").write_text("text\tlabel\n")  # the data vanishes after submit
    job = wait(store, job_id)
    assert job.status == "failed" and "no usable rows" in job.error


def own_process_recorded(store, job_id):
    """The job once its own process has recorded itself (run_job on the "node" records itself first, then its
    child); a loaded machine may take a minute to start the child."""
    deadline = time.time() + 180
    job = store.get(job_id)
    while job.pid == int(job.backend_id) and time.time() < deadline:
        time.sleep(0.1)
        job = store.get(job_id)
    assert job.pid != int(job.backend_id), "the job's own process never recorded itself"
    return job


def test_a_killed_slurm_job_is_failed_on_refresh(slurm):
    store, config = slurm
    job_id = submit({**config, "epochs": 100_000}, store)
    wait(store, job_id, ("running",), timeout=60)
    job = own_process_recorded(store, job_id)
    for pid in (int(job.backend_id), job.pid):  # the Slurm job and the job's own process: a node lost
        with contextlib.suppress(ProcessLookupError):  # under load the watcher may already have gone (seen once in CI)
            os.killpg(pid, signal.SIGKILL) if pid == job.pid else os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 10
    while not backends.refresh(store) and time.time() < deadline:
        time.sleep(0.2)
    job = store.get(job_id)
    assert job.status == "failed" and "ended without recording a result" in job.error


@pytest.mark.slow
def test_a_result_that_arrives_after_refresh_failed_the_job_is_a_success(slurm, hook):  # noqa: F811
    """Issue 25.13: the process that watches a Slurm job (submitit's) is killed while the job's own process runs
    on; refresh marks the job failed. The job then completes: its success is recorded (a note in its log), not
    left under a "failed" status with complete artifacts."""
    store, config = slurm
    gates = hook(GATE_FINISH)
    job_id = submit(config, store)
    wait(store, job_id, ("running",), timeout=60)
    job = own_process_recorded(store, job_id)
    assert reached(gates, "finish", until=lambda: store.get(job_id).status != "running")  # artifacts complete
    os.kill(int(job.backend_id), signal.SIGKILL)  # the submit process, not the job's own
    deadline = time.time() + 30
    while not backends.refresh(store) and time.time() < deadline:
        time.sleep(0.2)
    assert store.get(job_id).status == "failed"
    (gates / "finish.open").touch()
    deadline = time.time() + 60
    while pid_alive(job.pid) and time.time() < deadline:
        time.sleep(0.2)
    job = store.get(job_id)
    assert job.status == "succeeded" and job.error is None and (job.artifacts / "metrics.json").is_file()
    assert "after it had been recorded as failed" in job.log_path.read_text()


def test_submitit_files_are_readable_by_the_owner_only(slurm):
    """Issue 25.14a: the node unpickles jobs/<id>/submitit/*.pkl whatever *allow pickle* says; only the
    server's own user may read or write them (folder 0o700, files 0o600)."""
    store, config = slurm
    job_id = submit({**config, "epochs": 100_000}, store)
    folder = store.get(job_id).directory / "submitit"
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        pickles = list(folder.glob("*.pkl"))
        assert pickles and {stat.S_IMODE(p.stat().st_mode) for p in pickles} == {0o600}
    finally:
        backends.cancel(store, job_id)
        wait(store, job_id, timeout=60)


def test_slurm_needs_sbatch(setup, monkeypatch):  # noqa: F811
    monkeypatch.delenv("LAYERLENS_SUBMITIT_CLUSTER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    store, config = setup
    with pytest.raises(SubmitError, match="no Slurm"):
        submit({**config, "backend": "slurm"}, store, start_worker=False)
    assert store.list() == []


def test_grid_is_the_cross_product():
    points = grid(["heads=cls,attention,lstm", "lr=2e-5,5e-5"])
    assert points == [{"head": h, "lr": lr} for h in ("cls", "attention", "lstm") for lr in ("2e-5", "5e-5")]
    for bad, message in ((["head"], "KEY=VALUE"), (["nope=1"], "unknown option 'nope'"), (["lr="], "no values"),
                         (["lr=1", "lr=2"], "twice")):
        with pytest.raises(InputError, match=message):
            grid(bad)


def test_sweep_queues_one_job_per_point_in_one_group(setup):  # noqa: F811
    store, config = setup
    group, ids = submit_sweep(config, grid(["head=cls,attention", "lr=2e-5,5e-5,1e-4"]), store, start_worker=False)
    jobs = [store.get(i) for i in ids]
    assert len(jobs) == 6 and {j.group for j in jobs} == {group} and "head x lr" in group
    assert sorted((j.config["head"], j.config["lr"]) for j in jobs) == sorted(
        (h, lr) for h in ("cls", "attention") for lr in (2e-5, 5e-5, 1e-4))
    assert len({j.name for j in jobs}) == 6  # names say what differs
    with pytest.raises(SubmitError, match="lr=-1"):  # one bad point: nothing queued
        submit_sweep(config, grid(["lr=1e-4,-1"]), store, start_worker=False)
    assert len(store.list()) == 6


def test_cli_grid(setup, tmp_path, monkeypatch, capsys):  # noqa: F811
    from cli.main import main

    store, config = setup
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    path = tmp_path / "job.json"
    path.write_text(json.dumps(config))
    assert main(["jobs", "submit", "--config", str(path), "--no-worker", "--grid", "heads=cls,attention",
                 "--group", "my sweep"]) == 0
    ids = [int(line) for line in capsys.readouterr().out.split()]
    assert [store.get(i).group for i in ids] == ["my sweep"] * 2


def test_an_older_store_gains_the_new_columns(tmp_path):
    root = tmp_path / "jobs"
    root.mkdir()
    with sqlite3.connect(root / "jobs.db") as db:
        db.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, config TEXT NOT "
                   "NULL, device TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'queued', created REAL NOT NULL, "
                   "started REAL, finished REAL, progress TEXT NOT NULL DEFAULT '{}', metrics TEXT, error TEXT, "
                   "pid INTEGER, cancel_requested INTEGER NOT NULL DEFAULT 0)")
        db.execute("INSERT INTO jobs (name, config, device, created) VALUES ('old', '{}', 'cpu', 0)")
    job = JobStore(root).list()[0]
    assert (job.name, job.backend, job.group, job.where) == ("old", "local", None, "this machine")
