"""Issue 25: faults in the job queue met with real processes and real files. Exact points are reached through
hooks (a ``sitecustomize`` module on PYTHONPATH that patches one function in the worker or the job process, or
a monkeypatch in this process), never through timing."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jobs import worker as worker_module
from jobs.store import JobStore, pid_alive
from jobs.submit import submit
from jobs.worker import Worker
from tests.integration.test_jobs import drive, setup, wait  # noqa: F401  (setup is a fixture)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # real job processes


@pytest.fixture
def hook(tmp_path, monkeypatch):
    """``install(code)``: ``code`` runs at the start of every Python process this test starts (workers, job
    processes, submitit's), with ``sys``, ``os``, ``time`` imported and the checkout importable. Gates are files
    under ``tmp_path``: a hooked process creates ``<name>.reached`` and waits for ``<name>.open``."""
    folder = tmp_path / "hook"
    folder.mkdir()
    gates = tmp_path / "gates"
    gates.mkdir()
    monkeypatch.setenv("LAYERLENS_TEST_GATES", str(gates))

    def install(code: str) -> Path:
        (folder / "sitecustomize.py").write_text(
            f"import os, sys, time\nsys.path.insert(0, {str(ROOT)!r})\nGATES = os.environ['LAYERLENS_TEST_GATES']\n"
            "def gate(name):\n"
            "    open(os.path.join(GATES, name + '.reached'), 'w').close()\n"
            "    while not os.path.exists(os.path.join(GATES, name + '.open')):\n"
            "        time.sleep(0.05)\n" + textwrap.dedent(code))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH"))
                                                         if p))
        return gates

    yield install
    for name in ("finish", "progress"):  # never leave a job process waiting at a gate
        (gates / f"{name}.open").touch()


def reached(gates: Path, name: str, until=lambda: False, timeout: float = 120) -> bool:
    """Wait until a hooked process reaches gate ``name`` (True) or ``until()`` holds (False)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (gates / f"{name}.reached").exists():
            return True
        if until():
            return False
        time.sleep(0.1)
    raise AssertionError(f"gate {name} not reached")


# the job process waits before it records its success: its artifacts are complete, its process runs
GATE_FINISH = """
if 'jobs.run' in sys.orig_argv:
    import jobs.store
    _finish = jobs.store.JobStore.finish
    def finish(self, job_id, status, *args, **kwargs):
        if status == 'succeeded':
            gate('finish')
        return _finish(self, job_id, status, *args, **kwargs)
    jobs.store.JobStore.finish = finish
"""

# the worker is SIGKILLed right after it started a job's process, before it recorded the process id
KILL_AT_SET_PID = """
if 'jobs.worker' in sys.orig_argv and os.environ.get('LAYERLENS_TEST_KILL_AT_SET_PID'):
    import signal
    import jobs.store
    jobs.store.JobStore.set_pid = lambda self, *args: os.kill(os.getpid(), signal.SIGKILL)
"""


def worker_command(store: JobStore) -> list[str]:
    return [sys.executable, "-m", "jobs.worker", "--root", str(store.root), "--idle-exit", "0"]


def test_a_worker_killed_before_recording_the_pid_leaves_the_job_running(setup, hook):  # noqa: F811
    """Issue 25.2: the worker dies between claiming a job and recording its process id. The next worker finds
    the job's process (by its command line), watches it, never marks it interrupted, and starts no second job
    on the device while it runs; the job ends succeeded with its artifacts."""
    store, config = setup
    gates = hook(GATE_FINISH + KILL_AT_SET_PID)
    first = submit(config, store, start_worker=False)
    second = submit(config, store, start_worker=False)
    killed = subprocess.run(worker_command(store), cwd=ROOT, capture_output=True, timeout=120,
                            env={**os.environ, "LAYERLENS_TEST_KILL_AT_SET_PID": "1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    job = store.get(first)
    assert job.status == "running" and job.pid is None  # claimed, its process started, the pid never written
    with open(store.root / "worker2.log", "wb") as log:
        new = subprocess.Popen(worker_command(store), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        # the new worker has looked at the job once it records its process or marks it finished
        deadline = time.time() + 60
        while (job := store.get(first)).pid is None and job.status == "running" and time.time() < deadline:
            time.sleep(0.1)
        assert job.status == "running", job.error
        assert reached(gates, "finish", until=lambda: store.get(first).status != "running")
        assert pid_alive(job.pid) and store.get(first).status == "running"
        assert store.get(second).status == "queued"  # the device is held by the running job
        (gates / "finish.open").touch()
        assert new.wait(timeout=300) == 0
    finally:
        if new.poll() is None:
            new.kill()
    first_job, second_job = store.get(first), store.get(second)
    assert first_job.status == "succeeded" and first_job.error is None
    assert (first_job.artifacts / "metrics.json").is_file()
    assert second_job.status == "succeeded" and second_job.started >= first_job.finished


GATE_PROGRESS = """
if 'jobs.run' in sys.orig_argv:
    import jobs.store
    _progress = jobs.store.JobStore.update_progress
    def update_progress(self, *args, **kwargs):
        if not os.path.exists(os.path.join(GATES, 'progress.reached')):
            gate('progress')
        return _progress(self, *args, **kwargs)
    jobs.store.JobStore.update_progress = update_progress
"""


def test_a_locked_database_never_fails_a_job(setup, hook):  # noqa: F811
    """Issue 25.5: another connection holds an EXCLUSIVE lock while the job writes its progress. The write
    waits, is skipped (said once in the job's log), and the job goes on and succeeds once the lock is gone."""
    store, config = setup
    gates = hook(GATE_PROGRESS)
    job_id = submit({**config, "epochs": 3}, store, start_worker=False)
    worker = Worker(store)
    worker.step()
    process = worker.running[job_id][0]
    assert reached(gates, "progress", until=lambda: process.poll() is not None)
    lock = sqlite3.connect(store.path, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        (gates / "progress.open").touch()
        log = store.get(job_id).log_path
        deadline = time.time() + 120
        while "progress not recorded" not in log.read_text() and process.poll() is None and time.time() < deadline:
            time.sleep(0.2)
    finally:
        lock.execute("COMMIT")
        lock.close()
    job = drive(worker, store, job_id)
    assert job.status == "succeeded", job.error
    text = job.log_path.read_text()
    assert text.count("progress not recorded") == 1 and "database is locked" in text, text
    assert job.progress["epoch"] == 3  # later writes went through


def test_a_full_disk_stops_the_worker_cleanly_and_the_queue_recovers(setup, tmp_path, monkeypatch, caplog):  # noqa: F811
    """Issue 25.5: the worker cannot write the job store (database or disk is full) when it records how a job
    ended. It stops with one line naming the database; once the fault is gone, a new worker records the job
    failed saying why (and the log's end), and runs the queued job."""
    store, config = setup
    late = tmp_path / "late.tsv"
    late.write_text((tmp_path / "train.tsv").read_text())
    crashing = submit({**config, "train": str(late)}, store, start_worker=False)
    late.write_text("text\tlabel\n")  # this job will fail: the worker has to record it
    queued = submit(config, store, start_worker=False)

    def full(self, *args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    with monkeypatch.context() as patch:
        patch.setattr(JobStore, "finish", full)
        with caplog.at_level(logging.INFO, logger="layerlens.worker"):
            reason = worker_module.run(store, idle_exit=0)  # returns: no exception
    assert "database or disk is full" in reason and str(store.path) in reason
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [reason] and "\n" not in reason
    assert store.get(crashing).status == "running" and store.get(queued).status == "queued"
    assert worker_module.run(store, idle_exit=0) is None  # the fault is gone: a new worker runs the queue
    job = store.get(crashing)
    assert job.status == "failed" and "database or disk is full" in job.error and "no usable rows" in job.error
    assert store.get(queued).status == "succeeded", store.get(queued).error


def staging_of(job) -> list[str]:
    return [p.name for p in job.directory.iterdir() if ".staging-" in p.name]


def test_a_cancelled_job_leaves_no_staging_folder(setup):  # noqa: F811
    """Issue 25.13: Cancel (SIGTERM, which a fine-tuning run does not catch) used to leave
    ``.artifacts.staging-*`` behind for good."""
    store, config = setup
    job_id = submit({**config, "epochs": 100_000}, store, start_worker=False)
    worker = Worker(store)
    drive(worker, store, job_id, until=("running",), timeout=30)
    deadline = time.time() + 60
    while not staging_of(store.get(job_id)) and time.time() < deadline:  # writing into its staging folder
        worker.step()
        time.sleep(0.2)
    assert staging_of(store.get(job_id))
    store.request_cancel(job_id)
    job = drive(worker, store, job_id)
    assert job.status == "cancelled" and staging_of(job) == [] and not job.artifacts.exists()
