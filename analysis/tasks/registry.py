"""The task registry as the task modules read it: filled by :mod:`analysis.tasks` once every task is built (it
imports those modules, so they cannot import it back). The report reads a run's task from it (its schema rebuilds
the command line), the series the tasks that run across checkpoints (``Task.series_name``)."""

from __future__ import annotations

TASKS: dict = {}  # name -> Task, the same objects as analysis.tasks.TASKS
