"""``layerlens lens classifier`` end to end on tiny classifiers: a transformers sequence classifier and a finished
fine-tuning job (``job:N``), the tuned lens, and the one-line refusals."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from cli.main import main
from tests.support.models import save_classifier, tiny_tokenizer

WORDS = ["the", "film", "is", "good", "bad", "not", "very", "movie", "fun", "dull"]


@pytest.fixture(scope="module")
def hub_classifier(tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("classifier"))


def labelled(path, n=120, seed=0):
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, rng.integers(3, 9))) for _ in range(n)]
    pd.DataFrame({"text": texts, "label": rng.choice(["neg", "pos"], n)}).to_csv(path, index=False)
    return path


def test_the_last_layer_is_the_models_own_prediction(hub_classifier, tmp_path):
    data = labelled(tmp_path / "rows.csv", 30)
    assert main(["lens", "classifier", "--model", str(hub_classifier), "--data", str(data), "--device", "cpu",
                 "--out", str(tmp_path / "out")]) == 0
    layers = pd.read_csv(tmp_path / "out" / "layers.csv")
    examples = pd.read_csv(tmp_path / "out" / "examples.csv", keep_default_na=False)
    assert layers["layer"].tolist() == [0, 1, 2, 3] and layers["agreement"].iloc[-1] == 1
    model = AutoModelForSequenceClassification.from_pretrained(hub_classifier).eval()
    enc = tiny_tokenizer()(examples["text"].tolist(), padding=True, return_tensors="pt")
    with torch.no_grad():
        own = model(**enc).logits.softmax(-1).numpy()
    np.testing.assert_allclose(examples[["p_l3_neg", "p_l3_pos"]].to_numpy(), own, atol=1e-5)
    assert examples["prediction"].tolist() == [["neg", "pos"][i] for i in own.argmax(-1)]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["task"] == "lens classifier" and run["classes"] == ["neg", "pos"]


def test_a_masked_lm_is_refused_in_one_line(tmp_path, capsys):
    data = labelled(tmp_path / "rows.csv", 10)
    assert main(["lens", "classifier", "--model", "demo", "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "has no sequence-classification head" in err
    assert not (tmp_path / "o").exists()


def test_the_tuned_lens_lowers_the_held_out_kl(hub_classifier, tmp_path, capsys):
    small = labelled(tmp_path / "small.csv", 40)
    assert main(["lens", "classifier", "--model", str(hub_classifier), "--data", str(small), "--tuned",
                 "--out", str(tmp_path / "x")]) == 2
    assert "needs at least 100 rows" in capsys.readouterr().err
    data = labelled(tmp_path / "rows.csv", 150)
    assert main(["lens", "classifier", "--model", str(hub_classifier), "--data", str(data), "--tuned",
                 "--tuned-epochs", "30", "--tuned-lr", "0.01", "--device", "cpu", "--out", str(tmp_path / "t")]) == 0
    table = pd.read_csv(tmp_path / "t" / "tuned.csv")
    assert table["n_held_out"].iloc[0] == 30
    inner = table.iloc[:-1]
    assert (inner["held_out_kl_tuned"] < inner["held_out_kl_raw"]).all(), table
    assert table["held_out_kl_raw"].iloc[-1] == table["held_out_kl_tuned"].iloc[-1] == 0


def test_a_finished_job_is_read_through_its_own_pooling_head(tmp_path, monkeypatch, tiny_dirs):
    from analysis.training.finetune import load_checkpoint
    from jobs.store import JobStore
    from tests.support.jobs import finished_job

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    store = JobStore(tmp_path / "home" / "jobs")
    job = finished_job(store, tiny_dirs["bert"], "attention")
    checkpoint = store.get(job).artifacts / "checkpoint"
    model, tokenizer, meta = load_checkpoint(checkpoint)
    names = sorted(meta["labels"], key=meta["labels"].get)
    data = tmp_path / "rows.csv"
    pd.DataFrame({"text": ["the film is good", "very bad movie", "not fun"], "label": names[:1] * 3}).to_csv(data)
    assert main(["lens", "classifier", "--model", f"job:{job}", "--data", str(data), "--device", "cpu",
                 "--out", str(tmp_path / "out")]) == 0
    examples = pd.read_csv(tmp_path / "out" / "examples.csv", keep_default_na=False)
    enc = tokenizer(examples["text"].tolist(), padding=True, return_tensors="pt")
    with torch.no_grad():
        own = model(enc["input_ids"], enc["attention_mask"]).logits.softmax(-1).numpy()
    last = max(int(c.split("_")[1][1:]) for c in examples.columns if c.startswith("p_l"))
    np.testing.assert_allclose(examples[[f"p_l{last}_{n}" for n in names]].to_numpy(), own, atol=1e-5)
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert "attention" in run["classifier"]


def test_a_job_of_the_lens_and_a_series_resolve_job_refs_as_the_cli_does(tmp_path, monkeypatch, tiny_dirs):
    from analysis.training.finetune import Splits, run_finetune
    from analysis.training.train import FinetuneConfig
    from jobs.store import JobStore
    from jobs.submit import SubmitError, validate
    from models.spec import ModelSpec
    from tests.support.data import synthetic

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    store = JobStore(tmp_path / "home" / "jobs")
    job = store.submit({"model": str(tiny_dirs["bert"]), "train": "x", "head": "cls"}, "cpu", "cls run")
    store.claim("cpu", 10)
    metrics = run_finetune(ModelSpec(str(tiny_dirs["bert"]), device="cpu"), Splits(synthetic(16), synthetic(8, seed=1)),
                           FinetuneConfig(epochs=2, batch_size=8, save_epoch_checkpoints=True),
                           store.directory(job) / "artifacts")
    store.finish(job, "succeeded", metrics=metrics)
    artifacts = store.get(job).artifacts
    options, _ = validate({"kind": "lens classifier", "model": f"job:{job}", "data": str(labelled(tmp_path / "r.csv"))})
    assert options["model"] == str(artifacts / "checkpoint" / "encoder")
    options, _ = validate({"kind": "series", "analysis": "probe", "checkpoints": f"job:{job}", "input": "x.txt"})
    assert options["checkpoints"] == str(artifacts)
    with pytest.raises(SubmitError, match="no finished job"):
        validate({"kind": "lens classifier", "model": "job:99", "data": "x.csv"})
    assert main(["series", "--analysis", "probe", "--checkpoints", f"job:{job}", "--input", str(tmp_path / "r.csv"),
                 "--device", "cpu", "--out", str(tmp_path / "s")]) == 0
    labels = pd.read_csv(tmp_path / "s" / "series.csv")["checkpoint"].unique()
    assert sorted(labels) == ["epoch 0", "epoch 1", "epoch 2"]


@pytest.mark.parametrize("broken", ["layernorm nan", "classifier nan", "float16 overflow"])
def test_non_finite_states_or_logits_are_refused_in_one_line(hub_classifier, tmp_path, capsys, broken):
    """Issue 53 item 2: NaN in the weights or a float16 overflow never becomes a confident class 0 (softmax of
    NaN, then argmax): the lens refuses in one line naming what is not finite, and writes nothing."""
    model = AutoModelForSequenceClassification.from_pretrained(hub_classifier)
    with torch.no_grad():
        if broken == "layernorm nan":
            model.bert.encoder.layer[1].output.LayerNorm.weight[0] = float("nan")
        elif broken == "classifier nan":
            model.classifier.weight[0, 0] = float("nan")
        else:
            model.bert.embeddings.LayerNorm.weight.mul_(1e5)
    folder = tmp_path / "broken"
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    data = labelled(tmp_path / "rows.csv", 20)
    extra = ["--dtype", "float16"] if broken == "float16 overflow" else []
    assert main(["lens", "classifier", "--model", str(folder), "--data", str(data), "--device", "cpu",
                 "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "not finite" in lines[0], lines[0]
    expected = {"layernorm nan": "hidden state 2", "classifier nan": "classifier's logits",
                "float16 overflow": "hidden state 0"}[broken]
    assert expected in lines[0] and ("--dtype float32" in lines[0]) == (broken == "float16 overflow"), lines[0]
    assert not (tmp_path / "out").exists()


def test_a_jobs_classifier_is_read_on_its_held_out_rows_by_default(tmp_path, tiny_dirs, capsys, monkeypatch):
    """Issue 53 item 9: without --data, a LayerLens run's classifier is read on the rows it was scored on and never
    trained on, so its last layer's accuracy is the run's own held-out accuracy (predictions.csv); rows it trained on
    are read only when asked for, with a warning that counts them."""
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    demo = "analysis/data/demo_sentiment.csv"
    run = tmp_path / "run"
    assert main(["finetune", "--model", str(tiny_dirs["bert"]), "--train", demo, "--epochs", "1",
                 "--device", "cpu", "--out", str(run)]) == 0
    predictions = pd.read_csv(run / "predictions.csv", keep_default_na=False)
    capsys.readouterr()
    assert main(["lens", "classifier", "--model", str(run / "checkpoint"), "--device", "cpu",
                 "--out", str(tmp_path / "held")]) == 0
    assert "trained on" not in capsys.readouterr().err
    layers = pd.read_csv(tmp_path / "held" / "layers.csv")
    assert layers["n"].iloc[-1] == len(predictions)
    assert layers["accuracy"].iloc[-1] == pytest.approx((predictions["label"] == predictions["prediction"]).mean())
    record = json.loads((tmp_path / "held" / "run.json").read_text())
    assert "held out" in record["data"] and record["rows_trained_on"] == 0
    assert main(["lens", "classifier", "--model", str(run / "checkpoint"), "--data", demo, "--device", "cpu",
                 "--out", str(tmp_path / "all")]) == 0
    err = capsys.readouterr().err
    total = len(pd.read_csv(demo))
    trained = total - len(predictions)
    assert f"{trained:,} of the {total:,} rows are rows the classifier was trained on" in err, err
    assert json.loads((tmp_path / "all" / "run.json").read_text())["rows_trained_on"] == trained
