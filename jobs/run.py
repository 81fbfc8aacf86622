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

from analysis.parallel import is_main_process
from jobs.store import JobStore

LOG_EVERY = 10.0  # seconds between progress lines within an epoch


def say(line: str) -> None:
    """One plain line in the job's log (no progress bars, no escape codes), with the time; from the main
    process only when the job runs in several."""
    if is_main_process():
        print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def quiet_libraries() -> None:
    """No progress bars or per-tensor notices from transformers / huggingface_hub in a job's log: the job
    says in one line what it loaded and what it does."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("job_id", type=int)
    p.add_argument("--root", type=Path)
    a = p.parse_args()
    store = JobStore(a.root)
    job = store.get(a.job_id)
    main_process = is_main_process()
    from analysis.finetune import run_options
    from analysis.inputs import InputError
    from analysis.options import resolve
    from models.loading import ModelLoadError

    quiet_libraries()
    last, said = [0.0], [time.time()]

    def progress(event, state, control):
        if not main_process:
            return
        now = time.time()
        if event == "epoch":
            h = state.history[-1]
            say(f"epoch {h['epoch']}/{options.epochs}: train loss {h['train_loss']:.4f}, validation loss "
                f"{h['val_loss']:.4f}, accuracy {h['val_accuracy']:.4f}, macro-F1 {h['val_macro_f1']:.4f}")
        elif now - said[0] >= LOG_EVERY:
            said[0] = now
            say(f"step {state.step}/{state.total_steps} (epoch {state.epoch}): loss {state.last_loss:.4f}, "
                f"lr {state.lr:.3g}")
        if event == "step" and now - last[0] < 1.0:
            return
        last[0] = now
        store.update_progress(job.id, {"step": state.step, "total_steps": state.total_steps, "epoch": state.epoch,
                                       "epochs": options.epochs, "loss": state.last_loss, "lr": state.lr,
                                       "history": state.history})

    try:
        options = resolve(job.config)
        out = job.directory / "artifacts"
        out.mkdir(parents=True, exist_ok=True)
        say(f"job {job.id}: {job.name}")
        metrics = run_options(options, out, [progress], log=say)
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
