"""Presentation helpers for the job pages: the table of jobs (the charts are in analysis.plots)."""

from __future__ import annotations

import time

import pandas as pd


def _ago(t: float | None) -> str:
    if not t:
        return ""
    s = time.time() - t
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 else f"{s / 3600:.0f} h ago"


def job_table(jobs) -> pd.DataFrame:
    """One row per job: id, name, status, progress (0..1), epoch, loss, validation accuracy, created, metrics."""
    rows = []
    for j in jobs:
        p = j.progress or {}
        total = p.get("total_steps") or 0
        last = (p.get("history") or [{}])[-1]
        done = 1.0 if j.status == "succeeded" else (p.get("step", 0) / total if total else 0.0)
        rows.append({"id": j.id, "name": j.name, "status": j.status, "progress": done,
                     "epoch": f"{p.get('epoch', '')}/{p.get('epochs', '')}" if p else "",
                     "loss": p.get("loss"), "val accuracy": last.get("val_accuracy"),
                     "accuracy": (j.metrics or {}).get("accuracy"), "macro-F1": (j.metrics or {}).get("macro_f1"),
                     "created": _ago(j.created)})
    return pd.DataFrame(rows)
