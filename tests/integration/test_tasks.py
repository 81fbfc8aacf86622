"""The task contract (issue 45), one test per door, parametrised over every registered task (:mod:`analysis.tasks`):

- its CLI flags are derived from its options schema (every option that is not shared or hidden has its flag, with
  the schema's default; a required option is a required flag), and ``--help`` imports no torch;
- a job of the task (its JSON is its options) writes the same files as the CLI, with the same tables;
- its page opens on the demo model."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.tasks import TASKS
from cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
ARGS = {name: {k: str(ROOT / v) if isinstance(v, str) and (ROOT / v).exists() else v for k, v in task.example.items()}
        for name, task in TASKS.items()}
DEMO = "analysis/data/demo_sentiment.csv"
# run.json facts of when and where (a job runs second)
WHEN = {"seconds", "versions", "model_spec", "cache_hit", "reused"}


def subparser(name: str):
    parser = build_parser()
    for word in name.split():  # "lens classifier": the action under its command
        parser = parser._subparsers._group_actions[0].choices[word]
    return parser


@pytest.fixture
def example_args(name, tmp_path_factory):
    """The task's example options; a task that reads a classifier gets a tiny sequence classifier (the demo model
    is a masked LM)."""
    args = dict(ARGS[name])
    if name == "lens classifier":
        from tests.support.models import save_classifier

        args["model"] = str(save_classifier(tmp_path_factory.mktemp("classifier"), ("negative", "neutral", "positive")))
    if name == "series":
        from tests.support.models import make_series, save_tiny

        root = tmp_path_factory.mktemp("series")
        args["checkpoints"] = str(make_series(save_tiny("bert", root / "base"), root / "further", steps=1))
    if name == "report":  # a finished run to report on: the probe's, on the demo model
        from cli.main import main

        run = tmp_path_factory.mktemp("run") / "probe"
        assert main(["probe", "--model", "demo", "--device", "cpu", "--input", str(ROOT / DEMO), "--out",
                     str(run)]) == 0
        args.update(run_dir=str(run), out=str(run.parent / "report.html"))
    return args


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_flags_are_the_options_schema(name):
    task = TASKS[name]
    actions = {a.dest: a for a in subparser(name)._actions}
    for field, info in task.Options.model_fields.items():
        if field in task.hidden:
            assert field not in actions
            continue
        assert field in actions, f"--{field} missing"
        if info.is_required():
            assert actions[field].required
        elif task.config_file:  # a typed flag overrides the config file, which overrides the schema's default
            assert actions[field].default == argparse.SUPPRESS, field
        elif field not in task.shared:
            assert actions[field].default == info.default, field
    required = {field for field, info in task.Options.model_fields.items() if info.is_required()}
    assert required <= set(task.example) and (set(task.exclusive) & set(task.example) or not task.exclusive), \
        "the task's example names its required options"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_help_imports_no_torch(name):
    code = ("import sys\nfrom cli.main import build_parser\ntry:\n"
            "    build_parser().parse_args([*NAME.split(), '--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)").replace("NAME", repr(name))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False")


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_job_writes_the_files_the_cli_writes(name, example_args, tmp_path, monkeypatch):
    from cli.main import main
    from jobs.store import JobStore
    from jobs.submit import submit
    from tests.support.jobs import run_job_process

    task = TASKS[name]
    out = tmp_path / "cli" / "report.html" if task.output_file else tmp_path / "cli"
    positional = [str(example_args[k]) for k in task.positional]
    flags = [f"--{k.replace('_', '-')}={x}" for k, v in example_args.items() if k not in (*task.positional, "out")
             for x in (v if isinstance(v, list) else [v])]  # a list option is given once per value
    common = ["--model", "demo"] * task.model_flags + ["--device", "cpu"] * ("device" in task.Options.model_fields
                                                                              or task.model_flags)
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home-cli"))  # each door from a cold cache
    assert main([*name.split(), *positional, *common, "--out", str(out), *flags]) == 0
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home-job"))
    store = JobStore(tmp_path / "jobs")
    model = {"model": "demo"} if task.model_flags else {}
    device = {"device": "cpu"} if "device" in task.Options.model_fields else {}
    job_id = submit(task.job_config({**model, **device, **example_args}), store, start_worker=False)
    assert run_job_process(store, job_id, monkeypatch) == 0
    job = store.get(job_id)
    assert job.status == "succeeded", job.error
    cli_files = sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert sorted(p.name for p in job.artifacts.iterdir()) == cli_files
    assert set(job.metrics.get("files", ())) <= {str(p.relative_to(job.artifacts)) for p in job.artifacts.rglob("*")}
    for file in cli_files:
        a, b = tmp_path / "cli" / file, job.artifacts / file
        if a.is_dir():
            continue
        if file.endswith(".csv"):  # timings (build_seconds) left out
            x, y = (pd.read_csv(p).filter(regex=r"^(?!.*_seconds$)") for p in (a, b))
            pd.testing.assert_frame_equal(x, y)
        elif file.endswith(".parquet"):
            pd.testing.assert_frame_equal(pd.read_parquet(a), pd.read_parquet(b))
        elif file == "run.json":
            x, y = (json.loads(p.read_text().replace(str(tmp_path / home), "<home>"))  # the cache's own folder
                    for p, home in ((a, "home-cli"), (b, "home-job")))
            assert x["task"] == y["task"] == name
            kept = [k for k in x if k not in WHEN and not k.endswith("_seconds")]
            assert {k: x[k] for k in kept} == {k: y[k] for k in kept} and set(x) == set(y)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_its_page_opens_on_the_demo_model(name):
    from tests.support.pages import run_page

    task = TASKS[name]
    if name == "report":
        pytest.skip("the report has no page of its own: its door is the button of every page with a result "
                    "(tests/integration/test_report_buttons.py)")
    assert task.page and (ROOT / task.page).is_file()
    at = run_page(task.page)
    assert not at.exception and not at.error, [e.value for e in at.error]


def page_runs(name: str) -> bool:
    from analysis.core.task import Task

    return type(TASKS[name]).compute is not Task.compute


@pytest.mark.parametrize("name", [n for n in sorted(TASKS) if page_runs(n)])
def test_a_pages_run_writes_what_the_cli_writes(name, example_args, tmp_path):
    """A page runs the task's ``compute`` on the sidebar's model and the rows it read (ui.tasks.task_result): for the
    same options and rows, its result writes the files and the run.json that ``run`` (the CLI's and a job's) does."""
    from analysis.core.inputs import read_file
    from analysis.core.task import QuietContext
    from models.loading import load_model

    task = TASKS[name]
    options = task.Options(model="demo", device="cpu", **example_args)
    values = options.model_dump()
    if name.startswith("tokens"):  # the page opens an extraction
        from analysis.tasks.tokens import vectors

        rows = vectors(options, name, QuietContext(tmp_path / "extraction"))
    elif name == "structure":  # the page reads two treebanks (and a labelled set, here none)
        from analysis.core.treebank import read_conllu

        rows = (read_conllu(Path(options.train), options.max_sentences),
                read_conllu(Path(options.test), options.max_sentences), None)
    else:
        rows = read_file(values.get("input") or values["data"], values.get("column") or values.get("text_column"),
                         values.get("pair_column"), label_column=values.get("label_column"))
    page = task.compute(load_model(options.spec()), rows, options, QuietContext())
    (tmp_path / "page").mkdir()
    written = page.write(tmp_path / "page")
    cli = task.run(options, QuietContext(tmp_path / "cli"))
    (tmp_path / "cli").mkdir(exist_ok=True)  # the CLI's door makes it (a task that reads an extraction never asks)
    assert cli.write(tmp_path / "cli") == written
    for file in written:
        a, b = tmp_path / "page" / file, tmp_path / "cli" / file
        if file.endswith(".csv"):
            tol = 1e-3 if name == "neurons" else 1e-4  # the probes' solvers (neurons': saga) converge to their tol
            pd.testing.assert_frame_equal(pd.read_csv(a), pd.read_csv(b), check_exact=False, rtol=tol, atol=tol)
        elif file.endswith(".parquet"):  # a page holds the token rows (sorted) a CLI run streams in batch order
            x, y = (pd.read_parquet(p).sort_values(["text_id", "layer", "position"], ignore_index=True) for p in (a, b))
            pd.testing.assert_frame_equal(x, y)
        elif file == "run.json":
            x, y = (json.loads(p.read_text()) for p in (a, b))
            kept = [k for k in x if k not in WHEN and not k.endswith("_seconds")]
            assert {k: x[k] for k in kept} == {k: y[k] for k in kept} and set(x) == set(y)


def same_tables(a: Path, b: Path, tol: float = 1e-4, ids: bool = True) -> None:
    """The CSV and Parquet tables of two run folders are equal (timings left out; ``ids=False``: the rows' ids too,
    a page's sampled rows being numbered by their source file's rows, their reproduction's by rows.jsonl's)."""
    names = sorted(p.name for p in a.iterdir() if p.suffix in (".csv", ".parquet"))
    assert names == sorted(p.name for p in b.iterdir() if p.suffix in (".csv", ".parquet"))
    for name in names:
        read = pd.read_csv if name.endswith(".csv") else pd.read_parquet
        # timings, and whether an index came from the cache (the second run finds the first's), left out
        skip = r"^(?!.*_seconds$)(?!cached$)" + ("" if ids else r"(?!example_id$)(?!row$)")
        x, y = (read(p / name).filter(regex=skip) for p in (a, b))
        if name.endswith(".parquet") and {"text_id", "layer", "position"} <= set(x.columns):
            x, y = (t.sort_values(["text_id", "layer", "position"], ignore_index=True) for t in (x, y))
        pd.testing.assert_frame_equal(x, y, check_exact=False, rtol=tol, atol=tol)


def run_printed(command: str, out: Path, cwd: Path) -> int:
    """The report's command as printed (``layerlens ...``, ``OUT_DIR`` the folder to write), run in ``cwd``."""
    import os
    import shlex

    from cli.main import main

    words = shlex.split(command)
    assert words[0] == "layerlens" and "OUT_DIR" in words, command
    here = os.getcwd()
    os.chdir(cwd)
    try:
        return main([str(out) if w == "OUT_DIR" else w for w in words[1:]])
    finally:
        os.chdir(here)


@pytest.mark.slow  # every task twice
@pytest.mark.parametrize("name", [n for n in sorted(TASKS) if TASKS[n].writes and not TASKS[n].output_file])
def test_the_reports_command_reproduces_the_run(name, example_args, tmp_path, monkeypatch):
    """Issue 53 item 8: run the task, rebuild its report's "Reproduce" command from its run.json, run that command as
    printed: the same tables, and the command is exact (no note says it is approximate or has a placeholder)."""
    from analysis.core.task import RunRecord
    from analysis.tasks.report import command_for
    from cli.main import main

    task = TASKS[name]
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    flags = [f"--{k.replace('_', '-')}={x}" for k, v in example_args.items() if k not in (*task.positional, "out")
             for x in (v if isinstance(v, list) else [v])]
    common = ["--model", "demo"] * task.model_flags + ["--device", "cpu"] * ("device" in task.Options.model_fields
                                                                              or task.model_flags)
    assert main([*name.split(), *common, "--out", str(tmp_path / "first"), *flags]) == 0
    command, notes = command_for(RunRecord.read(tmp_path / "first").to_dict())
    assert not [n for n in notes if "approximate" in n or "fill in" in n or "names no" in n], notes
    assert run_printed(command, tmp_path / "again", tmp_path) == 0, command
    same_tables(tmp_path / "first", tmp_path / "again", 1e-3 if name == "neurons" else 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["probe", "atlas", "neurons", "lens classifier"])
def test_a_pages_report_command_reproduces_its_run(name, example_args, tmp_path):
    """Issue 53 item 8: a page's run on rows typed or sampled in the browser keeps them as rows.jsonl beside its
    run.json; the report's command names that file, and run there it gives the page's tables."""
    import dataclasses

    from analysis.core.inputs import read_file
    from analysis.core.task import RunRecord, complete_record
    from analysis.tasks.report import command_for
    from models.loading import load_model
    from models.spec import ModelSpec
    from ui.tasks import PageContext, page_options

    task = TASKS[name]
    values = dict(example_args)
    path = values.pop("input", None) or values.pop("data")
    rows = dataclasses.replace(read_file(path, label_column="label" if name != "probe" else None).sample(40, seed=1),
                               source="typed texts")
    options = page_options(task, ModelSpec(values.pop("model", "demo"), device="cpu"), rows, **values)
    ctx = PageContext(lambda *a: None)
    result = task.compute(load_model(options.spec()), rows, options, ctx) if name != "lens classifier" \
        else task.read(options, rows, ctx)
    folder = tmp_path / "page"
    folder.mkdir()
    result.write(folder)
    complete_record(folder, options, rows)
    command, notes = command_for(RunRecord.read(folder).to_dict())
    assert "rows.jsonl" in command and "typed texts" not in command, command
    assert not [n for n in notes if "approximate" in n or "fill in" in n], notes
    assert run_printed(command, tmp_path / "again", folder) == 0, command
    assert any("numbered by their line in rows.jsonl" in n for n in notes), notes
    same_tables(folder, tmp_path / "again", 1e-3 if name == "neurons" else 1e-4, ids=False)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_flag_is_an_option_its_run_reads(name):
    """Issue 53 item 13: a flag the CLI offers is a field of the task's options schema (the run's only argument),
    never one parsed and dropped (duplicate --batch-size, lens classifier --head-from were)."""
    task = TASKS[name]
    dests = {a.dest for a in subparser(name)._actions if a.dest not in ("help", "config", "out")}
    assert dests <= set(task.Options.model_fields), sorted(dests - set(task.Options.model_fields))
