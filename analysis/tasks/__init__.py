"""The tasks: each module here is one thing a user can run (:class:`analysis.core.task.Task`), and :data:`TASKS` is
their registry, from which the CLI's sub-commands (:mod:`cli.tasks`) are derived. A task may import any technique;
no technique imports a task. Importing this package imports no torch."""

from __future__ import annotations

from analysis.core.task import Task
from analysis.tasks import registry
from analysis.tasks.atlas import Atlas
from analysis.tasks.classifier_lens import ClassifierLens
from analysis.tasks.compare import Compare
from analysis.tasks.duplicate import Duplicate
from analysis.tasks.finetune import Finetune
from analysis.tasks.heads import TASKS as HEADS
from analysis.tasks.lens_train import LensTrain
from analysis.tasks.neurons import Neurons
from analysis.tasks.probe import Probe
from analysis.tasks.report import Report
from analysis.tasks.series import Series
from analysis.tasks.structure import Structure
from analysis.tasks.tokens import TASKS as TOKENS

TASKS: dict[str, Task] = {task.name: task for task in (Probe(), Atlas(), Duplicate(), Structure(), Finetune(),
                                                          Compare(), Neurons(), *TOKENS, *HEADS.values(), LensTrain(),
                                                          ClassifierLens(), Series(), Report())}

registry.TASKS.update(TASKS)  # the report and the series read the registry there (analysis.tasks.registry)


def get(name: str) -> Task | None:
    return TASKS.get(name)
