"""``layerlens jobs``: list, show, cancel and wait for the jobs in the job store (reads the store only: no
torch, no transformers)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from analysis.core.inputs import InputError
from cli.common import UserError
from cli.configfile import read_config_file


def add_jobs_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("submit", help="queue a job (prints its id last) and start a worker if needed")
    s.add_argument("--config", type=Path, required=True, help="a .yaml or .json file of the job's options: its "
                   "\"kind\" (finetune when absent, or any command: probe, atlas, structure, heads with its "
                   "\"action\", tokens, \"tokens index\", compare, ...) and that command's options, named as its "
                   "flags with underscores")
    s.add_argument("--grid", nargs="+", metavar="KEY=V1,V2", help="a sweep: one job per combination, e.g. --grid "
                   "head=cls,attention,lstm lr=2e-5,5e-5 (6 jobs in one group)")
    s.add_argument("--group", help="the sweep's name (default: 'sweep <time>: <keys>')")
    s.add_argument("--name", default="", help="a name for the job list")
    s.add_argument("--no-worker", action="store_true", help="only queue it (a worker started later runs it)")
    ls = sub.add_parser("list", help="the jobs, newest first")
    ls.add_argument("--json", action="store_true", help="every job as JSON (status, progress, metrics, options)")
    for action, text in (("show", "one job as JSON with its progress and, once finished, metrics"),
                         ("cancel", "stop a queued or running job (it keeps its log)"),
                         ("logs", "print a job's log")):
        a = sub.add_parser(action, help=text)
        a.add_argument("id", type=int)
        if action == "show":
            a.add_argument("--json", action="store_true", help="(the output is always JSON)")


def cmd_jobs(args: argparse.Namespace) -> int:
    """Background jobs: submit, list, show, cancel, logs (state under LAYERLENS_HOME)."""
    from jobs import backends
    from jobs.store import JobStore

    store = JobStore()
    if args.action == "submit":
        from jobs.submit import SubmitError, submit, submit_sweep  # loads data and model configs: the heavy action

        config = read_config_file(args.config)
        try:
            if args.grid:
                from analysis.training.options import grid

                group, ids = submit_sweep(config, grid(args.grid), store, args.group, not args.no_worker)
                print(f"queued {len(ids)} jobs in group '{group}':", file=sys.stderr)
            else:
                ids = [submit(config, store, args.name, start_worker=not args.no_worker, group=args.group)]
        except (SubmitError, InputError) as exc:
            raise UserError(f"not queued ({args.config}): {exc}") from None
        for job_id in ids:
            job = store.get(job_id)
            print(f"queued job {job_id} ({job.where}): {job.name}", file=sys.stderr)
            print(job_id)  # one id a line on stdout, for scripts
        return 0
    backends.refresh(store)
    if args.action == "list":
        jobs = store.list()
        if args.json:
            print(json.dumps([j.to_dict() for j in jobs], indent=2, default=str))
            return 0
        if not jobs:
            print(f"no jobs under {store.root}", file=sys.stderr)
        for j in jobs:
            p = j.progress
            done = f"{p.get('step', 0)}/{p.get('total_steps', '?')}" if p else ""
            acc = f"acc {j.metrics['accuracy']:.4f}" if j.metrics and "accuracy" in j.metrics else ""
            print(f"{j.id:>5}  {j.status:<9}  {done:>11}  {acc:<11}  {j.name}  [{j.where}]")
        return 0
    job = store.get(args.id)
    if job is None:
        raise UserError(f"no job {args.id} under {store.root}")
    if args.action == "show":
        print(json.dumps(job.to_dict(), indent=2, default=str))
    elif args.action == "cancel":
        print(f"job {job.id}: {backends.cancel(store, job.id)}"
              + (" (stopping)" if store.get(job.id).status == "running" else ""))
    else:
        print(job.log_path.read_text(errors="replace") if job.log_path.is_file() else "(no log yet)", end="")
    return 0
