"""Jobs as the worker leaves them, and the job process run in this process."""

from __future__ import annotations

import signal
import sys

from analysis.training.finetune import Splits, run_finetune
from analysis.training.train import FinetuneConfig
from jobs import run as job_run
from jobs.store import JobStore
from models.loading import ModelSpec
from tests.support.data import synthetic


def finished_job(store: JobStore, model, head: str, splits: Splits | None = None) -> int:
    """A job as the worker leaves it: artifacts from a real (tiny) run, status succeeded."""
    config = {"model": str(model), "train": "x", "head": head, "epochs": 2}
    job_id = store.submit(config, "cpu", f"{head} run")
    store.claim("cpu", 10)
    metrics = run_finetune(ModelSpec(str(model), device="cpu"), splits or Splits(synthetic(24), synthetic(12, seed=1)),
                           FinetuneConfig(head=head, epochs=2, batch_size=8, lr=3e-3), store.directory(job_id) /
                           "artifacts")
    store.finish(job_id, "succeeded", metrics=metrics)
    return job_id


def run_job_process(store: JobStore, job_id: int, monkeypatch) -> int:
    """``python -m jobs.run ID --root ROOT``, in this process (so the registry patched here is the one it reads)."""
    monkeypatch.setattr(job_run, "quiet_libraries", lambda: None)
    monkeypatch.setattr(sys, "argv", ["jobs.run", str(job_id), "--root", str(store.root)])
    before = signal.getsignal(signal.SIGTERM)
    try:
        return job_run.main()
    finally:
        signal.signal(signal.SIGTERM, before)


