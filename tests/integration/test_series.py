"""``layerlens series`` on a series the project makes itself: a few steps of further pre-training of a tiny model,
saved at each step. The first and last checkpoints' rows are the single-checkpoint analyses' own; the cache makes a
series resume and grow; checkpoints of another architecture or tokenizer are refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis.core.inputs import InputError
from analysis.series import checkpoints
from analysis.series.checkpoints import parse
from analysis.training.runs import recorded_head
from cli.main import main
from tests.support.models import make_series, save_tiny

DATA = Path(__file__).resolve().parents[2] / "analysis" / "data" / "demo_sentiment.csv"


@pytest.fixture(scope="module")
def series_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("series")
    return make_series(save_tiny("bert", root / "base"), root / "further")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))


def series(out: Path, *args: str) -> int:
    return main(["series", *args, "--device", "cpu", "--out", str(out)])


def test_the_first_and_last_checkpoints_are_the_single_analyses(series_dir, tmp_path):
    assert series(tmp_path / "s", "--analysis", "probe", "--checkpoints", str(series_dir), "--input", str(DATA)) == 0
    table = pd.read_csv(tmp_path / "s" / "series.csv")
    assert list(table.columns) == ["checkpoint", "step", "layer", "metric", "value", "interval", "interval_low",
                                   "interval_high"]
    assert list(dict.fromkeys(table["checkpoint"])) == ["step-0", "step-1", "step-2"]
    for name in ("step-0", "step-2"):
        assert main(["probe", "--model", str(series_dir / name), "--input", str(DATA), "--device", "cpu", "--out",
                     str(tmp_path / name)]) == 0
        single = pd.read_csv(tmp_path / name / "layers.csv")
        mine = table[table["checkpoint"] == name]
        accuracy = mine[mine["metric"] == "accuracy"]
        assert accuracy["layer"].tolist() == single["layer"].tolist()
        assert accuracy["value"].tolist() == single["accuracy"].tolist()
        mean = mine[mine["metric"] == "sentence_mean"]
        assert mean["value"].tolist() == single["sentence_mean"].tolist()
        assert mean["interval_low"].tolist() == single["ci_low"].tolist()
        assert (mean["interval_low"] <= mean["value"]).all() and (mean["value"] <= mean["interval_high"]).all()
    assert (tmp_path / "s" / "checkpoints" / "00-step-0" / "layers.csv").is_file()
    assert json.loads((tmp_path / "s" / "run.json").read_text())["task"] == "series"


def test_a_series_resumes_and_grows_from_its_cache(series_dir, tmp_path, capsys):
    args = ["--analysis", "heads", "--checkpoints", str(tmp_path / "grown"), "--input", str(DATA)]
    shutil.copytree(series_dir, tmp_path / "grown", ignore=shutil.ignore_patterns("step-2"))
    assert series(tmp_path / "a", *args) == 0
    capsys.readouterr()
    shutil.copytree(series_dir / "step-2", tmp_path / "grown" / "step-2")
    assert series(tmp_path / "b", *args) == 0
    assert "2 of 3 checkpoints read from the cache (step-0, step-1)" in capsys.readouterr().err
    a, b = (pd.read_csv(tmp_path / x / "series.csv") for x in "ab")
    pd.testing.assert_frame_equal(a, b[b["checkpoint"] != "step-2"].reset_index(drop=True))
    assert main(["heads", "stats", "--model", str(tmp_path / "grown" / "step-2"), "--input", str(DATA), "--device",
                 "cpu", "--out", str(tmp_path / "single")]) == 0
    single = pd.read_csv(tmp_path / "single" / "heads.csv")
    last = b[(b["checkpoint"] == "step-2") & (b["metric"] == "head 1 entropy")]
    assert last["value"].tolist() == single[single["head"] == 1]["entropy"].tolist()


def test_the_atlas_series_has_cka_one_to_itself_at_the_end(series_dir, tmp_path):
    assert series(tmp_path / "s", "--analysis", "atlas", "--checkpoints", str(series_dir), "--input", str(DATA)) == 0
    table = pd.read_csv(tmp_path / "s" / "series.csv")
    cka = table[table["metric"] == "cka_to_final"]
    last = cka[cka["checkpoint"] == "step-2"]
    assert last["value"].iloc[1:].round(6).tolist() == [1.0] * (len(last) - 1)
    assert cka[cka["layer"] == 0]["value"].isna().all()  # [CLS] at the embeddings: one vector for every row
    assert "constant" in json.loads((tmp_path / "s" / "run.json").read_text())["undefined"]
    assert set(table["metric"]) == {"probe_accuracy", "silhouette", "cka_to_final"}


@pytest.mark.parametrize("other", ["architecture", "tokenizer"])
def test_checkpoints_of_another_model_are_one_line(series_dir, tmp_path, capsys, other):
    mixed = tmp_path / "mixed"
    shutil.copytree(series_dir, mixed)
    if other == "architecture":
        shutil.rmtree(mixed / "step-2")
        save_tiny("distilbert", mixed / "step-2", copy_steps=0)
    else:
        from transformers import BertTokenizerFast

        from tests.support.models import tiny_tokenizer

        vocab = dict(tiny_tokenizer().get_vocab())
        vocab["zzz"] = vocab.pop(max(vocab, key=vocab.get))  # one word of the same size differs
        for name in ("tokenizer.json", "vocab.txt"):
            (mixed / "step-2" / name).unlink(missing_ok=True)
        BertTokenizerFast(vocab=vocab, do_lower_case=True).save_pretrained(mixed / "step-2")
    assert series(tmp_path / "o", "--analysis", "probe", "--checkpoints", str(mixed), "--input", str(DATA)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"checkpoint step-2 differs from step-0 in its {other}" in err


def test_steps_are_read_from_names_and_a_name_without_one_is_refused(tmp_path):
    assert [checkpoints.step_of(n) for n in ("step_20k", "checkpoint-500", "epoch 3", "main", "step-1.5M")] == \
        [20_000, 500, 3, None, 1_500_000]
    points = parse("org/model@step_2k,step_20k,step_200", recorded_head)
    assert [(p.label, p.step, p.revision) for p in points] == [("step_2k", 2000, "step_2k"),
                                                              ("step_20k", 20000, "step_20k"),
                                                              ("step_200", 200, "step_200")]
    for name in ("step-10", "step-2", "final"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    with pytest.raises(InputError, match="cannot order final"):
        parse(str(tmp_path), recorded_head)
    shutil.rmtree(tmp_path / "final")
    assert [p.label for p in parse(str(tmp_path), recorded_head)] == ["step-2", "step-10"]
    with pytest.raises(InputError, match="a series needs at least two"):
        parse("org/model@main", recorded_head)


def test_a_jobs_saved_epochs_are_a_series(tmp_path, tiny_dirs):
    from analysis.training.finetune import Splits, run_finetune
    from analysis.training.train import FinetuneConfig
    from models.spec import ModelSpec
    from tests.support.data import synthetic

    artifacts = tmp_path / "artifacts"
    run_finetune(ModelSpec(str(tiny_dirs["bert"]), device="cpu"), Splits(synthetic(16), synthetic(8, seed=1)),
                 FinetuneConfig(epochs=2, batch_size=8, save_epoch_checkpoints=True), artifacts)
    points = parse(str(artifacts), recorded_head)
    assert [(p.label, p.step) for p in points] == [("epoch 0", 0), ("epoch 1", 1), ("epoch 2", 2)]
    assert points[0].model == str(tiny_dirs["bert"])  # the model it was fine-tuned from
    assert all(p.head_from == str(tiny_dirs["bert"]) for p in points[1:])
    assert series(tmp_path / "s", "--analysis", "probe", "--checkpoints", str(artifacts), "--input", str(DATA)) == 0


def test_a_cli_runs_further_pretraining_is_found_after_its_out_is_renamed(tmp_path, tiny_dirs):
    """metrics.json names the further pre-trained head relative to the run's folder: the CLI stages --out and
    renames it, so an absolute path recorded during the run would name a folder that no longer exists."""
    from analysis.training.runs import fine_tuned

    out = tmp_path / "run"
    assert main(["finetune", "--model", str(tiny_dirs["bert"]), "--train", str(DATA), "--epochs", "2",
                 "--batch-size", "16", "--further-pretrain-steps", "2", "--save-epoch-checkpoints", "--device", "cpu",
                 "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["mlm_head_from"] == "further_pretrained"
    assert fine_tuned(out, metrics)[1] == str(out / "further_pretrained")
    assert all(p.head_from == str(out / "further_pretrained") for p in parse(str(out), recorded_head)[1:])
    assert series(tmp_path / "s", "--analysis", "probe", "--checkpoints", str(out), "--input", str(DATA)) == 0
    # a run from before the relative record named its staging folder: its own further_pretrained is found
    metrics["mlm_head_from"] = str(tmp_path / ".run.staging-1-abc" / "further_pretrained")
    (out / "metrics.json").write_text(json.dumps(metrics))
    assert fine_tuned(out, metrics)[1] == str(out / "further_pretrained")
    assert parse(str(out), recorded_head)[0].model == str(out / "further_pretrained")


def _texts(folder: Path, rows: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "texts.txt").write_text("\n".join(rows) + "\n")
    return folder / "texts.txt"


def test_a_series_keys_its_cache_on_the_inputs_content_not_their_path(series_dir, tmp_path, monkeypatch, capsys):
    """Issue 53 item 1: the same command in two folders whose texts.txt differ (a relative path), then the file
    edited in place: each series holds the numbers of its own texts, as the single probe gives them."""
    from analysis.core.inputs import read_file

    rows = read_file(DATA).texts
    args = ["--analysis", "probe", "--checkpoints", str(series_dir), "--input", "texts.txt"]
    for name, chosen in (("A", rows[:40]), ("B", rows[40:80]), ("B-edited", rows[80:120])):
        folder = tmp_path / name.split("-")[0]
        _texts(folder, chosen)
        monkeypatch.chdir(folder)
        assert series(tmp_path / f"out-{name}", *args) == 0
        assert main(["probe", "--model", str(series_dir / "step-2"), "--input", "texts.txt", "--device", "cpu",
                     "--out", str(tmp_path / f"single-{name}")]) == 0
        single = pd.read_csv(tmp_path / f"single-{name}" / "layers.csv")
        table = pd.read_csv(tmp_path / f"out-{name}" / "series.csv")
        mine = table[(table["checkpoint"] == "step-2") & (table["metric"] == "accuracy")]
        assert mine["value"].tolist() == single["accuracy"].tolist(), name
        decoded = pd.read_csv(tmp_path / f"out-{name}" / "checkpoints" / "02-step-2" / "decoded.csv")
        pd.testing.assert_frame_equal(decoded, pd.read_csv(tmp_path / f"single-{name}" / "decoded.csv"))
    assert "read from the cache" not in capsys.readouterr().err


def _entry(home: Path) -> list[Path]:
    return sorted(p for p in (home / "cache" / "series").iterdir() if p.is_dir())


@pytest.mark.parametrize("damage", ["cut", "edited", "missing", "link", "extra link"])
def test_a_damaged_series_entry_is_computed_again_with_one_warning(series_dir, tmp_path, caplog, damage):
    """Issue 53 item 1: an entry cut, edited, missing a file or holding a link is never read as truth and never
    stuck; the output never holds a link's target."""
    import logging

    args = ["--analysis", "probe", "--checkpoints", str(series_dir), "--input", str(DATA)]
    assert series(tmp_path / "first", *args) == 0
    entries = _entry(tmp_path / "home")
    assert len(entries) == 3
    layers = entries[0] / "layers.csv"
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:secret\n")
    if damage == "cut":
        layers.write_bytes(layers.read_bytes()[:40])
    elif damage == "edited":
        layers.write_text(layers.read_text().replace("0.", "5.", 1))
    elif damage == "missing":
        layers.unlink()
    elif damage == "link":
        layers.unlink()
        layers.symlink_to(secret)
    else:
        (entries[0] / "passwd.csv").symlink_to(secret)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert series(tmp_path / "second", *args) == 0
    warned = [r for r in caplog.records if "computed again" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    first, second = (pd.read_csv(tmp_path / x / "series.csv") for x in ("first", "second"))
    pd.testing.assert_frame_equal(first, second)
    for path in (tmp_path / "second").rglob("*"):
        assert not path.is_symlink()
        if path.is_file():
            assert "secret" not in path.read_text(errors="replace"), path
    assert series(tmp_path / "third", *args) == 0  # the entry made again is whole: read, not stuck
    pd.testing.assert_frame_equal(first, pd.read_csv(tmp_path / "third" / "series.csv"))


def test_the_series_choices_are_the_registry_s_seriesable_tasks():
    """Issue 54: the series asks each task (Task.series_options, layer_metrics) instead of branching by name; the
    literal the CLI's choices need at import time is the registry's list."""
    from analysis.tasks.series import ANALYSES, seriesable

    assert tuple(seriesable()) == ANALYSES
    for task in seriesable().values():
        assert task.series_what and task.series_inputs
