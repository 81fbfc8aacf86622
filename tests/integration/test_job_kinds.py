"""The job-kind registry (jobs/kinds.py, issue 35): every kind listed once, the labels the store and the job names
show come from it, and a kind registered in a test (one module's worth of attributes and one registry entry) is
validated by ``submit`` and run by the job process through the same path as the real ones."""

from __future__ import annotations

import json
import os
import signal
import types
from pathlib import Path

import pytest
from pydantic import Field

from analysis.core.inputs import InputError
from analysis.core.options import ModelOptions, Options
from analysis.core.options import path as path_kind
from analysis.tasks import TASKS
from jobs import kinds
from jobs.store import JobStore
from jobs.submit import SubmitError, browser_checked, job_name, submit, submit_sweep, validate
from tests.support.jobs import run_job_process

ROOT = Path(__file__).resolve().parents[2]
MODULES = {"finetune": "analysis.training.job", "lens": "analysis.probe.job", "structure": "analysis.structure.job",
           "tokens": "analysis.tokens.job", "heads": "analysis.tasks.heads"}


def test_the_registry_lists_each_kind_once_in_the_order_the_messages_name_them():
    # every task is a kind too, after the others (unless its kind is a hand-written one: lens train is "lens")
    tasks = tuple(name for name, task in TASKS.items() if (task.kind or name) not in MODULES)
    assert kinds.names() == ("finetune", "lens", "structure", "tokens", "heads", *tasks)
    assert kinds.DEFAULT == "finetune"
    assert {name: kind.__name__ for name, kind in kinds.KINDS.items()} == MODULES | {
        name: type(TASKS[name]).__module__ for name in tasks}
    for name, kind in kinds.KINDS.items():
        assert kind.NAME == name and issubclass(kind.OPTIONS, Options) and isinstance(kind.STAGED, bool)
        assert all(callable(getattr(kind, f)) for f in ("label", "describe", "validate", "run"))
        text = (ROOT / Path(*kind.__name__.split("."))).with_suffix(".py").read_text()
        assert "import jobs" not in text and "from jobs" not in text, f"{kind.__name__} imports jobs"
    for path in (ROOT / "jobs").glob("*.py"):  # jobs/ imports a technique only in kinds.py
        text = path.read_text()
        named = [p for p in ("training", "probe", "structure", "tokens", "heads") if f"from analysis.{p}" in text]
        assert path.name == "kinds.py" or not named, (path.name, named)
    assert kinds.of({}) is kinds.of({"kind": "finetune"}) is kinds.of({"kind": "no such"}) is kinds.KINDS["finetune"]
    with pytest.raises(SubmitError, match=r"unknown job kind 'nope' \(choose from finetune, lens, structure, "
                                          r"tokens, heads, " + ", ".join(tasks) + r"\)"):
        validate({"kind": "nope"})


def test_the_stores_labels_and_the_job_names_come_from_the_registry(tmp_path, monkeypatch):
    store = JobStore(tmp_path / "jobs")
    configs = {"finetune": {"head": "attention", "model": "demo", "train": "demo"},
               "lens": {"kind": "lens", "model": "demo", "corpus": "demo", "steps": 5},
               "structure": {"kind": "structure", "model": "demo", "tasks": "pos,dep", "train": "/d/a.conllu",
                             "test": "/d/b.conllu"},
               "tokens": {"kind": "tokens", "model": "demo", "corpus": "/d/c.txt", "layers": "all", "index": "none"}}
    shown = {"finetune": "attention", "lens": "tuned lens", "structure": "linguistic structure",
             "tokens": "token vectors"}  # as the store showed them before the registry
    for name, config in configs.items():  # the label is the kind's, stored at submit (jobs.submit does this)
        job = store.get(store.submit(config, "cpu", label=kinds.label(config)))
        assert job.label == f"job #{job.id} ({shown[name]}, demo)"
        assert job_name(config).startswith(f"{shown[name]} · demo · ")
    assert job_name(configs["structure"]) == "linguistic structure · demo · pos, dep · a.conllu → b.conllu"
    assert job_name(configs["tokens"]) == "token vectors · demo · c.txt · layers all · no index"
    assert job_name(configs["lens"]) == "tuned lens · demo · demo set · 5 steps"
    monkeypatch.setattr(kinds.KINDS["lens"], "label", lambda config: "a renamed lens")
    assert store.get(2).label == "job #2 (tuned lens, demo)"  # stored: the store reads no technique
    assert job_name(configs["lens"]).startswith("a renamed")
    # a job stored before labels were (no label): its kind's name, or a fine-tuning job's head
    old = store.get(store.submit(configs["structure"], "cpu"))
    assert old.label == f"job #{old.id} (structure, demo)"
    assert store.get(store.submit(configs["finetune"], "cpu")).label.endswith("(attention, demo)")


class FakeOptions(ModelOptions):
    size: int = Field(3, ge=1)
    path: str | None = Field(None, json_schema_extra=path_kind("data"))  # the schema says it names a file


def fake_kind(seen: dict) -> types.SimpleNamespace:
    """A kind as a technique's job.py defines one, recording what it is handed."""

    def validate(config, browser, model_config):
        seen["browser"] = browser
        options = FakeOptions(**{k: v for k, v in config.items() if k != "kind"})
        if browser:
            options = browser(options)
        if options.size == 13:
            raise InputError("size 13: unlucky")
        seen["model_type"] = model_config(options.spec().resolved())[0].model_type
        return {"kind": "fake", **options.to_dict()}, "cpu"

    def run(config, out, control):
        control.listen()
        report = control.reporter()
        control.log(f"fake: size {config['size']}")
        for step in range(1, config["size"] + 1):
            if step == 2 and config.get("path") == "cancel":
                os.kill(os.getpid(), signal.SIGTERM)  # Cancel: recorded, the next check stops the run
            control.check()
            report(f"step {step}", {"step": step, "total_steps": config["size"]}, force=True)
        seen["staged_in"] = out
        (out / "result.json").write_text(json.dumps({"size": config["size"]}))
        return {"kind": "fake", "rows": control.json_safe([{"x": float("nan")}])}

    return types.SimpleNamespace(NAME="fake", OPTIONS=FakeOptions, STAGED=True, label=lambda config: "fake work",
                                 describe=lambda config: [f"size {config.get('size')}"], validate=validate, run=run)


def test_a_kind_registered_in_one_line_is_validated_and_run_through_the_same_path(tmp_path, monkeypatch, capsys):
    seen: dict = {}
    monkeypatch.setitem(kinds.KINDS, "fake", fake_kind(seen))  # the one line in jobs/kinds.py
    store = JobStore(tmp_path / "jobs")

    with pytest.raises(SubmitError, match=r"^size 13: unlucky$"):
        submit({"kind": "fake", "size": 13}, store, start_worker=False)
    with pytest.raises(SubmitError, match="size"):
        submit({"kind": "fake", "size": 0}, store, start_worker=False)  # the schema's bounds, one line
    with pytest.raises(SubmitError, match="choose from finetune, lens, structure, tokens, heads, .*fake"):
        submit({"kind": "fakes"}, store, start_worker=False)
    assert store.list() == []

    job_id = submit({"kind": "fake", "model": "demo", "size": 3}, store, start_worker=False)
    assert seen["browser"] is None and seen["model_type"] == "bert"  # the model's config read as for every kind
    job = store.get(job_id)
    assert job.config["kind"] == "fake" and job.config["size"] == 3 and job.device == "cpu"
    assert job.name == "fake work · demo · size 3" and job.label == f"job #{job_id} (fake work, demo)"

    # from the browser: the kind gets the browser's check (files under the data roots, the model vetted)
    with pytest.raises(SubmitError, match="not under the dashboard's data folders"):
        submit({"kind": "fake", "path": str(tmp_path / "x.txt")}, store, start_worker=False, browser=True)
    assert seen["browser"] is browser_checked
    with pytest.raises(SubmitError, match="size cannot be swept from the browser"):
        submit_sweep({"kind": "fake"}, [{"size": 2}], store, start_worker=False, browser=True)

    assert run_job_process(store, job_id, monkeypatch) == 0
    job = store.get(job_id)
    assert job.status == "succeeded" and job.metrics == {"kind": "fake", "rows": [{"x": None}]}
    assert json.loads((job.artifacts / "result.json").read_text()) == {"size": 3}
    assert seen["staged_in"] != job.artifacts and not seen["staged_in"].exists()  # staged, then renamed into place
    assert job.progress == {"step": 3, "total_steps": 3}
    out = capsys.readouterr().out
    assert f"job {job_id}: fake work · demo · size 3" in out and "fake: size 3" in out

    cancelled = submit({"kind": "fake", "model": "demo", "size": 3, "path": "cancel"}, store, start_worker=False)
    assert run_job_process(store, cancelled, monkeypatch) == 1
    job = store.get(cancelled)
    assert job.status == "queued" and job.progress == {"step": 1, "total_steps": 3}  # the worker records a cancel
    assert not job.artifacts.exists()  # nothing half-written
    assert "stopped: cancelled on request" in capsys.readouterr().out
