"""One job's process: ``python -m jobs.run ID [--root DIR]`` (started by the worker).

Runs the ``finetune`` command on the job's stored options with its artifacts in ``<root>/<ID>/artifacts``,
writes progress (step, epoch, loss, learning rate, per-epoch validation metrics) to the job database at most
once a second and at every epoch, and records ``succeeded`` with the metrics at the end. A failure ends the
process with the traceback in the job's log; the worker records it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path

from jobs.store import JobStore


def config_argv(config: dict, config_path: Path, out: Path) -> list[str]:
    config_path.write_text(json.dumps({k: v for k, v in config.items() if k not in ("out", "num_processes")},
                                      indent=2))
    return ["finetune", "--config", str(config_path), "--out", str(out)]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("job_id", type=int)
    p.add_argument("--root", type=Path)
    a = p.parse_args()
    store = JobStore(a.root)
    job = store.get(a.job_id)
    main_process = os.environ.get("RANK", "0") == "0"
    from analysis.cli import build_parser
    from analysis.cli_finetune import apply_config_file, run_finetune_args

    argv = config_argv(job.config, job.directory / "config.json", job.directory / "artifacts")
    parser = build_parser()
    args = apply_config_file(parser, parser.parse_args(argv), argv)
    last = [0.0]

    def progress(event, state, control):
        if not main_process or (event == "step" and time.time() - last[0] < 1.0):
            return
        last[0] = time.time()
        store.update_progress(job.id, {"step": state.step, "total_steps": state.total_steps, "epoch": state.epoch,
                                       "epochs": args.epochs, "loss": state.last_loss, "lr": state.lr,
                                       "history": state.history})

    from analysis.cli_base import UserError
    from analysis.inputs import InputError
    from models.loading import ModelLoadError

    try:
        metrics = run_finetune_args(args, [progress])
    except (UserError, InputError, ModelLoadError, ValueError) as exc:
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
