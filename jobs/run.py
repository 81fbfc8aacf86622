"""One job's process: ``python -m jobs.run ID [--root DIR]`` (started by the worker).

Runs the job's kind (:mod:`jobs.kinds`: ``run(config, out, control)``) on its stored options with its artifacts in
``<root>/<ID>/artifacts`` (staged, appearing whole when complete, unless the kind writes them straight, as a tuned
lens' checkpoints), hands the kind a :class:`Control` (the log, progress to the job database at most once a second
and at every epoch, Cancel's stop request, the earlier jobs' artifacts), and records ``succeeded`` with the
metrics at the end. A failure ends the process with the traceback in the job's log; the worker records it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import time
import traceback
from pathlib import Path

from analysis.core.parallel import is_main_process
from analysis.core.staging import staged
from jobs import kinds
from jobs.store import JobStore, StoreError

LOG_EVERY = 10.0  # seconds between progress lines within an epoch


def say(line: str) -> None:
    """One plain line in the job's log (no progress bars, no escape codes), with the time; from the main
    process only when the job runs in several."""
    if is_main_process():
        print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


class Reporter:
    """A job's progress for people and for the page: a log line at most every :data:`LOG_EVERY` seconds, the
    store's progress at most once a second; both at once when ``force`` (an epoch's end, the last step)."""

    def __init__(self, store: JobStore, job_id: int):
        self.store, self.job_id = store, job_id
        self.said, self.stored = time.time(), 0.0
        self.skipped = False  # a progress write was skipped (said once in the log)

    def __call__(self, line: str, progress: dict, force: bool = False) -> None:
        now = time.time()
        if force or now - self.said >= LOG_EVERY:
            self.said = now
            say(line)
        if force or now - self.stored >= 1.0:
            self.stored = now
            why = self.store.update_progress(self.job_id, progress)  # never fails the job
            if why and not self.skipped:
                self.skipped = True
                say(f"progress not recorded: {why} (the job goes on; the page shows its progress once the job "
                    "database can be written again; said once)")


def quiet_libraries() -> None:
    """No progress bars or per-tensor notices from transformers / huggingface_hub in a job's log: the job
    says in one line what it loaded and what it does."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


class Cancelled(Exception):
    """A stop was requested (SIGTERM from Cancel): raised from a progress callback, so the run ends at once."""


class Control:
    """What a kind's ``run`` gets from its job's process, so that it never imports ``jobs``: the log
    (:meth:`log`), a progress reporter (:meth:`reporter`), Cancel's stop request (:meth:`listen`, :meth:`stopped`,
    :meth:`check`), the earlier jobs' artifacts (:attr:`earlier`) and the store's JSON (:meth:`json_safe`)."""

    def __init__(self, store: JobStore, job):
        self.store, self.job = store, job
        self.stop: list[bool] = []

    @staticmethod
    def log(line: str) -> None:
        """One line in the job's log (:func:`say`)."""
        say(line)

    def reporter(self) -> Reporter:
        """A new :class:`Reporter` of this job's progress: ``reporter(line, progress, force=False)``."""
        return Reporter(self.store, self.job.id)

    def listen(self) -> None:
        """From now on Cancel's SIGTERM is recorded (:meth:`stopped`) instead of ending the process."""
        signal.signal(signal.SIGTERM, lambda *_: self.stop.append(True))

    def stopped(self) -> bool:
        """Whether a stop was requested since :meth:`listen`."""
        return bool(self.stop)

    def check(self) -> None:
        """:class:`Cancelled` when a stop was requested (the job ends with status cancelled)."""
        if self.stop:
            raise Cancelled("cancelled on request")

    @property
    def earlier(self) -> list[Path]:
        """The artifacts folders of the store's jobs, this one's included (a tuned lens resumes from them)."""
        return sorted(self.job.directory.parent.glob("*/artifacts"))

    @staticmethod
    def json_safe(records: list[dict]) -> list[dict]:
        """``records`` as the job database keeps them (:func:`json_safe`)."""
        return json_safe(records)


def run_job(store: JobStore, job, out: Path) -> dict:
    """Run ``job``'s kind (:mod:`jobs.kinds`) with its artifacts in ``out``; returns its metrics (raises
    :class:`Cancelled` when Cancel stopped it)."""
    return kinds.of(job.config).run(job.config, out, Control(store, job))


def json_safe(records: list[dict]) -> list[dict]:
    """Records with NaN as None (the store keeps JSON) and numpy numbers as Python numbers."""
    import math

    def value(v):
        v = v.item() if hasattr(v, "item") else v
        return None if isinstance(v, float) and math.isnan(v) else v

    return [{k: value(v) for k, v in r.items()} for r in records]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("job_id", type=int)
    p.add_argument("--root", type=Path)
    a = p.parse_args()
    store = JobStore(a.root)
    job = store.get(a.job_id)
    main_process = is_main_process()
    from analysis.core.inputs import InputError
    from models.loading import ModelLoadError

    quiet_libraries()
    kind = kinds.of(job.config)
    try:
        out = job.directory / "artifacts"
        say(f"job {job.id}: {job.name}")
        if kind.STAGED and main_process:  # the artifacts appear whole when the run is complete (analysis.core.staging)
            with staged(out) as stage:
                metrics = run_job(store, job, stage)
        elif kind.STAGED:  # another process of a multi-process job: it writes nothing
            metrics = run_job(store, job, out)
        else:  # the kind writes straight to the artifacts (a lens' checkpoints, to resume), file by file
            out.mkdir(parents=True, exist_ok=True)
            metrics = run_job(store, job, out)
    except Cancelled:
        say("stopped: cancelled on request")
        return 1
    except (InputError, ModelLoadError, ValueError) as exc:
        print(f"error: {exc}", flush=True)
        return 1
    except Exception:
        traceback.print_exc()
        return 1
    if main_process:
        try:
            store.finish(job.id, "succeeded", metrics=metrics)
        except (sqlite3.Error, StoreError) as exc:  # the result is complete on disk; the worker records the exit
            print(f"error: the job's result could not be recorded in {store.path} ({exc}); its artifacts are "
                  f"complete in {job.artifacts}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
