"""Fine-tuning jobs in a SQLite database under ``LAYERLENS_HOME`` (``jobs/jobs.db``): the queue and its state.

Statuses: ``queued`` -> ``running`` -> ``succeeded`` | ``failed`` | ``cancelled`` (a queued job can be cancelled
too). Claiming is one ``BEGIN IMMEDIATE`` transaction, so two workers never take the same job, and two sessions
submitting at once get two jobs. Every connection is short-lived (WAL mode): the Streamlit server, the worker
and the job processes all read and write the same file safely.

Faults: a write waits up to 30 s for a lock (progress writes 5 s, then are skipped: :meth:`JobStore.update_progress`
never fails a job); a read-only store raises :class:`ReadOnlyStore`, a damaged file :class:`CorruptStore`, both
one readable line naming it (:class:`StoreError`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import time
from pathlib import Path

from analysis.core.home import jobs_dir
from analysis.core.inputs import InputError
from analysis.core.staging import clean_stale, pid_alive

PROGRESS_WAIT_S = 5.0  # how long a progress write waits for a lock before it is skipped
WORKER_NOTE = "worker.stopped"  # why the last worker stopped, for the next one to record (see jobs.worker.run)
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
FINISHED = ("succeeded", "failed", "cancelled")
LOG_NAME = "job.log"  # in each job's directory

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    config TEXT NOT NULL,
    device TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    progress TEXT NOT NULL DEFAULT '{}',
    metrics TEXT,
    error TEXT,
    pid INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    backend TEXT NOT NULL DEFAULT 'local',
    backend_id TEXT,
    grp TEXT,
    label TEXT
);
"""
# columns added since the first release: (name, definition), added to an older database when it is opened
ADDED_COLUMNS = (("backend", "TEXT NOT NULL DEFAULT 'local'"), ("backend_id", "TEXT"), ("grp", "TEXT"),
                 ("label", "TEXT"))


@dataclasses.dataclass
class Job:
    id: int
    name: str
    config: dict
    device: str
    status: str
    created: float
    started: float | None
    finished: float | None
    progress: dict
    metrics: dict | None
    error: str | None
    pid: int | None
    cancel_requested: bool
    directory: Path
    backend: str = "local"
    backend_id: str | None = None  # the Slurm job id (the process id with submitit's local executor)
    group: str | None = None  # the sweep the job belongs to
    work: str | None = None  # what its kind called its work when it was submitted (``tuned lens``; a head's name)

    @property
    def where(self) -> str:
        """Where the job runs, for the jobs table: ``this machine (pid 123)``, ``slurm job 4567 (gpu)``."""
        if self.backend == "local":
            return f"this machine (pid {self.pid})" if self.pid else "this machine"
        partition = self.config.get("slurm_partition")
        place = f"slurm job {self.backend_id}" if self.backend_id else "slurm (not submitted)"
        return place + (f" ({partition})" if partition else "")

    @property
    def log_path(self) -> Path:
        return self.directory / LOG_NAME

    @property
    def artifacts(self) -> Path:
        return self.directory / "artifacts"

    @property
    def shown_status(self) -> str:
        """The status as the pages show it: a succeeded job whose artifacts were deleted says so."""
        if self.status == "succeeded" and not any(self.artifacts.glob("*.json")):
            return "succeeded · artifacts deleted"
        if self.status == "running" and self.cancel_requested:  # until its process has stopped
            return "cancelling…"
        return self.status

    @property
    def label(self) -> str:
        """How pages name the job (the label its kind gave at submit, and its model): ``job #3 (attention, demo)``,
        ``job #4 (tuned lens, demo)``. A job stored before labels were stored shows its kind's name (or its head's,
        a fine-tuning job's): the store reads no technique."""
        work = self.work or (self.config.get("kind") if self.config.get("kind", "finetune") != "finetune"
                             else self.config.get("head", "finetune"))
        return f"job #{self.id} ({work}, {self.config.get('model', 'demo')})"

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["directory"] = str(self.directory)
        out["log_path"] = str(self.log_path)
        return out


class StoreError(Exception):
    """The job store cannot be used; the message (one line) names it and says what to do."""


class ReadOnlyStore(StoreError, PermissionError):
    """The job store cannot be written (a read-only LAYERLENS_HOME); the message says so."""


class CorruptStore(StoreError):
    """The job database is damaged or not a database."""


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a job's log ('' when there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def jobs_home() -> Path:
    return jobs_dir()


class JobStore:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else jobs_home()
        self.path = self.root / "jobs.db"
        self.read_only = False
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.executescript(SCHEMA)
                have = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
                for name, definition in ADDED_COLUMNS:
                    if name not in have:
                        db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {definition}")
        except (PermissionError, sqlite3.OperationalError) as exc:
            # a read-only LAYERLENS_HOME (a shared or archived one): the jobs can still be listed and shown
            if not self.path.is_file():
                raise ReadOnlyStore(f"the job store {self.root} cannot be created ({exc})") from None
            self.read_only = True

    @contextlib.contextmanager
    def _connect(self, timeout: float = 30):
        if self.read_only:
            db = sqlite3.connect(f"{self.path.as_uri()}?immutable=1", uri=True, isolation_level=None)
        else:
            db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            if not self.read_only:
                db.execute("PRAGMA journal_mode=WAL")
            yield db
        except sqlite3.OperationalError as exc:
            if "readonly" in str(exc) or "read-only" in str(exc):
                raise ReadOnlyStore(f"the job store {self.root} is read-only: jobs can be listed, not changed") \
                    from None
            raise
        except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
            raise CorruptStore(f"the job database {self.path} cannot be read ({exc}): move it aside (e.g. rename "
                               "it to jobs.db.broken); jobs then start afresh, and the jobs' folders beside it "
                               "are kept") from None
        finally:
            db.close()

    def directory(self, job_id: int) -> Path:
        return self.root / str(job_id)

    def _job(self, row) -> Job:
        return Job(row["id"], row["name"], json.loads(row["config"]), row["device"], row["status"], row["created"],
                   row["started"], row["finished"], json.loads(row["progress"]),
                   json.loads(row["metrics"]) if row["metrics"] else None, row["error"], row["pid"],
                   bool(row["cancel_requested"]), self.directory(row["id"]), row["backend"], row["backend_id"],
                   row["grp"], row["label"])

    # --- queue ---------------------------------------------------------------------------------------------

    def submit(self, config: dict, device: str, name: str = "", group: str | None = None,
               label: str | None = None) -> int:
        """Queue a job; ``label``: what its kind calls its work (:func:`jobs.kinds.label`, given by the submitter)."""
        with self._connect() as db:
            cur = db.execute("INSERT INTO jobs (name, config, device, created, backend, grp, label) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)", (name, json.dumps(config), device, time.time(),
                                                               config.get("backend", "local"), group, label))
            job_id = cur.lastrowid
        self.directory(job_id).mkdir(parents=True, exist_ok=True)
        return job_id

    def claim(self, device: str, limit: int) -> Job | None:
        """The oldest queued job for ``device``, marked running, if fewer than ``limit`` run there now."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                running = db.execute("SELECT COUNT(*) FROM jobs WHERE status='running' AND device=?",
                                     (device,)).fetchone()[0]
                row = None
                if running < limit:
                    row = db.execute("SELECT * FROM jobs WHERE status='queued' AND device=? AND backend='local' "
                                     "ORDER BY id LIMIT 1", (device,)).fetchone()
                if row is not None:
                    db.execute("UPDATE jobs SET status='running', started=? WHERE id=?", (time.time(), row["id"]))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return self.get(row["id"]) if row is not None else None

    def queued_devices(self) -> list[str]:
        with self._connect() as db:
            return [r[0] for r in db.execute("SELECT DISTINCT device FROM jobs WHERE status='queued' AND "
                                             "backend='local'")]

    # --- state ---------------------------------------------------------------------------------------------

    def get(self, job_id: int) -> Job | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        return self._job(row) if row is not None else None

    def list(self, limit: int = 200) -> list[Job]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM jobs ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [self._job(r) for r in rows]

    def find(self, job_id: int) -> Job:
        """Job ``job_id``, or the one line every door says when there is none (an :class:`InputError`)."""
        job = self.get(job_id)
        if job is None:
            raise InputError(f"no job {job_id} under {self.root} (layerlens jobs list)")
        return job

    def everything(self) -> tuple[list[Job], str]:
        """Every job, newest first, and where the store is (for a message): a task's ``Context.jobs``."""
        return self.list(limit=1_000_000), str(self.root)

    def start(self, job_id: int, pid: int) -> bool:
        """A job another backend started (a Slurm job): queued -> running with its process id; False when it was
        cancelled (or started) before."""
        with self._connect() as db:
            cur = db.execute("UPDATE jobs SET status='running', started=?, pid=? WHERE id=? AND status='queued'",
                             (time.time(), pid, job_id))
            return cur.rowcount == 1

    def set_backend_id(self, job_id: int, backend_id: str) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET backend_id=? WHERE id=?", (backend_id, job_id))

    def unfinished(self, backend: str) -> list[Job]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM jobs WHERE backend=? AND status IN ('queued', 'running') ORDER BY id",
                              (backend,)).fetchall()
        return [self._job(r) for r in rows]

    def set_pid(self, job_id: int, pid: int) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET pid=? WHERE id=?", (pid, job_id))

    def update_progress(self, job_id: int, progress: dict) -> str | None:
        """Record a running job's progress; never fails the job: a write that meets a lock waits up to
        :data:`PROGRESS_WAIT_S`, and one that still fails (locked, disk full) is skipped. Returns why it was
        skipped (None when written); the next write brings the progress up to date."""
        try:
            with self._connect(timeout=PROGRESS_WAIT_S) as db:
                db.execute("UPDATE jobs SET progress=? WHERE id=?", (json.dumps(progress, default=float), job_id))
        except (sqlite3.Error, StoreError) as exc:
            return str(exc)
        return None

    def finish(self, job_id: int, status: str, error: str | None = None, metrics: dict | None = None) -> bool:
        """Mark a queued or running job finished; False if it had finished already. A cancelled job's log ends
        with a line saying so (the job's own process cannot write it: it was stopped).

        ``succeeded`` is recorded by the job's own process once its artifacts are complete, so it also replaces
        a ``failed`` recorded while that process still ran (its watcher died: Slurm's submit process killed,
        then :func:`jobs.backends.refresh`); the log says so. A failed or cancelled job's staging folder is
        removed once its process has gone (:func:`analysis.core.staging.clean_stale`)."""
        assert status in FINISHED
        from_statuses = ("queued", "running", "failed") if status == "succeeded" else ("queued", "running")
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT status, error FROM jobs WHERE id=?", (job_id,)).fetchone()
                done = row is not None and row["status"] in from_statuses
                if done:
                    db.execute("UPDATE jobs SET status=?, finished=?, error=?, metrics=COALESCE(?, metrics) "
                               "WHERE id=?", (status, time.time(), error,
                                              json.dumps(metrics, default=float) if metrics else None, job_id))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        if not done:
            return False
        note = None
        if status == "cancelled":
            note = f"\ncancelled on request at {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        elif row["status"] == "failed":
            first = (row["error"] or "").splitlines()[0] if row["error"] else ""
            note = (f"\n{time.strftime('%Y-%m-%d %H:%M:%S')} the job completed after it had been recorded as failed "
                    f"({first}); its result is recorded\n")
        if note:
            try:
                log_path = self.directory(job_id) / LOG_NAME
                log_path.parent.mkdir(parents=True, exist_ok=True)
                with open(log_path, "a") as log:
                    log.write(note)
            except OSError:  # the status says it; a log that cannot be written loses nothing else
                pass
        if status != "succeeded":
            clean_stale(self.directory(job_id) / "artifacts")
        return True

    def request_cancel(self, job_id: int) -> str:
        """Cancel: a queued job is cancelled at once; a running one is flagged for its worker to stop.
        Returns the job's status after the call."""
        job = self.get(job_id)
        if job is None:
            raise KeyError(job_id)
        if job.status == "queued" and self.finish(job_id, "cancelled"):
            return "cancelled"
        with self._connect() as db:
            db.execute("UPDATE jobs SET cancel_requested=1 WHERE id=? AND status='running'", (job_id,))
        return self.get(job_id).status

    def recover(self) -> list[int]:
        """Jobs left ``running`` by a worker or server that died: marked failed (interrupted), with why the last
        worker stopped when it could say so (:data:`WORKER_NOTE`) and the log's last lines."""
        note_path = self.root / WORKER_NOTE
        try:
            why = note_path.read_text(errors="replace").strip()
        except OSError:
            why = ""
        lost = [j for j in self.unfinished("local") if j.status == "running" and not pid_alive(j.pid)]
        for job in lost:
            logs = tail(job.log_path)
            self.finish(job.id, "failed", f"interrupted: {why or 'the worker or the server stopped while the job ran'}"
                        + (f"; the log ends:\n{logs}" if logs else ""))
        with contextlib.suppress(OSError):
            note_path.unlink(missing_ok=True)
        return [j.id for j in lost]


class StoreJobs:
    """A task's ``Context.job`` and ``Context.jobs`` (:class:`analysis.core.task.Context`) read from this user's job
    store: the CLI's and a page's contexts (a job's reads the store its worker opened)."""

    def job(self, job_id: int) -> Job:
        return JobStore().find(job_id)

    def jobs(self) -> tuple[list[Job], str]:
        return JobStore().everything()
