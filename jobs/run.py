"""One job's process: ``python -m jobs.run ID [--root DIR]`` (started by the worker).

Runs :func:`analysis.finetune.run_options` on the job's stored options with its artifacts in ``<root>/<ID>/artifacts``,
writes progress (step, epoch, loss, learning rate, per-epoch validation metrics) to the job database at most
once a second and at every epoch, and records ``succeeded`` with the metrics at the end. A failure ends the
process with the traceback in the job's log; the worker records it.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from pathlib import Path

from jobs.store import JobStore


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("job_id", type=int)
    p.add_argument("--root", type=Path)
    a = p.parse_args()
    store = JobStore(a.root)
    job = store.get(a.job_id)
    main_process = os.environ.get("RANK", "0") == "0"
    from analysis.finetune import run_options
    from analysis.inputs import InputError
    from analysis.options import resolve
    from models.loading import ModelLoadError

    last = [0.0]

    def progress(event, state, control):
        if not main_process or (event == "step" and time.time() - last[0] < 1.0):
            return
        last[0] = time.time()
        store.update_progress(job.id, {"step": state.step, "total_steps": state.total_steps, "epoch": state.epoch,
                                       "epochs": options.epochs, "loss": state.last_loss, "lr": state.lr,
                                       "history": state.history})

    try:
        options = resolve(job.config)
        out = job.directory / "artifacts"
        out.mkdir(parents=True, exist_ok=True)
        metrics = run_options(options, out, [progress], log=lambda line: print(line, flush=True))
    except (InputError, ModelLoadError, ValueError) as exc:
        print(f"error: {exc}", flush=True)
        return 1
    except Exception:
        traceback.print_exc()
        return 1
    if main_process:
        store.finish(job.id, "succeeded", metrics=metrics)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
