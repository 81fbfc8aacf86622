"""Comparison of a fine-tuning job's epochs with its base (analysis.tasks.epochs) and of a sweep group: each number
against a plain computation on a tiny job run in-process."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binomtest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from transformers import AutoModel, AutoTokenizer

from analysis.compare.run import CompareConfig
from jobs.store import JobStore
from tests.support.data import synthetic
from tests.unit.training.test_training import write_tsv


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    return JobStore(tmp_path / "home" / "jobs")


def run_job(store, bert4, tmp_path, name="run", group=None, seed=0, **options):  # noqa: F811
    """A finished job as the worker leaves it (run_options in this process), 3 epochs on a tiny BERT."""
    from analysis.training.finetune import run_options
    from analysis.training.options import resolve

    train = write_tsv(tmp_path / "train.tsv", synthetic(32))
    val = write_tsv(tmp_path / "val.tsv", synthetic(16, seed=1))
    resolved = resolve({"model": str(bert4), "train": str(train), "val": str(val), "head": "cls", "epochs": 3,
                        "batch_size": 8, "lr": 3e-3, "seed": seed, **options})
    job_id = store.submit(resolved.to_dict(), "cpu", name, group)
    store.claim("cpu", 10)
    store.finish(job_id, "succeeded", metrics=run_options(resolved, store.directory(job_id) / "artifacts"))
    return store.get(job_id)


def plain_cls(model_dir, texts):
    """[CLS] of every hidden state, (L + 1, n, hidden): transformers alone."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, add_pooling_layer=False).eval()
    with torch.no_grad():
        states = [model(**tok(t, return_tensors="pt"), output_hidden_states=True).hidden_states for t in texts]
    return np.stack([np.stack([s[layer][0, 0].numpy() for s in states]) for layer in range(len(states[0]))])


def plain_cka(x, y):
    x, y = x - x.mean(0), y - y.mean(0)
    return np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))


def plain_probe(x, labels, folds, seed):
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    return cross_val_predict(probe, x, labels, cv=StratifiedKFold(folds, shuffle=True, random_state=seed))


@pytest.mark.slow
def test_a_jobs_epochs_against_its_base_from_the_vectors_on_disk(home, bert4, tmp_path):  # noqa: F811
    from analysis.tasks.epochs import compare_epochs, validation_rows
    from analysis.training.runs import job_run
    from models.loading import ModelSpec, load_model

    job = run_job(home, bert4, tmp_path)
    run = job_run(job.artifacts, job.config, job.metrics, job.label)
    rows = validation_rows(run)
    meta = json.loads((job.artifacts / "epochs" / "1" / "val_ids.json").read_text())
    assert list(rows.ids) == meta["example_id"]
    assert [job.metrics["labels"][y] for y in meta["label"]] == list(rows.labels)
    base = load_model(ModelSpec(str(bert4), device="cpu"))
    config = CompareConfig(folds=2)
    result = compare_epochs(base, run, config, checkpoint=load_model(run.checkpoint_spec()))
    s = result.layer_summary
    assert s["epoch"].tolist() == [e for e in (1, 2, 3) for _ in range(5)]
    assert set(s["model_b"]) == {f"{job.label} · epoch {e}" for e in (1, 2, 3)}
    a = plain_cls(bert4, rows.texts)
    labels = np.asarray(rows.labels)
    for epoch in (1, 2, 3):
        b = np.load(job.artifacts / "epochs" / str(epoch) / "val_cls.npy").astype(np.float32)
        part = s[s["epoch"] == epoch].set_index("layer")
        for layer in range(1, 5):  # layer 0's [CLS] is the same for every row: no CKA
            assert part.at[layer, "cka"] == pytest.approx(plain_cka(a[layer].astype(np.float64),
                                                                     b[layer].astype(np.float64)), abs=1e-5)
            right_a = plain_probe(a[layer], labels, 2, 0) == labels
            right_b = plain_probe(b[layer], labels, 2, 0) == labels
            assert part.at[layer, "probe_accuracy_b"] == pytest.approx(right_b.mean())
            assert part.at[layer, "probe_accuracy_a"] == pytest.approx(right_a.mean())
            ci = binomtest(int(right_b.sum()), len(right_b)).proportion_ci(method="wilson")
            assert (part.at[layer, "probe_ci_low_b"], part.at[layer, "probe_ci_high_b"]) == pytest.approx(
                (ci.low, ci.high))
    # the last epoch's vectors are the final checkpoint's (no early stopping), in the rows' order
    final = plain_cls(job.artifacts / "checkpoint" / "encoder", rows.texts)
    last = np.load(job.artifacts / "epochs" / "3" / "val_cls.npy").astype(np.float32)
    np.testing.assert_allclose(last, final, atol=2e-2 * np.abs(final).max())
    # reconstruction: only the epoch whose weights the checkpoint holds, read by the base's head
    assert result.info["checkpoint_epoch"] == 3
    assert s.loc[s["epoch"] < 3, "recon_accuracy_b"].isna().all()
    assert s.loc[s["epoch"] == 3, "recon_accuracy_b"].notna().all()
    assert result.info["mlm_heads"][f"{job.label} · epoch 3"] == f"from {bert4}"
    # one map per layer for the base and every epoch: the base's points are the same whichever epoch is shown
    c = result.coords
    base_points = c[c["model"] == base.spec.name]
    for layer in range(5):
        per_epoch = [base_points[(base_points["layer"] == layer) & (base_points["epoch"] == e)][["x", "y"]].to_numpy()
                     for e in (1, 2, 3)]
        np.testing.assert_allclose(per_epoch[0], per_epoch[2])
    assert len(result.movers) == 3 * 5 * len(rows)
    # the job's own head at the checkpoint's epoch: what it wrote to predictions.csv (it scored these rows)
    saved = pd.read_csv(job.artifacts / "predictions.csv", keep_default_na=False).set_index("example_id")
    m = result.movers
    last = m[(m["epoch"] == 3) & (m["layer"] == 4)].set_index("example_id")
    assert last.loc[saved.index, "head_prediction_b"].tolist() == saved["prediction"].tolist()
    assert m.loc[m["epoch"] < 3, "head_prediction_b"].isna().all()


def test_the_epochs_map_is_one_pca_of_the_base_and_every_epoch_pooled():
    from scipy.linalg import orthogonal_procrustes

    from analysis.compare.run import aligned_maps, aligned_maps_many
    from analysis.core.projection import exact_pca

    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 20, 6))
    bs = [a + 0.3 * rng.standard_normal(a.shape) for _ in range(2)]
    maps = aligned_maps_many(a, bs, [0, 1, 2])
    # each epoch rotated onto the base (the rotation its movement is measured after), then one PCA of them pooled
    pooled = exact_pca(np.concatenate([a[0], *[b[0] @ orthogonal_procrustes(b[0], a[0])[0] for b in bs]]))
    np.testing.assert_allclose(np.concatenate(maps[0]), pooled, atol=1e-10)
    # one B: the pair's map
    for got, want in zip(aligned_maps_many(a, bs[:1], [0, 1, 2]), aligned_maps(a, bs[0], [0, 1, 2]), strict=True):
        np.testing.assert_allclose(np.concatenate(got), np.concatenate(want), atol=1e-10)


@pytest.mark.slow
def test_the_cli_compares_a_jobs_epochs_and_a_group_and_refuses_in_one_line(home, bert4, tmp_path, capsys):  # noqa: F811
    from cli.main import main

    job = run_job(home, bert4, tmp_path, group="g1")
    run_job(home, bert4, tmp_path, group="g1", seed=1)
    out = tmp_path / "epochs"
    assert main(["compare", "--job", str(job.id), "--out", str(out), "--folds", "2"]) == 0
    summary = pd.read_csv(out / "layer_summary.csv")
    assert sorted(set(summary["epoch"])) == [1, 2, 3]
    info = json.loads((out / "run.json").read_text())
    assert info["job"] == job.id and info["checkpoint_epoch"] == 3 and info["models"][0] == str(bert4)
    assert "epoch" in pd.read_csv(out / "coords_aligned.csv").columns
    group = tmp_path / "group"
    assert main(["compare", "--group", "g1", "--out", str(group), "--folds", "2"]) == 0
    summary = pd.read_csv(group / "layer_summary.csv")
    assert summary["model_b"].nunique() == 2 and summary["recon_accuracy_b"].notna().all()
    info = json.loads((group / "run.json").read_text())
    assert info["group"] == "g1" and len(info["models"]) == 3
    capsys.readouterr()
    assert main(["compare", "--job", "999", "--out", str(tmp_path / "x")]) == 2
    assert main(["compare", "--job", str(job.id), "--pooling", "mean", "--out", str(tmp_path / "y")]) == 2
    assert main(["compare", "--group", "nope", "--out", str(tmp_path / "z")]) == 2
    assert main(["compare", "--job", str(job.id), "--model", "demo", "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("error: ") for line in err), err
    assert "no job 999" in err[0] and "[CLS]" in err[1] and "no group 'nope'" in err[2]


@pytest.mark.slow
def test_the_cli_reads_job_models_and_lends_a_head_with_head_from(home, bert4, tmp_path, capsys):  # noqa: F811
    from cli.main import main
    from tests.unit.compare.test_compare import fine_tuned_classifier

    job = run_job(home, bert4, tmp_path)
    data = write_tsv(tmp_path / "rows.tsv", synthetic(20, seed=4))
    out = tmp_path / "pair"
    assert main(["compare", "--model", str(bert4), "--model", f"job:{job.id}", "--data", str(data), "--out", str(out),
                 "--folds", "2"]) == 0
    summary = pd.read_csv(out / "layer_summary.csv")
    assert set(summary["model_b"]) == {job.label} and summary["recon_accuracy_b"].notna().all()
    assert json.loads((out / "run.json").read_text())["mlm_heads"][job.label] == f"from {bert4}"
    clf = fine_tuned_classifier(bert4, tmp_path / "clf")
    for extra, lent in (([], False), (["--head-from", str(bert4)], True)):
        target = tmp_path / f"clf{len(extra)}"
        assert main(["compare", "--model", str(bert4), "--model", str(clf), "--data", str(data), "--out", str(target),
                     "--folds", "2", *extra]) == 0
        summary = pd.read_csv(target / "layer_summary.csv")
        # a pair is read only when both have a head (issue 34, item 13): without the lent one, neither side
        assert summary["recon_accuracy_b"].notna().all() == lent and summary["recon_accuracy_a"].notna().all() == lent
        info = json.loads((target / "run.json").read_text())
        assert ("head-from" in info["reconstruction"][str(clf)]) != lent
    target = tmp_path / "none"
    assert main(["compare", "--model", str(bert4), "--model", str(bert4), "--data", str(data), "--out", str(target),
                 "--folds", "2", "--no-reconstruction"]) == 0
    assert not any(c.startswith("recon_") for c in pd.read_csv(target / "layer_summary.csv").columns)


# --- the prediction before and after, in the movers table (issue 28, 3.) ------------------------------------------

@pytest.mark.slow
def test_movers_carry_each_models_out_of_fold_probe_prediction_and_a_classifiers_own_prediction(bert4, tmp_path):  # noqa: F811
    from transformers import AutoModelForSequenceClassification

    from analysis.tasks.comparing import compare
    from models.loading import ModelSpec, load_model
    from tests.unit.compare.test_compare import fine_tuned_classifier

    clf = fine_tuned_classifier(bert4, tmp_path / "clf")
    rows = synthetic(20, seed=2)
    a = load_model(ModelSpec(str(bert4), device="cpu"))
    b = load_model(ModelSpec(str(clf), device="cpu", head_from=str(bert4)))
    result = compare([a, b], rows, CompareConfig(folds=2))
    m = result.movers
    labels = np.asarray(rows.labels)
    for layer in (1, 3):
        part = m[m["layer"] == layer].set_index("example_id").loc[list(rows.ids)]
        want_a = plain_probe(plain_cls(bert4, rows.texts)[layer], labels, 2, 0)
        want_b = plain_probe(plain_cls(clf, rows.texts)[layer], labels, 2, 0)
        assert part["probe_prediction_a"].tolist() == want_a.tolist()
        assert part["probe_prediction_b"].tolist() == want_b.tolist()
    tok = AutoTokenizer.from_pretrained(clf)
    model = AutoModelForSequenceClassification.from_pretrained(clf).eval()
    with torch.no_grad():
        own = [model.config.id2label[int(model(**tok(t, return_tensors="pt")).logits.argmax())] for t in rows.texts]
    part = m[m["layer"] == 2].set_index("example_id").loc[list(rows.ids)]
    assert part["head_prediction_b"].tolist() == own
    assert part["head_prediction_a"].isna().all()  # a masked LM has no classifier head
    assert "SequenceClassification" in result.info["head_predictions"][str(clf)]
    assert result.info["head_predictions"][str(bert4)] is None


def test_a_jobs_own_predictions_are_its_head_on_the_rows(home, bert4, tmp_path):  # noqa: F811
    from analysis.core.inputs import read_file
    from analysis.tasks.comparing import compare
    from models.loading import ModelSpec, load_model

    job = run_job(home, bert4, tmp_path)
    rows = read_file(tmp_path / "val.tsv", label_column="label")  # the rows the job scored (no test set)
    a = load_model(ModelSpec(str(bert4), device="cpu"))
    b = load_model(ModelSpec(str(job.artifacts / "checkpoint" / "encoder"), device="cpu", head_from=str(bert4)))
    result = compare([a, b], rows, CompareConfig(folds=2), names=[str(bert4), job.label])
    saved = pd.read_csv(job.artifacts / "predictions.csv", keep_default_na=False).set_index("example_id")
    part = result.movers[result.movers["layer"] == 0].set_index("example_id")
    assert part.loc[saved.index, "head_prediction_b"].tolist() == saved["prediction"].tolist()
    assert "LayerLens head 'cls'" in result.info["head_predictions"][job.label]
