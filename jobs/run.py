"""One job's process: ``python -m jobs.run ID [--root DIR]`` (started by the worker).

Runs :func:`analysis.finetune.run_options` on the job's stored options with its artifacts in ``<root>/<ID>/artifacts``,
writes progress (step, epoch, loss, learning rate, per-epoch validation metrics) to the job database at most
once a second and at every epoch, and records ``succeeded`` with the metrics at the end. A failure ends the
process with the traceback in the job's log; the worker records it.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import time
import traceback
from pathlib import Path

from analysis.parallel import is_main_process
from analysis.staging import staged
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


def train_lens(store: JobStore, job, out: Path) -> dict:
    """A tuned-lens job: :func:`analysis.lens.train` with its progress in the store. SIGTERM (Cancel) stops it
    after the current step with a checkpoint in the artifacts; a later job of the same options (and weights and
    texts) resumes from the furthest such checkpoint of the earlier jobs."""
    import signal

    from analysis import lens
    from analysis.options import LensOptions
    from models.loading import load_model

    options = LensOptions(**{k: v for k, v in job.config.items() if k != "kind"})
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    loaded = load_model(options.spec())
    texts = lens.read_corpus(options)
    say(f"model: {loaded.spec.name} ({loaded.num_layers} layers) on {loaded.spec.device}; {len(texts):,} texts")
    report = Reporter(store, job.id)

    def progress(step, total, losses):
        report(f"step {step}/{total}: KL summed over layers {sum(losses):.4f}",
               {"step": step, "total_steps": total, "loss": sum(losses)}, force=step == total)

    training = lens.train(loaded, texts, options, out, progress, should_stop=lambda: bool(stop), log=say,
                          earlier=sorted(job.directory.parent.glob("*/artifacts")))
    if training is None:
        raise SystemExit(1)  # the worker records the cancel
    held = training["held_out"]
    say("held-out KL to the final layer (masked positions), raw -> tuned: " + ", ".join(
        f"{r:.3f}->{t:.3f}" for r, t in zip(held["raw"]["masked"]["kl"], held["tuned"]["masked"]["kl"], strict=True)))
    return {"kind": "lens", "steps": training["steps"], "held_out": held, "seconds": training["seconds"]}


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
    report = Reporter(store, job.id)

    def progress(event, state, control):
        if not main_process:
            return
        if event == "epoch":
            h = state.history[-1]
            line = (f"epoch {h['epoch']}/{options.epochs}: train loss {h['train_loss']:.4f}, validation loss "
                    f"{h['val_loss']:.4f}, accuracy {h['val_accuracy']:.4f}, macro-F1 {h['val_macro_f1']:.4f}")
        else:
            line = (f"step {state.step}/{state.total_steps} (epoch {state.epoch}): loss {state.last_loss:.4f}, "
                    f"lr {state.lr:.3g}")
        report(line, {"step": state.step, "total_steps": state.total_steps, "epoch": state.epoch,
                      "epochs": options.epochs, "loss": state.last_loss, "lr": state.lr, "history": state.history},
               force=event == "epoch")

    try:
        out = job.directory / "artifacts"
        say(f"job {job.id}: {job.name}")
        if job.config.get("kind") == "lens":  # checkpoints go straight to the artifacts (to resume), file by file
            out.mkdir(parents=True, exist_ok=True)
            metrics = train_lens(store, job, out)
        elif main_process:  # the artifacts appear whole when the run is complete (analysis.staging)
            options = resolve(job.config)
            with staged(out) as stage:
                metrics = run_options(options, stage, [progress], log=say)
        else:  # another process of a multi-process job: it writes nothing
            metrics = run_options(resolve(job.config), out, [progress], log=say)
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
