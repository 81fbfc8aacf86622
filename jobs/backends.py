"""Where jobs run: ``local`` (the worker of :mod:`jobs.worker`, on this machine) or ``slurm`` (one Slurm job per
LayerLens job, through submitit). :func:`cancel` and :func:`refresh` serve both; the rest is the Slurm mapping.

The job store and the artifacts stay where they are, under ``LAYERLENS_HOME/jobs``, which the dashboard host
and the cluster's nodes must both see (a shared filesystem). Mapping:

- submit: :func:`launch` hands :func:`run_job` to submitit's executor with the job's options (``slurm_time``
  minutes, ``slurm_gpus`` GPUs, ``slurm_partition``, one task: a job with ``num_processes`` > 1 runs
  ``accelerate launch`` inside its allocation); the Slurm job id is stored (``backend_id``); the job stays
  ``queued`` until it starts on a node.
- run (on the node): :func:`run_job` marks the job ``running``, starts the same command the local worker
  starts (``python -m jobs.run ID``), stops it when a cancel is requested and records how it ended.
- cancel: :func:`cancel` flags the job; :func:`run_job` stops the running process (SIGTERM, then SIGKILL), and a
  job still pending in Slurm is cancelled there (``scancel``).
- status: :func:`refresh` (run by ``jobs list`` and the jobs page) marks a job whose Slurm job has ended
  without recording a result (killed, out of time, node failure) as failed, with its log's last lines.

``LAYERLENS_SUBMITIT_CLUSTER=local`` runs the same mapping with submitit's local executor (a process on this
machine): the tests use it, as can a machine without Slurm.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from jobs.store import FINISHED, JobStore, pid_alive, tail
from jobs.worker import honour_cancel, record_exit, start_process

POLL_S = 1.0
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING", "UNKNOWN")


def cluster() -> str:
    return os.environ.get("LAYERLENS_SUBMITIT_CLUSTER", "slurm")


def check_available() -> None:
    """A ``ValueError`` when jobs cannot be sent to Slurm from here."""
    if cluster() == "slurm" and shutil.which("sbatch") is None:
        raise ValueError("backend slurm: this machine has no Slurm (sbatch not found); run the dashboard or "
                         "`jobs submit` on a Slurm login node whose filesystem the nodes share (see the README)")


def private_folder(folder: Path) -> Path:
    """``folder`` (created) and the files in it readable and writable by this user only (0o700 / 0o600)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    for path in folder.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o600)
    return folder


def executor(job):
    """submitit's executor for ``job``. Its folder holds the pickles the node unpickles whatever *allow pickle*
    says (the function to run and its arguments, then the result): written by this server for itself, so the
    folder is this user's alone (:func:`private_folder`), and no one else can plant or read one there."""
    import submitit

    options = job.config
    ex = submitit.AutoExecutor(folder=private_folder(job.directory / "submitit"), cluster=cluster())
    params = {"name": f"layerlens-{job.id}", "timeout_min": int(options.get("slurm_time", 120)),
              "gpus_per_node": int(options.get("slurm_gpus", 1)), "tasks_per_node": 1, "nodes": 1}
    if options.get("slurm_partition"):
        params["slurm_partition"] = options["slurm_partition"]
    ex.update_parameters(**params)
    return ex


def launch(store: JobStore, job_id: int) -> str:
    """Send the queued job to Slurm; returns the Slurm job id (also stored)."""
    job = store.get(job_id)
    try:
        submitted = executor(job).submit(run_job, str(store.root), job_id)
    except Exception as exc:  # sbatch refused it (a partition that does not exist, a time over the limit, ...)
        store.finish(job_id, "failed", f"Slurm did not accept the job: {exc}")
        raise ValueError(f"Slurm did not accept the job: {str(exc).strip().splitlines()[-1]}") from None
    private_folder(job.directory / "submitit")  # the pickles submitit has just written
    store.set_backend_id(job_id, str(submitted.job_id))
    return str(submitted.job_id)


def run_job(root: str, job_id: int) -> int:
    """On the node: run the job's process, honour cancel, record how it ended. Returns its exit status."""
    store = JobStore(Path(root))
    if not store.start(job_id, os.getpid()):  # cancelled while it waited in Slurm's queue
        return 0
    proc = start_process(store.get(job_id), store.root)
    store.set_pid(job_id, proc.pid)
    term_sent = None
    while proc.poll() is None:
        term_sent = honour_cancel(store.get(job_id), proc.pid, term_sent)
        time.sleep(POLL_S)
    record_exit(store, store.get(job_id), proc.returncode)
    return proc.returncode


def _active(job) -> bool:
    """Whether the job's Slurm job (or local executor process) may still run or record its result."""
    if not job.backend_id:
        return True  # being submitted right now
    if cluster() == "local":  # submitit's local executor: the id is the process id
        return pid_alive(int(job.backend_id))
    import submitit

    return submitit.SlurmJob(job.directory / "submitit", job.backend_id).state.upper().split()[0] in ACTIVE


def refresh(store: JobStore) -> list[int]:
    """Bring the store up to date with the backends before showing it: mark the slurm jobs whose Slurm job ended
    without a result cancelled if a cancel was asked, else failed with the log's last lines (or submitit's).
    Returns their ids. (Local jobs are kept up to date by their worker.)"""
    ended = []
    for job in store.unfinished("slurm"):
        if _active(job):
            continue
        if job.cancel_requested:
            store.finish(job.id, "cancelled")
        else:
            logs = tail(job.log_path) or "\n".join(tail(p) for p in sorted((job.directory / "submitit").glob(
                "*_log.err")))
            store.finish(job.id, "failed", "the Slurm job ended without recording a result (killed, out of time "
                         "or a node failure)" + (f":\n{logs}" if logs else ""))
        ended.append(job.id)
    return ended


def cancel(store: JobStore, job_id: int) -> str:
    """Cancel a job: a queued one at once; a running one is flagged for the process that watches it (the local
    worker, or :func:`run_job` on the Slurm node); a Slurm job still pending is also cancelled in Slurm.
    Returns the job's status. A ``KeyError`` for an unknown id."""
    job = store.get(job_id)
    if job is None:
        raise KeyError(job_id)
    status = store.request_cancel(job_id)
    if job.backend == "slurm" and job.status == "queued" and job.backend_id and status in FINISHED:
        if cluster() == "local":
            _kill_local(job.backend_id)
        else:
            import submitit

            submitit.SlurmJob(job.directory / "submitit", job.backend_id).cancel(check=False)
    return status


def _kill_local(backend_id: str) -> None:
    try:
        os.kill(int(backend_id), signal.SIGINT)
    except (ProcessLookupError, ValueError):
        pass
