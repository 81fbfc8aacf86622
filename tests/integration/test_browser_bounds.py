"""Issue 53 item 7: a job from the browser cannot fill the disk or run without end. Every number option of every job
kind has a bound a browser's job is held to (the schema's own, or its ``browser_max``), unless the schema marks it
as costing nothing (an index, a seed, a threshold); the saved checkpoints a fine-tuning job asks for are capped; and
a run that saves checkpoints checks the free space first and stops with one line."""

from __future__ import annotations

import shutil

import pytest

from analysis.core.options import browser_bounds, costs_nothing, kind
from cli.main import main
from jobs import kinds
from jobs.submit import SubmitError, submit


def schemas():
    from analysis.tasks import TASKS

    out = {name: k.OPTIONS for name, k in kinds.KINDS.items()}
    out.update({f"heads {a}": TASKS[f"heads {a}"].Options for a in ("stats", "parse", "importance", "view")})
    return out


def test_every_number_option_is_bounded_for_the_browser_or_costs_nothing():
    unbounded = sorted({f"{name}.{field}" for name, schema in schemas().items() for field in schema.model_fields
                        if kind(field, schema) in ("int", "float") and browser_bounds(field, schema)[1] is None
                        and not costs_nothing(field, schema)})
    assert unbounded == [], unbounded


@pytest.mark.parametrize("asked", [{"epochs": 100_000, "save_epoch_checkpoints": True},
                                   {"further_pretrain_steps": 1_000_000, "further_pretrain_save_every": 1},
                                   {"epochs": 60, "save_epoch_checkpoints": True}])
def test_a_browser_job_that_would_save_too_many_checkpoints_is_refused(home, asked):
    with pytest.raises(SubmitError) as refused:
        submit({"kind": "finetune", "train": "demo", **asked}, home, start_worker=False, browser=True)
    assert "\n" not in str(refused.value)
    assert home.list() == []


def test_a_run_that_saves_checkpoints_checks_the_free_space_first(tiny_dirs, tmp_path, capsys, monkeypatch):
    real = shutil.disk_usage
    # 10 kB free: less than one tiny model
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=10_000))
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(tiny_dirs["bert"]), "--train", "demo", "--epochs", "3",
                 "--save-epoch-checkpoints", "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "free" in lines[0] and "checkpoint" in lines[0], err
    assert not out.exists()
