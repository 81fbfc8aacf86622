"""jobs.submit at function level: what a browser may submit (issue 25)."""

import pytest

from analysis.core.inputs import InputError
from analysis.training import options as schema
from jobs.store import JobStore
from jobs.submit import SubmitError, submit, submit_sweep, validate


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    return JobStore(tmp_path / "home" / "jobs")


def private_csv(path):
    path.write_text("text,label\n" + "".join(f"private text {i},secret{i % 2}\n" for i in range(12)))
    return path


def test_a_browser_sweep_point_with_data_outside_the_roots_is_refused(store, tmp_path, monkeypatch):
    """Defence in depth (issue 25.1): even were ``train`` a key a browser sweep may vary, the merged point goes
    through the data-root check before anything is read or queued."""
    private = private_csv(tmp_path / "private.csv")
    monkeypatch.setattr(schema, "SWEEPABLE", (*schema.SWEEPABLE, "train", "val", "test"))
    config = {"model": "demo", "train": "demo", "epochs": 1}
    for key in ("train", "val", "test"):
        with pytest.raises(SubmitError, match="not under the dashboard's data folders"):
            submit_sweep(config, [{"head": "cls"}, {key: str(private)}], store, start_worker=False, browser=True)
    assert store.list() == []
    # the same options from the CLI (its user is trusted) are queued
    submit_sweep(config, [{"train": str(private)}], store, start_worker=False)
    assert len(store.list()) == 1


def test_a_browser_sweep_may_vary_only_the_training_options(store):
    config = {"model": "demo", "train": "demo", "epochs": 1}
    for point in ({"model": "bert-base-uncased"}, {"allow_pickle": True}, {"backend": "slurm"},
                  {"label_column": "text"}):
        with pytest.raises(SubmitError, match="cannot be swept from the browser"):
            submit_sweep(config, [point], store, start_worker=False, browser=True)
    assert store.list() == []
    _, ids = submit_sweep(config, [{"head": "cls", "lr": "1e-4"}], store, start_worker=False, browser=True)
    assert len(ids) == 1


def test_a_browser_job_is_checked_whole(store, tmp_path):
    private = private_csv(tmp_path / "private.csv")
    for bad in ({"train": str(private)}, {"train": "demo", "test": str(private)},
                {"train": "demo", "allow_pickle": True}):
        with pytest.raises(SubmitError):
            submit({"model": "demo", **bad}, store, start_worker=False, browser=True)
    assert store.list() == []
    with pytest.raises(SubmitError, match="not under the dashboard's data folders"):
        validate({"kind": "lens", "model": "demo", "corpus": str(private)}, browser=True)


def test_grid_refuses_keys_outside_the_allowed():
    with pytest.raises(InputError, match="cannot be swept from the browser"):
        schema.grid(["train=/etc/passwd"], allowed=schema.SWEEPABLE)
    assert schema.grid(["heads=cls,attention"], allowed=schema.SWEEPABLE) == [{"head": "cls"}, {"head": "attention"}]


def test_what_run_time_refuses_is_refused_at_submit(store, tmp_path):
    """Issue 25.10: a seed numpy cannot take, a validation fraction that leaves a class without a row in the
    held-out or the training part (0.001 or 0.999 of the demo set's 381 rows, 3 classes): not queued, one message
    naming the option; the schema's bound holds for config files and the CLI too."""
    demo = {"model": "demo", "train": "demo", "epochs": 1}
    for bad, message in (({"seed": 2**32}, "seed"), ({"seed": 2**40}, "seed"),
                         ({"seed": 2**32 - 2, "folds": 3}, "seed"),
                         ({"val_fraction": 0.999}, "val_fraction"),
                         ({"val_fraction": 0.001}, r"val_fraction \(validation fraction\) 0.001"),
                         ({"val_fraction": 0.001, "folds": 3, "early_stopping": True}, "validation"),
                         ({"folds": 7, "train": str(private_csv(tmp_path / "p.csv"))}, "too few")):
        with pytest.raises(SubmitError, match=message) as err:
            submit({**demo, **bad}, store, start_worker=False)
        assert "\n" not in str(err.value)
    with pytest.raises(InputError, match=r"seed: must be at most 4294967295"):
        schema.resolve({"seed": 2**32})
    assert store.list() == []
    # the edges that run: the largest seed; a fraction the data allows; any fraction when a validation set is given
    for good in ({"seed": 2**32 - 1}, {"seed": 2**32 - 3, "folds": 3}, {"val_fraction": 0.01},
                 {"val_fraction": 0.999, "val": "demo"}):
        submit({**demo, **good}, store, start_worker=False)
    assert len(store.list()) == 4


def test_the_run_refuses_the_same_fractions(tmp_path):
    """What submit now refuses is what the run itself refuses (the same analysis.training.finetune.split_off)."""
    from analysis.core.inputs import read_split
    from analysis.training.finetune import split_off

    rows = read_split("demo", "text", None, "label")
    for fraction in (0.999, 0.001):
        with pytest.raises(InputError, match="cannot hold out"):
            split_off(rows, fraction, 0)
