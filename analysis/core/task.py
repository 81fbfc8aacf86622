"""The task contract (issue 45, "one task, three doors"): one thing a user can run, defined once, from which its
CLI command, its job and its page form are derived.

A task (:class:`Task`) has four parts:

- ``Options``: one options schema (:class:`analysis.core.options.Options`) of everything a run needs, the model
  block included. It is the run's only argument: the CLI's flags, a job's stored JSON and a page's form are its
  fields;
- ``run(options, ctx)``: the work, reporting through ``ctx`` (:class:`Context`: log, progress, stop, the output
  folder), which the CLI implements with progress bars, a job with the job store, a page with its progress bar
  and Stop button;
- its ``Result``: it writes its files and its ``run.json`` once (:meth:`Result.write`, the one record type
  :class:`RunRecord`) and says what to print (:meth:`Result.summary`);
- ``requires``: checks of the loaded model against the options (an MLM head, labels, ...), run in one place
  (:func:`check_requirements`), each with its one message.

Tasks live in :mod:`analysis.tasks` (its registry); they may import any technique, techniques never import each
other or a task. This module imports neither torch nor transformers: the CLI builds its parsers from the registry.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import Field

from analysis.core.inputs import InputError
from analysis.core.options import ModelOptions, Options, path


class ReadingOptions(ModelOptions):
    """The model block of a task that reads a model's layers: :class:`ModelOptions` and an MLM head to borrow."""

    head_from: str | None = Field(None, json_schema_extra=path("model"),
                                  title="MLM head from", description="read the layers with the pre-trained "
                                  "MLM head of this masked LM (same family, hidden size and vocabulary)")

    def spec(self, device: str | None = None):
        """The model these options name, on ``device`` (a launcher's process's own) when given."""
        from models.spec import ModelSpec

        return ModelSpec(self.model, revision=self.revision, device=device or self.device, dtype=self.dtype,
                         allow_pickle=self.allow_pickle, head_from=self.head_from)


class Context(Protocol):
    """What a running task reports to, and asks: the door it was started from provides it."""

    def output(self) -> Path:
        """The folder the task writes its files into, made when the task first asks (after its inputs are read and
        checked): a staging folder the door renames into place when the run succeeds."""

    def log(self, message: str) -> None:
        """A note for the user (the CLI's stderr, a job's log, a page's caption)."""

    def progress(self, stage: str, done: int, total: int) -> None:
        """Where the run is: ``done`` of ``total`` in ``stage``."""

    def should_stop(self) -> bool:
        """Whether the user asked the run to stop (a page's Stop, a job's Cancel)."""

    def keep(self, name: str) -> Path | None:
        """A folder where a stopped run keeps what it has computed, for the same run started again to go on from (a
        job's: ``LAYERLENS_HOME/cache/<name>``), or None: nothing is kept (the CLI, a page)."""

    def job(self, job_id: int):
        """Job ``job_id`` of the job store (its ``id``, ``label``, ``status``, ``group``, ``config``, ``metrics``,
        ``artifacts``), or an :class:`InputError` naming the store: a task that takes ``job:N`` or a sweep group
        looks jobs up here (the door knows the store; a task never imports ``jobs``)."""

    def jobs(self) -> tuple[list, str]:
        """Every job of the store, and where the store is (for a message)."""


@dataclasses.dataclass
class QuietContext:
    """A context that reports nowhere: for a task run from code (and the tests)."""

    out: Path | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    def output(self) -> Path:
        if self.out is None:
            raise ValueError("this run has no output folder")
        self.out.mkdir(parents=True, exist_ok=True)
        return self.out

    def log(self, message: str) -> None:
        self.notes.append(message)

    def progress(self, stage: str, done: int, total: int) -> None:
        pass

    def should_stop(self) -> bool:
        return False

    def keep(self, name: str) -> Path | None:
        return None

    def job(self, job_id: int):
        raise InputError(f"job:{job_id}: a run from code has no job store (run it from the CLI, a page or a job)")

    def jobs(self) -> tuple[list, str]:
        raise InputError("a run from code has no job store (run it from the CLI, a page or a job)")


MAX_RUN_JSON = 20_000_000  # bytes: a run.json is facts, never data


def read_run(run_dir: Path) -> dict:
    """``run_dir``'s ``run.json`` as a dict, or an :class:`InputError` of one line saying why it is not a run."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise InputError(f"{run_dir} does not exist: give a LayerLens run folder (a run's --out)")
    if not run_dir.is_dir():
        raise InputError(f"{run_dir} is not a folder: give a LayerLens run folder (a run's --out)")
    path = run_dir / "run.json"
    if not path.exists() and not path.is_symlink():
        raise InputError(f"{run_dir} has no run.json: not a LayerLens run folder (a run's --out)")
    from analysis.core.entry import open_plain

    try:  # never through a link, never blocking on a FIFO: a plain file or one line
        f = open_plain(path)
    except OSError:
        raise InputError(f"{path} is not a plain file (a link, a FIFO, or unreadable): not a LayerLens "
                         "run.json") from None
    with f:
        st = os.fstat(f.fileno())
        if st.st_size > MAX_RUN_JSON:
            raise InputError(f"{path} is {st.st_size:,} bytes: too large for a run's record (at most "
                             f"{MAX_RUN_JSON:,}); not a LayerLens run.json")
        data = f.read(MAX_RUN_JSON + 1)
    try:
        record = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise InputError(f"{path} is nested too deeply to be a run's record: not a LayerLens run.json") from None
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text: not a LayerLens run.json") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}): a LayerLens "
                         "run writes it whole; run the task again") from None
    except OSError as exc:
        raise InputError(f"{path} cannot be read: {exc.strerror or exc}") from None
    if not isinstance(record, dict):
        raise InputError(f"{path} holds a JSON {type(record).__name__}, not an object: not a LayerLens run.json")
    return record


@dataclasses.dataclass
class RunRecord:
    """THE ``run.json``: the task's own facts at the top level (as every run.json had them), with the task's name and
    the versions that ran it. :meth:`write` is the one writer of the file."""

    task: str
    facts: dict
    versions: dict | None = None

    def to_dict(self) -> dict:
        from analysis.core.versions import versions

        return {**self.facts, "task": self.task, "versions": self.versions or versions()}

    def write(self, out: Path) -> Path:
        path = Path(out) / "run.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        return path

    @classmethod
    def read(cls, out: Path) -> RunRecord:
        """The record of the run folder ``out`` (:func:`read_run`: one line when it is not a run's)."""
        facts = read_run(out)
        return cls(task=facts.pop("task", ""), versions=facts.pop("versions", None), facts=facts)


ROWS_FILE = "rows.jsonl"  # the rows a page's run read, kept beside its run.json (its report's command names it)


def complete_record(out: Path, options: Options | None, rows=None) -> None:
    """The door's part of ``out/run.json`` (every door calls it after :meth:`Result.write`, so a CLI run, a job and
    a page's report record the same): the ``options`` the run had, where the task's own facts do not hold them
    already, so the command that reproduces it is rebuilt from them (:func:`analysis.report.command.command_line`).
    ``rows``: the rows a page read (typed, uploaded, sampled; a ``TextInputs``), written whole as ``rows.jsonl``
    beside it and named as the run's input, so that its command reproduces the run from the run's folder."""
    path = Path(out) / "run.json"
    if options is None or not path.is_file():
        return
    record = json.loads(path.read_text())
    given = record.get("options") if isinstance(record.get("options"), dict) else None
    values = dict(given) if given is not None else options.model_dump(mode="json", exclude={"out"})
    if rows is not None and getattr(rows, "texts", None) is not None:
        values.update(_keep_rows(Path(out), rows, type(options).model_fields))
        record["rows_file"] = ROWS_FILE
    record["options"] = values
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")


def _keep_rows(out: Path, rows, fields) -> dict:
    """``rows`` as ``out/rows.jsonl`` (``text``, ``pair`` and ``label`` keys) and the options that read it."""
    with open(out / ROWS_FILE, "w", encoding="utf-8") as f:
        for i, text in enumerate(rows.texts):
            row = {"text": text, **({"pair": rows.pairs[i]} if rows.pairs else {}),
                   **({"label": rows.labels[i]} if rows.labels else {})}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    values = {("input" if "input" in fields else "data"): ROWS_FILE,
              ("column" if "column" in fields else "text_column"): "text",
              "pair_column": "pair" if rows.pairs else None, "label_column": "label"}
    return {k: v for k, v in values.items() if k in fields}


class Result(abc.ABC):
    """What a task's run produced."""

    @abc.abstractmethod
    def write(self, out: Path) -> list[str]:
        """Write the files and the ``run.json`` into ``out``; the files' names, in the order written."""

    def shown(self):
        """The table the CLI prints when the run is done (None: nothing)."""
        return None

    def done_line(self, shown_out: str, written: list[str]) -> str:
        """The CLI's last line on stderr: what was written where."""
        return f"wrote {shown_out}/" + ", ".join(written)

    def summary(self) -> str:
        """What the CLI prints on stdout: :meth:`shown`, numbers to 4 decimals."""
        frame = self.shown()
        return "" if frame is None else frame.to_string(index=False, float_format=lambda x: f"{x:.4f}")


Requirement = Callable[[Any, Options], None]  # (the loaded model, the options): raises InputError with its message


class Task(abc.ABC):
    """One runnable analysis (module docstring)."""

    name: ClassVar[str]  # the CLI sub-command and the job kind
    help: ClassVar[str]  # one line: the CLI's help, the job list's description
    writes: ClassVar[str] = ""  # what its output folder holds, in words ("the probe writes layers.csv, ...")
    Options: ClassVar[type[Options]]
    requires: ClassVar[tuple[Requirement, ...]] = ()
    flags: ClassVar[dict[str, str]] = {}  # option -> its flag where the flag is not --option-name (kept for users)
    aliases: ClassVar[dict[str, tuple[str, ...]]] = {}  # option -> more flags for it (tokens neighbours' -k)
    # options whose flags the CLI's shared model parser already adds (the model block, --head-from, --batch-size)
    shared: ClassVar[tuple[str, ...]] = ("model", "revision", "device", "dtype", "allow_pickle", "head_from",
                                         "batch_size")
    hidden: ClassVar[tuple[str, ...]] = ()  # options with no flag (set by a job or a page only)
    model_flags: ClassVar[bool] = True  # False: no model block (a series names its own models), so no shared parser
    positional: ClassVar[tuple[str, ...]] = ()  # options given without a flag, in this order (`report RUN_DIR`)
    out_optional: ClassVar[bool] = False  # True: --out may be left out (the result printed, nothing written)
    output_file: ClassVar[bool] = False  # True: its ``out`` option is one file (written by ``Result.write_file``)
    in_place: ClassVar[bool] = False  # True: it writes into its output folder as it goes and resumes from it (no
    # staging; Ctrl-C asks it to stop at its next step, through ``should_stop``)
    config_file: ClassVar[bool] = False  # True: the CLI also takes --config FILE (.yaml/.json), which flags override
    kind: ClassVar[str | None] = None  # its job kind where that is a hand-written one of another name
    description: ClassVar[str | None] = None  # the CLI's longer description (default: ``help``)
    exclusive: ClassVar[tuple[str, ...]] = ()  # options of which exactly one is given (the CLI: a required group)
    exclusive_optional: ClassVar[tuple[str, ...]] = ()  # options of which at most one is given (an optional group)
    unit: ClassVar[str] = "it"  # what the progress counts (the CLI's bars)
    page: ClassVar[str | None] = None  # the dashboard page that runs it (its form: the same schema)
    opened_on: ClassVar[tuple[str, str] | None] = None  # (page, how): where a finished job of it opens (None: its
    # files and report, on the jobs page)
    example: ClassVar[dict] = {}  # its required options for a run on the bundled demo data (docs, contract tests)
    # across checkpoints (the ``series`` task asks these, so a new per-layer task runs in a series with no branch
    # there): its name for ``series --analysis`` (None: not run across checkpoints), what its series shows, and
    # which of the series' input options it reads
    series_name: ClassVar[str | None] = None
    series_what: ClassVar[str] = ""
    series_inputs: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def run(self, options: Options, ctx: Context) -> Result | None:
        """The work. None in the helper processes of a launcher (only the main process has the result)."""

    def compute(self, loaded, data, options: Options, ctx: Context) -> Result:
        """The work on a model already loaded and inputs already read: what :meth:`run` does once it has read the
        inputs and loaded the model, and what a page runs (the sidebar's model, the page's rows; ``options`` from the
        page's form, its input naming ``data.source``). A task a page runs defines it and ``run`` calls it, so the
        page's result, its files and its ``run.json`` are the CLI's for the same options."""
        raise NotImplementedError(f"the {self.name} task runs from the CLI and as a job only")

    def series_options(self, model: dict, series) -> Options:
        """Its options at one checkpoint of a series: ``model`` the checkpoint's model block (name, revision, head,
        device, dtype, batch size), ``series`` the series' own options (its input files, columns, row limit)."""
        raise NotImplementedError(f"the {self.name} task does not run across checkpoints")

    def layer_metrics(self, folder: Path) -> list[dict]:
        """Its per-layer numbers as long rows (:func:`layer_rows`) from the files its run wrote in ``folder``."""
        raise NotImplementedError(f"the {self.name} task does not run across checkpoints")

    def build(self, values: dict) -> Options:
        """The run's options from the values given (a config file's, then the flags'): the schema's check."""
        return self.Options(**values)

    def job_config(self, values: dict) -> dict:
        """The job JSON of a run with the options ``values``: its kind, and the options."""
        return {"kind": self.kind or self.name, **values}

    def job_options(self, config: dict) -> Options:
        """The task's options a job of its kind ran with (:meth:`job_config` read back; a hand-written kind's
        placement fields left out): what its run.json records, as the CLI's does."""
        return self.Options.from_dict({k: v for k, v in config.items() if k != "kind"})


def layer_rows(frame, metric: str, value: str, low: str | None = None, high: str | None = None) -> list[dict]:
    """Long rows ``{layer, metric, value, low, high}`` of one metric of a per-layer table (a ``layer`` column and
    the named value and interval columns; NaN where a value or a bound is missing)."""
    import math

    def number(row, column):
        return float(row[column]) if column and row[column] == row[column] and row[column] is not None else math.nan
    return [{"layer": int(r["layer"]), "metric": metric, "value": number(r, value), "low": number(r, low),
             "high": number(r, high)} for _, r in frame.iterrows()]


def check_requirements(task: Task, loaded, options: Options) -> None:
    """Every requirement of ``task`` on ``loaded``: the first unmet one raises its own message."""
    for requirement in task.requires:
        requirement(loaded, options)


class Tables(Result):
    """A result a page holds: its tables under the file names the CLI writes (``layers.csv``, ...; a ``.json`` or
    ``.jsonl`` entry is text) and the facts of its ``run.json``, so that a page's result is written, and reported,
    as the same run from the command line would be."""

    def __init__(self, task: str, files: dict, facts: dict):
        self.task, self.files, self.facts = task, files, facts

    def write(self, out: Path) -> list[str]:
        from analysis.core.csvout import to_csv

        for name, content in self.files.items():
            if name.endswith(".csv"):
                to_csv(content, Path(out) / name)
            else:
                (Path(out) / name).write_text(content, encoding="utf-8")
        RunRecord(self.task, self.facts).write(out)
        return [*self.files, "run.json"]
