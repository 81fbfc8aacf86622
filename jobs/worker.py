"""The job worker: one per ``LAYERLENS_HOME`` (a lock file), started on demand by ``submit``.

    python -m jobs.worker [--idle-exit 300]

It marks jobs orphaned by a dead worker as failed (a job whose worker died before recording its process id is
first looked for by its command line, :func:`find_job_process`), then loops: watch running jobs whose worker
died while their process lives on (adopted by process id: cancel reaches them, their end is recorded), claim
queued jobs (at most ``LAYERLENS_JOBS_PER_DEVICE``, default 1, running per device), start each as its own process
(``python -m jobs.run ID``, or ``accelerate launch -m jobs.run ID`` when the job asks for several processes), stop
those whose cancel was requested (SIGTERM, SIGKILL after 5 s) and record how each ended. The job process records
success itself; a non-zero exit without a recorded status becomes ``failed`` with the signal or exit status and
the log's last lines. The worker exits after ``--idle-exit`` seconds with nothing queued or running, and at once
(one line, exit status 1) when it cannot write the job store (see :func:`run`).
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from analysis.core.parallel import launch_command
from jobs.store import WORKER_NOTE, JobStore, StoreError, pid_alive, tail

log = logging.getLogger("layerlens.worker")
POLL_S = 0.5


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


def job_marker(job_id: int, root: Path) -> list[str]:
    """The arguments that name a job's process on its command line (``jobs.run ID --root ROOT``)."""
    return ["jobs.run", str(job_id), "--root", str(root)]


def job_command(job, root: Path) -> list[str]:
    processes = int(job.config.get("num_processes", 1) or 1)
    entry = ["-m", *job_marker(job.id, root)]
    if processes > 1:
        return launch_command(processes, *entry)
    return [sys.executable, *entry]


def find_job_process(job_id: int, root: Path) -> int | None:
    """The process group of job ``job_id``'s live process, found by its command line (:func:`job_marker`) under
    ``/proc``; None when no such process runs (or there is no ``/proc``). For a job whose worker died between
    claiming it and recording its process id."""
    marker = [a.encode() for a in job_marker(job_id, root)]
    try:
        entries = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(args[i:i + len(marker)] == marker for i in range(len(args))):
                continue
            group = os.getpgid(int(entry.name))
        except (OSError, ValueError):
            continue
        if pid_alive(int(entry.name)):
            return group
    return None


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

    def find_started(self) -> None:
        """Record the process of each running local job that has none recorded and no process of this worker
        runs: its worker was killed between claiming it and recording the process id, and the process it started
        runs on (found by its command line). Without this the job would be marked interrupted while it runs,
        and a second job would start beside it on its device."""
        for job in self.store.unfinished("local"):
            if job.status == "running" and not job.pid and job.id not in self.running:
                pid = find_job_process(job.id, self.store.root)
                if pid:
                    self.store.set_pid(job.id, pid)
                    log.info("found job %d's process (pid %d), started by an earlier worker", job.id, pid)

    def adopt(self) -> None:
        """Watch the running local jobs no process of this worker runs (their worker died): a dead one is
        recorded at the next poll, a cancel reaches a live one. Runs at every poll, so no job stays
        ``running`` with a dead process and no queue waits forever behind one."""
        self.find_started()
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


def run(store: JobStore, idle_exit: float) -> str | None:
    """The worker's loop, until ``idle_exit`` seconds pass with nothing queued or running. A worker that cannot
    use the job store (database or disk full, locked past its wait, damaged) stops: it logs one line, leaves
    the line in :data:`~jobs.store.WORKER_NOTE` where it can (the next worker records it as the reason of the
    jobs it finds ended) and returns it. The job processes it started run on; the next worker (the next submit
    starts one) watches them. Returns None when it stopped idle."""
    lock = open(store.root / "worker.lock", "w")
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("a worker is already running for %s", store.root)
            return None
        try:
            worker = Worker(store)
            worker.find_started()
            lost = store.recover()
            if lost:
                log.warning("marked interrupted jobs as failed: %s", lost)
            idle_since = time.time()
            while True:
                worker.step()
                if worker.busy():
                    idle_since = time.time()
                elif time.time() - idle_since > idle_exit:
                    return None
                time.sleep(POLL_S)
        except (sqlite3.Error, StoreError) as exc:
            why = (f"the worker stopped at {time.strftime('%Y-%m-%d %H:%M:%S')}: it cannot use the job store "
                   f"{store.path} ({exc})")
            why = " ".join(why.split())  # one line
            log.error("%s", why)
            try:
                (store.root / WORKER_NOTE).write_text(why + "\n")
            except OSError:
                pass
            return why
    finally:
        lock.close()


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
    try:
        stopped = run(JobStore(args.root), args.idle_exit)
    except StoreError as exc:  # a damaged job database: one line naming it
        log.error("%s", exc)
        raise SystemExit(2) from None
    raise SystemExit(1 if stopped else 0)


if __name__ == "__main__":
    main()
