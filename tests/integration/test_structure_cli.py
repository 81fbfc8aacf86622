"""``python -m analysis structure``: the files the issue names, their numbers consistent with one another, long
sentences dropped and counted, bad input as one line with nothing written."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cli.main import main
from tests.support.data import FIXTURES

TRAIN, TEST = FIXTURES / "ud_tiny_train.conllu", FIXTURES / "ud_tiny_test.conllu"
COLUMNS = ["layer", "task", "metric", "value", "ci_low", "ci_high", "majority_baseline", "position_baseline", "control",
           "selectivity"]


@pytest.fixture(scope="module")
def run(tiny_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("structure") / "out"
    code = main(["structure", "--model", str(tiny_dirs["bert"]), "--train", str(TRAIN), "--test", str(TEST),
                 "--out", str(out), "--max-epochs", "2", "--rank", "8", "--tree-layers", "0,3"])
    return code, out


def test_writes_the_issues_files_with_consistent_numbers(run):
    code, out = run
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["mdl.csv", "probes.csv", "run.json", "summary.csv", "trees.jsonl"]
    probes = pd.read_csv(out / "probes.csv")
    assert list(probes.columns) == COLUMNS
    assert sorted(probes.layer.unique()) == [0, 1, 2, 3] and len(probes) == 4 * 8
    labels = probes[probes.task.isin(["upos", "deprel"])]
    np.testing.assert_allclose(labels.selectivity, labels.value - labels.control)
    assert (labels.ci_low <= labels.value + 1e-12).all() and (labels.value <= labels.ci_high + 1e-12).all()
    assert probes[probes.task == "distance"].control.isna().all()
    summary = pd.read_csv(out / "summary.csv")
    for _, row in summary.iterrows():
        curve = probes[(probes.task == row.task) & (probes.metric == row.metric)].set_index("layer").value
        assert row.best_layer == curve.idxmax() and row.best_score == pytest.approx(curve.max())
    mdl = pd.read_csv(out / "mdl.csv")
    assert set(mdl.task) == {"upos", "deprel"} and (mdl.compression == mdl.uniform_bits / mdl.codelength_bits).all()
    info = json.loads((out / "run.json").read_text())
    assert info["word_vector"] == "first" and info["test"]["dropped_too_long"] == 0
    assert info["rank"] == 8 and info["precision"].startswith("exact") and info["options"]["max_epochs"] == 2


def test_trees_hold_gold_and_predicted_arcs_for_the_chosen_layers(run):
    _, out = run
    records = [json.loads(line) for line in (out / "trees.jsonl").read_text().splitlines()]
    assert len(records) == 18 and set(records[0]["layers"]) == {"0", "3"}
    probes = pd.read_csv(out / "probes.csv")
    for layer in ("0", "3"):
        correct = total = 0
        for rec in records:
            got = rec["layers"][layer]
            pred = {tuple(e) for e in got["predicted_edges"]}
            gold = {tuple(sorted((d, h))) for d, h in rec["gold_arcs"]
                    if h and rec["upos"][d - 1] != "PUNCT" and rec["upos"][h - 1] != "PUNCT"}
            correct, total = correct + len(pred & gold), total + len(gold)
            assert len(got["predicted_upos"]) == len(rec["words"])
        uuas = probes[(probes.task == "distance") & (probes.metric == "uuas") & (probes.layer == int(layer))].value
        assert correct / total == pytest.approx(uuas.item())


def _sentence(sent_id: str, words: list[str]) -> str:
    return f"# sent_id = {sent_id}\n" + "\n".join(
        f"{i}\t{w}\t{w}\tADJ\t_\t_\t{0 if i == 1 else 1}\t{'root' if i == 1 else 'conj'}\t_\t_"
        for i, w in enumerate(words, 1)) + "\n\n"


def test_long_sentences_are_dropped_counted_and_said(tiny_dirs, tmp_path, capsys):
    """The limit counts the special tokens ([CLS] and [SEP]: 62 one-subword words fit 64 positions, 63 do not);
    run.json keeps the two reasons apart and lists at most the first 100 ids of each, saying so."""
    extra = [_sentence("fits", ["good"] * 62), _sentence("over", ["good"] * 63)]
    extra += [_sentence(f"long{i}", ["good"] * 69) for i in range(100)]
    extra.append(_sentence("empty", ["good", "\u200b", "good"]))  # a word the tokenizer turns into nothing
    path = tmp_path / "test.conllu"
    path.write_text(TEST.read_text() + "\n" + "".join(extra))
    out = tmp_path / "out"
    assert main(["structure", "--model", str(tiny_dirs["bert"]), "--train", str(TRAIN), "--test", str(path),
                 "--out", str(out), "--tasks", "upos", "--layers", "-1", "--no-mdl"]) == 0
    info = json.loads((out / "run.json").read_text())["test"]
    assert (info["dropped_too_long"], info["dropped_no_subword"]) == (101, 1)
    assert info["dropped_too_long_ids"] == ["over"] + [f"long{i}" for i in range(99)]
    assert info["dropped_no_subword_ids"] == ["empty"] and "first 100 of each reason" in info["dropped_ids_listed"]
    assert json.loads((out / "run.json").read_text())["test_sentences_scored"] == 19  # the 18 and "fits"
    err = capsys.readouterr().err
    assert ("dropped 101 sentence(s) longer than the model's 64 tokens (special tokens included) and 1 with a "
            "word") in err


@pytest.mark.parametrize("extra, words", [
    (["--rank", "99"], "more than the model's hidden size 16"),
    (["--tasks", "pos"], "unknown task(s) pos"),
    (["--layers", "9"], "layer 9 does not exist"),
])
def test_bad_options_are_one_line_and_write_nothing(tiny_dirs, tmp_path, capsys, extra, words):
    out = tmp_path / "out"
    code = main(["structure", "--model", str(tiny_dirs["bert"]), "--train", str(TRAIN), "--test", str(TEST),
                 "--out", str(out), "--tasks", "upos,distance", "--no-mdl", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and words in err[-1] and err[-1].startswith("error: ") and not out.exists()


def test_a_malformed_treebank_names_its_line(tiny_dirs, tmp_path, capsys):
    bad = tmp_path / "bad.conllu"
    bad.write_text(TEST.read_text().replace("2\tfilm\tfilm\tNOUN\t_\t_\t4", "2\tfilm\tfilm\tNOUN\t_\t_\tfour", 1))
    code = main(["structure", "--model", str(tiny_dirs["bert"]), "--train", str(bad), "--test", str(TEST),
                 "--out", str(tmp_path / "out")])
    assert code == 2 and f"error: {bad}:4: HEAD 'four'" in capsys.readouterr().err


def test_a_labelled_set_adds_the_task_label_scored_as_the_atlas_scores_it(tiny_dirs, tmp_path):
    """--label-data: the 'label' rows are the atlas's out-of-fold probe of the same sentence vectors (recomputed
    here with plain scikit-learn), with the training majority as baseline, and the summary places it."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from analysis.core.inputs import read_file
    from analysis.core.scores import wilson_interval
    from analysis.core.vectors import extract
    from models.loading import load_model
    from models.spec import ModelSpec

    sst2 = FIXTURES / "sst2_dev_200.tsv"
    out = tmp_path / "out"
    assert main(["structure", "--model", str(tiny_dirs["bert"]), "--train", str(TRAIN), "--test", str(TEST),
                 "--out", str(out), "--tasks", "upos", "--no-mdl", "--layers", "0,2", "--label-data", str(sst2)]) == 0
    probes = pd.read_csv(out / "probes.csv")
    rows = probes[probes.task == "label"].set_index("layer")
    assert list(rows.index) == [0, 2] and (rows.metric == "accuracy").all() and rows.control.isna().all()
    data = read_file(sst2, "text", label_column="label")
    reps = extract(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")), data, "cls")
    labels = np.asarray(data.labels)
    for layer in (0, 2):
        folds = StratifiedKFold(5, shuffle=True, random_state=0)
        pred = cross_val_predict(make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)), reps[layer],
                                 labels, cv=folds)
        correct = int((pred == labels).sum())
        assert rows.value[layer] == pytest.approx(correct / len(labels), abs=1e-12)
        assert (rows.ci_low[layer], rows.ci_high[layer]) == pytest.approx(wilson_interval(correct, len(labels)))
        assert rows.majority_baseline[layer] == pytest.approx(max(np.mean(labels == c) for c in set(labels)))
    summary = pd.read_csv(out / "summary.csv").set_index("task")
    assert summary.loc["label", "best_layer"] == rows.value.idxmax()
    info = json.loads((out / "run.json").read_text())["label_task"]
    assert info["texts"] == 200 and info["pooling"] == "cls" and info["data"] == str(sst2)


def test_a_labelled_set_without_labels_is_one_line(tiny_dirs, tmp_path, capsys):
    txt = tmp_path / "texts.txt"
    txt.write_text("one text\nanother text\n")
    code = main(["structure", "--model", str(tiny_dirs["bert"]), "--train", str(TRAIN), "--test", str(TEST),
                 "--out", str(tmp_path / "out"), "--tasks", "upos", "--no-mdl", "--label-data", str(txt)])
    assert code != 0 and not (tmp_path / "out").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "label" in err[0]


def _edge_counts(out) -> tuple[np.ndarray, np.ndarray]:
    """Per layer and test sentence, from trees.jsonl: the distance probe's gold edges recovered, and gold edges."""
    records = [json.loads(line) for line in (out / "trees.jsonl").read_text().splitlines()]
    layers = sorted(records[0]["layers"], key=int)
    correct = np.array([[len({tuple(e) for e in r["layers"][la]["predicted_edges"]}
                             & {tuple(e) for e in r["layers"][la]["gold_edges"]}) for r in records] for la in layers])
    total = np.array([[len(r["layers"][la]["gold_edges"]) for r in records] for la in layers])
    return correct.astype(float), total.astype(float)


@pytest.mark.slow  # four runs
def test_seeds_retrain_the_probes_and_the_summary_pools_them(tiny_dirs, tmp_path, capsys):
    """--seeds 3 is --seed 0, 1 and 2 pooled: its point estimates are --seed 0's; its distance intervals are the
    percentiles of 1,000 sentence resamples, resample b rescoring seed b mod 3's counts (taken here from the
    separate runs' trees.jsonl); the linear UPOS probe has no seed, so its interval is one seed's."""
    common = ["structure", "--model", str(tiny_dirs["bert"]), "--train", str(TRAIN), "--test", str(TEST),
              "--tasks", "upos,distance", "--no-mdl", "--max-epochs", "3", "--rank", "4"]
    runs = {}
    for name, extra in (("pooled", ["--seeds", "3"]), (0, ["--seed", "0"]), (1, ["--seed", "1"]),
                        (2, ["--seed", "2"])):
        assert main([*common, *extra, "--out", str(tmp_path / str(name))]) == 0, capsys.readouterr().err
        runs[name] = tmp_path / str(name)
    assert "pooled over 3 training seeds" in capsys.readouterr().err
    pooled = pd.read_csv(runs["pooled"] / "summary.csv").set_index("task")
    single = pd.read_csv(runs[0] / "summary.csv").set_index("task")
    pd.testing.assert_frame_equal(pd.read_csv(runs["pooled"] / "probes.csv"), pd.read_csv(runs[0] / "probes.csv"))
    assert (pooled.seeds == 3).all() and (single.seeds == 1).all()
    assert json.loads((runs["pooled"] / "run.json").read_text())["seeds"] == [0, 1, 2]
    upos = ["best_layer", "best_layer_ci_low", "best_layer_ci_high", "center_of_gravity_ci_low",
            "center_of_gravity_ci_high"]
    np.testing.assert_equal(pooled.loc["upos", upos].to_numpy(float), single.loc["upos", upos].to_numpy(float))

    counts = [_edge_counts(runs[k]) for k in (0, 1, 2)]
    n = counts[0][0].shape[1]
    weights = np.random.default_rng(0).multinomial(n, np.full(n, 1 / n), size=1000).astype(float)
    scores = np.array([(w @ counts[b % 3][0].T) / (w @ counts[b % 3][1].T) for b, w in enumerate(weights)])
    best = scores.argmax(1)
    row = pooled.loc["distance"]
    assert (row.best_layer_ci_low, row.best_layer_ci_high) == (np.percentile(best, 2.5), np.percentile(best, 97.5))
    running = np.maximum.accumulate(scores, axis=1)
    gain = np.diff(running, axis=1)
    defined = gain.sum(1) > 0
    cog = (gain[defined] * np.arange(1, scores.shape[1])).sum(1) / gain[defined].sum(1)
    assert row.center_of_gravity_undefined == pytest.approx(1 - defined.mean())
    if np.isfinite(row.center_of_gravity):
        assert row.center_of_gravity_ci_low == pytest.approx(np.percentile(cog, 2.5))
        assert row.center_of_gravity_ci_high == pytest.approx(np.percentile(cog, 97.5))
    else:
        assert np.isnan(row.center_of_gravity_ci_low) and np.isnan(row.center_of_gravity_ci_high)
    for k in (0, 1, 2):  # each seed's own best layer lies inside the pooled interval
        own = pd.read_csv(runs[k] / "summary.csv").set_index("task").loc["distance", "best_layer"]
        assert row.best_layer_ci_low <= own <= row.best_layer_ci_high
