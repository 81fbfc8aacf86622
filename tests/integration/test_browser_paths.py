"""Issue 53 item 6: a job from the browser reaches only the data and model roots, whichever option names the path:
every path-typed option of every job kind (derived from its schema, :func:`analysis.core.options.path_fields`) is
submitted outside the roots and refused in one line; nothing is queued."""

from __future__ import annotations

import pytest

from analysis.core.options import path_fields
from jobs import kinds
from jobs.submit import SubmitError, submit

HAND = {"finetune": {"train": "demo"}, "lens": {"corpus": "demo"}, "structure": {},
        "tokens": {"corpus": "analysis/data/demo_sentiment.csv"}}


def cases():
    from analysis.tasks import TASKS

    for name, kind in kinds.KINDS.items():
        if name == "heads":
            for action in ("stats", "parse", "importance", "view"):
                task = TASKS[f"heads {action}"]
                yield f"heads {action}", {"kind": "heads", "action": action, **task.example}, task.Options
        elif name in HAND:
            yield name, {"kind": name, **HAND[name]}, kind.OPTIONS
        else:
            yield name, {"kind": name, **kind.task.example}, kind.OPTIONS


CASES = [(label, config, schema, field) for label, config, schema in cases() for field in path_fields(schema)]


def test_the_path_options_are_found_in_every_schema():
    found = {field for _, _, _, field in CASES}
    assert found >= {"input", "data", "train", "val", "test", "treebank", "corpus", "label_data", "preview_input",
                     "vectors", "lens", "model", "head_from", "compare", "checkpoints", "run_dir", "out"}, found


@pytest.mark.parametrize(("label", "config", "schema", "field"), CASES,
                         ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_every_path_option_outside_the_roots_is_refused(home, label, config, schema, field, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERLENS_MODEL_DIRS", str(tmp_path / "roots"))  # the suite's own: all of /tmp
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    (outside / "passwd").write_text("root:x:0:0\n")
    value = str(outside / "passwd") if path_fields(schema)[field] == "data" else str(outside)
    value = [value] if schema.model_fields[field].annotation in (list[str], list[str] | None) else value
    with pytest.raises(SubmitError) as refused:
        submit({**config, field: value}, home, start_worker=False, browser=True)
    message = str(refused.value)
    assert "\n" not in message and "root:x" not in message, message
    assert home.list() == []


def test_series_and_report_jobs_from_the_browser_are_checked_not_crashed(home, tmp_path, monkeypatch):
    """Issue 53 item 15: a series or report job with browser=True failed with AttributeError (no model block);
    inside the roots it is queued, outside it is one line."""
    from analysis.core.home import exports_dir, layerlens_home

    monkeypatch.setenv("LAYERLENS_MODEL_DIRS", str(tmp_path / "models"))
    (tmp_path / "models").mkdir()
    series = {"kind": "series", "analysis": "probe", "checkpoints": "demo,demo",
              "input": "analysis/data/demo_sentiment.csv"}
    assert submit(series, home, start_worker=False, browser=True) >= 1
    run = layerlens_home() / "runs" / "probe"
    run.mkdir(parents=True)
    (run / "run.json").write_text('{"task": "probe"}')
    report = {"kind": "report", "run_dir": str(run), "out": str(exports_dir() / "r.html")}
    assert submit(report, home, start_worker=False, browser=True) >= 1
    with pytest.raises(SubmitError, match="where a job from the browser may write"):
        submit({**report, "out": str(tmp_path / "elsewhere.html")}, home, start_worker=False, browser=True)
