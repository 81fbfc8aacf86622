"""The job worker: one per ``LAYERLENS_HOME`` (a lock file), started on demand by ``submit``.

    python -m jobs.worker [--idle-exit 300]

It marks jobs orphaned by a dead worker as failed, then loops: watch running jobs whose worker died while their
process lives on (adopted by process id: cancel reaches them, their end is recorded), claim queued jobs (at most
``LAYERLENS_JOBS_PER_DEVICE``, default 1, running per device), start each as its own process (``python -m
jobs.run ID``, or ``accelerate launch -m jobs.run ID`` when the job asks for several processes), stop those
whose cancel was requested (SIGTERM, SIGKILL after 5 s) and record how each ended. The job process records
success itself; a non-zero exit without a recorded status becomes ``failed`` with the signal or exit status and
the log's last lines. The
worker exits after ``--idle-exit`` seconds with nothing queued or running.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from analysis.parallel import launch_command
from jobs.store import JobStore, pid_alive

log = logging.getLogger("layerlens.worker")
POLL_S = 0.5


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


UNKNOWN = object()  # the exit status of a process this worker did not start (it cannot wait for it)


def exit_reason(code) -> str:
    """``killed by SIGKILL (exit status -9)``, ``exit status 1``, or why the status is not known."""
    if code is UNKNOWN:
        return ("the job's process ended; its exit status is unknown (an earlier worker, since stopped, started "
                "it)")
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit status {code})"
        except ValueError:
            return f"killed by signal {-code} (exit status {code})"
    return f"exit status {code}"


def record_exit(store: JobStore, job, code) -> None:
    """How a job's process ended, in the store (it records success itself): cancelled when asked to stop,
    else failed with why (the signal that killed it, its exit status) and the log's last lines."""
    if job.cancel_requested:
        store.finish(job.id, "cancelled")
    elif code is UNKNOWN or code != 0:
        logs = tail(job.log_path)
        store.finish(job.id, "failed", exit_reason(code) + (f"; the log ends:\n{logs}" if logs else ""))
    else:
        store.finish(job.id, "failed", "the job process ended without recording a result")


class Adopted:
    """A running job's process that this worker did not start (its worker was killed): watched by its process
    id, stopped through its process group; its exit status cannot be known."""

    def __init__(self, pid: int | None):
        self.pid = pid or 0

    def poll(self):
        return None if pid_alive(self.pid) else UNKNOWN


def start_process(job, root: Path) -> subprocess.Popen:
    """The job's process (:func:`job_command`) in a session of its own, its output appended to the job's log."""
    job.directory.mkdir(parents=True, exist_ok=True)
    with open(job.log_path, "ab") as logf:
        return subprocess.Popen(job_command(job, root), stdout=logf, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parents[1], start_new_session=True,
                                env={**os.environ, "TQDM_MININTERVAL": "5"})  # a readable log


def kill_group(pid: int, sig: int) -> None:
    """Signal a job's process group (it runs in a session of its own); nothing if it has just ended."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def honour_cancel(job, pid: int, term_sent: float | None) -> float | None:
    """Stop a running job whose cancel was requested: SIGTERM to its process group, SIGKILL 5 s later. Returns
    when SIGTERM was sent (None: not yet). The local worker and a Slurm node's :func:`jobs.backends.run_job` call
    it at every poll."""
    if job.cancel_requested and term_sent is None:
        kill_group(pid, signal.SIGTERM)
        return time.time()
    if term_sent is not None and time.time() - term_sent > 5:
        kill_group(pid, signal.SIGKILL)
    return term_sent


def job_command(job, root: Path) -> list[str]:
    processes = int(job.config.get("num_processes", 1) or 1)
    entry = ["-m", "jobs.run", str(job.id), "--root", str(root)]
    if processes > 1:
        return launch_command(processes, *entry)
    return [sys.executable, *entry]


class Worker:
    def __init__(self, store: JobStore, per_device: int | None = None):
        self.store = store
        self.per_device = per_device or int(os.environ.get("LAYERLENS_JOBS_PER_DEVICE", 1))
        self.running: dict[int, tuple[subprocess.Popen, float | None]] = {}  # id -> (process, time SIGTERM sent)

    def start(self, job) -> None:
        proc = start_process(job, self.store.root)
        self.store.set_pid(job.id, proc.pid)
        self.running[job.id] = (proc, None)
        log.info("job %d started (pid %d)", job.id, proc.pid)

    def adopt(self) -> None:
        """Watch the running local jobs no process of this worker runs (their worker died): a dead one is
        recorded at the next poll, a cancel reaches a live one. Runs at every poll, so no job stays
        ``running`` with a dead process and no queue waits forever behind one."""
        for job in self.store.unfinished("local"):
            if job.status == "running" and job.id not in self.running:
                self.running[job.id] = (Adopted(job.pid), None)
                log.info("watching job %d (pid %s), started by an earlier worker", job.id, job.pid)

    def step(self) -> None:
        self.adopt()
        for device in self.store.queued_devices():
            while (job := self.store.claim(device, self.per_device)) is not None:
                try:
                    self.start(job)
                except OSError as exc:
                    self.store.finish(job.id, "failed", f"could not start the job process: {exc}")
        for job_id, (proc, term_sent) in list(self.running.items()):
            code = proc.poll()
            job = self.store.get(job_id)
            if code is None:
                self.running[job_id] = (proc, honour_cancel(job, proc.pid, term_sent))
                continue
            del self.running[job_id]
            record_exit(self.store, job, code)

    def busy(self) -> bool:
        return bool(self.running) or bool(self.store.queued_devices())


def run(store: JobStore, idle_exit: float) -> None:
    lock = open(store.root / "worker.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("a worker is already running for %s", store.root)
        return
    lost = store.recover()
    if lost:
        log.warning("marked interrupted jobs as failed: %s", lost)
    worker, idle_since = Worker(store), time.time()
    while True:
        worker.step()
        if worker.busy():
            idle_since = time.time()
        elif time.time() - idle_since > idle_exit:
            return
        time.sleep(POLL_S)


def ensure_worker(store: JobStore, idle_exit: float = 300) -> subprocess.Popen | None:
    """Start a detached worker for ``store`` unless one holds the lock; returns it (None if one runs). A thread
    waits for it, so a worker that exits (idle) is reaped and never lingers as a defunct process."""
    with open(store.root / "worker.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        fcntl.flock(lock, fcntl.LOCK_UN)
    with open(store.root / "worker.log", "ab") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "jobs.worker", "--root", str(store.root), "--idle-exit",
                                 str(idle_exit)], stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=Path(__file__).resolve().parents[1])
    threading.Thread(target=proc.wait, name=f"reap-worker-{proc.pid}", daemon=True).start()
    return proc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, help="the jobs directory (default: LAYERLENS_HOME/jobs)")
    p.add_argument("--idle-exit", type=float, default=300, help="exit after this many idle seconds")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    run(JobStore(args.root), args.idle_exit)


if __name__ == "__main__":
    main()
