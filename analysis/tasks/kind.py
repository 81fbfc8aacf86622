"""Every task as a job kind (:mod:`jobs.kinds`): a task's job JSON is its options (with ``kind``, the task's name),
validated at submit by the same schema the CLI's flags come from, and run by :meth:`analysis.core.task.Task.run`
with a context that reports to the job (its log, its progress, Cancel). The job's artifacts are the files the CLI
writes into ``--out``, the same names and contents."""

from __future__ import annotations

from pathlib import Path

from analysis.core.task import Task, complete_record


class JobContext:
    """A task's reports into its job: the job's log, its progress (``stage``, ``step`` of ``total_steps``, the
    ``fraction`` of the stage done: the jobs table's bar and :meth:`TaskKind.stage`), Cancel as the stop request
    (and at the next progress report, :class:`jobs.run.Cancelled` through ``control.check``), what a stopped run
    keeps under ``LAYERLENS_HOME/cache``."""

    def __init__(self, out: Path, control):
        self.out, self.control = out, control
        self.report = control.reporter()

    def output(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        return self.out

    def log(self, message: str) -> None:
        self.control.log(message)

    def progress(self, stage: str, done: int, total: int) -> None:
        self.control.check()
        self.report(f"{stage}: {done:,} of {total:,}", {"stage": stage, "step": done, "total_steps": total,
                                                        "fraction": done / max(total, 1)}, force=done == total)

    def should_stop(self) -> bool:
        return self.control.stopped()

    def run(self, task: Task, options):
        """``task.run(options, self)``; a run that ends in an exception after Cancel (a task that stopped at its
        ``should_stop``, having kept what it can) ends the job as cancelled."""
        try:
            return task.run(options, self)
        except Exception:
            self.control.check()
            raise

    def keep(self, name: str) -> Path:
        from analysis.core.home import cache_dir

        return cache_dir() / name

    def job(self, job_id: int):
        return self.control.store.find(job_id)

    def jobs(self) -> tuple[list, str]:
        return self.control.store.everything()


def resolve_job_refs(task: Task, values: dict, find_job) -> dict:
    """``values`` (a task's options as given) with ``job:N`` resolved, as every door resolves it: a ``model`` to the
    job's fine-tuned encoder (:func:`analysis.tasks.modelref.resolve`; ``head_from`` the MLM head it lends, where
    the task reads one), a second model (``compare``) to the job's encoder, a series' ``checkpoints`` to the job's
    folder (its saved epochs). ``find_job(N)``: the job
    record or None."""
    from analysis.core.inputs import InputError
    from analysis.tasks.modelref import is_job, resolve

    values = dict(values)
    model = str(values.get("model") or "")
    if is_job(model):
        ref = resolve(model, model, find_job, head_from=values.get("head_from"))
        values["model"] = ref.name
        if "head_from" in task.Options.model_fields:
            values["head_from"] = ref.head_from
    second = str(values.get("compare") or "")  # a second model (heads view --compare job:N)
    if is_job(second):
        values["compare"] = resolve(second, model, find_job).name
    checkpoints = str(values.get("checkpoints") or "")
    if is_job(checkpoints):
        job = find_job(int(checkpoints.split(":", 1)[1]))
        if job is None:
            raise InputError(f"--checkpoints {checkpoints}: no such job (layerlens jobs list)")
        values["checkpoints"] = str(job.artifacts)
    return values


class TaskKind:
    """The job kind of one task (the attributes :mod:`jobs.kinds` lists for a kind)."""

    STAGED = True  # its files appear whole, when the run is complete

    def __init__(self, task: Task):
        self.task, self.NAME, self.OPTIONS, self.OPENED_ON = task, task.name, task.Options, task.opened_on
        self.__name__ = type(task).__module__

    def resolve_refs(self, config: dict, find_job) -> dict:
        """``config`` with its ``job:N`` references resolved (:func:`resolve_job_refs`)."""
        return resolve_job_refs(self.task, config, find_job)

    def options(self, config: dict):
        return self.OPTIONS(**{k: v for k, v in config.items() if k != "kind"})

    def label(self, config: dict) -> str:
        return self.task.help.split(":")[0]

    def stage(self, progress: dict) -> str:
        """``probing layers: 3 of 5``: where a running job of the task is."""
        p = progress or {}
        return f"{p['stage']}: {p.get('step', 0):,} of {p.get('total_steps', 0):,}" if p.get("stage") else ""

    def describe(self, config: dict) -> list[str]:
        source = config.get("input") or config.get("corpus") or config.get("treebank") or config.get("data")
        return [Path(str(source)).name] if source else []

    def validate(self, config: dict, browser, model_config) -> tuple[dict, str]:
        """(the options to store, with ``kind``, the device); the schema's error, a missing file or model, else."""
        options = self.options(config)
        if browser:
            options = browser(options)
        if not self.task.model_flags:  # no model block (a series names its models): its device as asked
            from models.spec import resolve_device

            return {"kind": self.NAME, **options.model_dump(mode="json")}, resolve_device(getattr(options, "device",
                                                                                                  "cpu"))
        spec = options.spec().resolved()
        model_config(spec)
        return {"kind": self.NAME, **options.model_dump(mode="json")}, spec.device

    def run(self, config: dict, out: Path, control) -> dict:
        """The task's run with its files in ``out``; the job's metrics: the files written."""
        control.listen()
        result = JobContext(out, control).run(self.task, self.options(config))
        if result is None:
            raise SystemExit(1)
        files = result.write(out)
        complete_record(out, self.options(config))
        control.log(f"wrote {', '.join(files)}")
        return {"kind": self.NAME, "files": files}
