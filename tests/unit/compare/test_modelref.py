"""The one resolver of a second model (analysis/tasks/modelref.py): the pages, ``compare --model`` and a job's
epochs name a model, ``random`` or ``job:N`` the same way; ``random`` works in the CLI too."""

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from analysis.core.inputs import InputError
from analysis.tasks.modelref import ModelRef, resolve
from cli.main import main


def job(tmp_path, status="succeeded", checkpoint=True, head="base-model", label="job #3 (cls, demo)"):
    artifacts = tmp_path / "artifacts"
    if checkpoint:
        (artifacts / "checkpoint" / "encoder").mkdir(parents=True)
    return SimpleNamespace(artifacts=artifacts, metrics={"mlm_head_from": head} if head else {}, status=status,
                           label=label)


def test_a_name_random_and_a_job_resolve_to_what_to_load_whose_head_and_a_label(tmp_path):
    assert resolve("bert-base-uncased", "demo", lambda n: None) == ModelRef("bert-base-uncased", None,
                                                                            "bert-base-uncased")
    assert resolve(" Random ", "demo", lambda n: None) == ModelRef("random:demo", None, "demo with random weights")
    assert resolve("random", "random:demo", lambda n: None).name == "random:demo"  # never random:random:
    record = job(tmp_path)
    ref = resolve("job:3", "demo", {3: record}.get)
    assert ref == ModelRef(str(record.artifacts / "checkpoint" / "encoder"), "base-model", "job #3 (cls, demo)")


def test_every_path_passes_the_check_and_a_job_without_what_is_needed_is_one_line(tmp_path):
    seen = []
    record = job(tmp_path)
    resolve("job:3", "demo", {3: record}.get, allowed=lambda p: seen.append(p) or p)
    assert seen == [str(record.artifacts / "checkpoint" / "encoder"), "base-model"]  # the lent head is checked too

    def refuse(path):
        raise InputError(f"{path} is outside the model folders")

    with pytest.raises(InputError, match=r"^job:3 \(job #3 \(cls, demo\)\): .* outside the model folders"):
        resolve("job:3", "demo", {3: record}.get, allowed=refuse)
    with pytest.raises(InputError, match="no finished job"):
        resolve("job:4", "demo", {3: record}.get)
    with pytest.raises(InputError, match="kept no fine-tuned checkpoint"):
        resolve("job:3", "demo", {3: job(tmp_path / "a", status="running")}.get)
    with pytest.raises(InputError, match="kept no fine-tuned checkpoint"):
        resolve("job:3", "demo", {3: job(tmp_path / "b", checkpoint=False)}.get)
    headless = job(tmp_path / "c", head=None)
    with pytest.raises(InputError, match="an MLM head can read"):
        resolve("job:3", "demo", {3: headless}.get, need_head=True)  # the pages read every model with a head
    assert resolve("job:3", "demo", {3: headless}.get).head_from is None  # the CLI compares without one
    assert resolve("job:3", "demo", {3: headless}.get, head_from="lent").head_from == "lent"  # --head-from


def test_compare_with_random_on_the_command_line_is_the_architectures_random_twin(tiny_dirs, tmp_path):
    data = tmp_path / "rows.csv"
    pd.DataFrame({"text": [f"the film number {i} is {'good' if i % 2 else 'bad'} ." for i in range(12)],
                  "label": ["pos" if i % 2 else "neg" for i in range(12)]}).to_csv(data, index=False)
    model = str(tiny_dirs["bert"])
    out = tmp_path / "out"
    assert main(["compare", "--model", model, "--model", "random", "--data", str(data), "--folds", "2",
                 "--out", str(out), "--device", "cpu"]) == 0
    run = json.loads((out / "run.json").read_text())
    assert f"{model} with random weights" in json.dumps(run)
    summary = pd.read_csv(out / "layer_summary.csv")  # (CKA is ~1 at 12 rows under hidden size 16: not a test)
    assert (summary["recon_accuracy_b"] < summary["recon_accuracy_a"]).all()  # the random head reads nothing back
