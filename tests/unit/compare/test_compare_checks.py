"""Compare checkpoints (issue 34): the checks a comparison makes before it computes (the same input ids on every
row, enough rows), a model against itself, models of another depth, the map drawn as the numbers are measured
(B rotated onto A), undefined layers, reconstruction skipped for a pair without two heads, the probe's baseline.
Each number against a plain computation (numpy, transformers)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.linalg import orthogonal_procrustes
from scipy.stats import ortho_group
from transformers import AutoModel, AutoTokenizer

from analysis.compare.run import CompareConfig, compare_pair
from analysis.core.inputs import InputError, TextInputs, read_file
from analysis.tasks.comparing import compare
from models.loading import ModelSpec, load_model
from models.spec import DEMO_DIR
from tests.unit.compare.test_compare_jobs import plain_cka, plain_cls

TEXTS = ["the battery is good .", "i hated the price .", "the screen was fine .", "great battery , bad screen .",
         "the film was dull .", "a fun film !", "the room was clean .", "the staff was rude .",
         "i liked the food .", "the price is fair .", "the acting was bad .", "a very good hotel .",
         "the sound is poor .", "it was fine .", "a dull and long film .", "the food was great !",
         "the keyboard is nice .", "the plot was thin .", "the bed was hard .", "a good price .",
         "the service was slow .", "i loved the view .", "the battery died .", "a nice screen ."]
LABELS = ["positive", "negative", "neutral"]


def rows_csv(path: Path, texts=TEXTS) -> Path:
    frame = pd.DataFrame({"text": texts, "label": [LABELS[i % 3] for i in range(len(texts))]})
    frame.to_csv(path, index=False)
    return path


def cased_demo(out: Path) -> Path:
    """A copy of the demo model whose tokenizer does not lowercase (its normaliser in tokenizer.json and the
    do_lower_case transformers reads from tokenizer_config.json): the same class and vocabulary, other ids for any
    capital letter."""
    shutil.copytree(DEMO_DIR, out, ignore=shutil.ignore_patterns("lens"))
    tok = json.loads((out / "tokenizer.json").read_text())
    tok["normalizer"]["lowercase"] = False
    (out / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["do_lower_case"] = False
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def headless_demo(out: Path, pooling: str | None = None) -> Path:
    """The demo model's encoder saved as a ``BertModel`` (no MLM head), with ``pooling`` its sentence-transformers
    pooling (modules.json and 1_Pooling, as sentence-transformers writes them) when given."""
    AutoModel.from_pretrained(DEMO_DIR).save_pretrained(out)
    AutoTokenizer.from_pretrained(DEMO_DIR).save_pretrained(out)
    if pooling:
        (out / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (out / "1_Pooling").mkdir()
        (out / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": 256, "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max"}))
    return out


def deep_demo(out: Path) -> Path:
    """The demo model (4 layers) with its last three layers duplicated by the project's export: 7 layers."""
    from analysis.duplication.export import export
    from analysis.duplication.plan import duplicate_last

    return export(load_model(ModelSpec("demo", device="cpu")), duplicate_last(4, 3), out)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compare_models")


# --- item 5: tokenizers that differ only in normalisation --------------------------------------------------------

@pytest.mark.slow
def test_tokenizers_that_differ_only_in_normalisation_are_refused_naming_the_first_row(tmp_path, capsys):
    from cli.main import main

    cased = cased_demo(tmp_path / "cased")
    texts = [*TEXTS[:3], "Great Battery , bad screen .", *TEXTS[4:]]
    data = rows_csv(tmp_path / "rows.csv", texts)
    tok_a, tok_b = AutoTokenizer.from_pretrained(DEMO_DIR), AutoTokenizer.from_pretrained(cased)
    assert tok_a.get_vocab() == tok_b.get_vocab() and type(tok_a) is type(tok_b)  # only the normaliser differs
    differ = [i for i, t in enumerate(texts) if tok_a(t)["input_ids"] != tok_b(t)["input_ids"]]
    assert differ == [3] and tok_b.tokenize("Great Battery") == ["[UNK]", "[UNK]"]
    capsys.readouterr()
    assert main(["compare", "--model", "demo", "--model", str(cased), "--data", str(data), "--out",
                 str(tmp_path / "out"), "--no-reconstruction", "--folds", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "row 3" in err[0] and "Great Battery" in err[0], err
    assert not (tmp_path / "out").exists()
    # the engine (the page's way in) refuses the same, before reading any vector
    a, b = load_model(ModelSpec("demo", device="cpu")), load_model(ModelSpec(str(cased), device="cpu"))
    with pytest.raises(InputError, match="row 3"):
        compare([a, b], read_file(data, label_column="label"), CompareConfig(folds=2, reconstruction=False))
    # on rows both tokenise alike the two compare (the check is on the ids, not on the tokenizers' settings)
    lower = rows_csv(tmp_path / "lower.csv")
    assert main(["compare", "--model", "demo", "--model", str(cased), "--data", str(lower), "--out",
                 str(tmp_path / "ok"), "--no-reconstruction", "--folds", "2"]) == 0


# --- item 6: a model against itself ------------------------------------------------------------------------------

def test_a_model_against_itself_in_the_cli_gives_cka_1_no_movement_and_one_map_for_both(tmp_path):
    from cli.main import main

    data = rows_csv(tmp_path / "rows.csv")
    out = tmp_path / "out"
    assert main(["compare", "--model", "demo", "--model", "demo", "--data", str(data), "--out", str(out),
                 "--folds", "2", "--no-reconstruction"]) == 0
    s = pd.read_csv(out / "layer_summary.csv")
    defined = s["cka"].notna()
    assert defined.sum() == len(s) - 1  # layer 0's [CLS] is the same vector for every text
    np.testing.assert_allclose(s.loc[defined, "cka"], 1, atol=1e-5)
    np.testing.assert_allclose(s.loc[defined, "mean_movement"], 0, atol=1e-6)
    coords = pd.read_csv(out / "coords_aligned.csv")
    for _, part in coords.groupby("layer"):
        assert len(part) == 2 * len(TEXTS)
        first, second = part.iloc[:len(TEXTS)], part.iloc[len(TEXTS):]
        np.testing.assert_array_equal(first["example_id"], second["example_id"])
        np.testing.assert_allclose(first[["x", "y"]], second[["x", "y"]], atol=1e-6)


# --- item 17: too few rows ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [4, 6])  # fewer rows than folds; every class smaller than the folds
def test_too_few_rows_are_one_line_before_any_work(tmp_path, capsys, monkeypatch, n):
    from cli.main import main

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    data = rows_csv(tmp_path / "rows.csv", TEXTS[:n])
    capsys.readouterr()
    assert main(["compare", "--model", "demo", "--model", "random:demo", "--data", str(data), "--out",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n_splits" not in err[0] and f"{n} rows" in err[0] and "--folds" in err[0], err
    assert not list((tmp_path / "home").rglob("*.npy"))  # nothing was extracted
    assert not (tmp_path / "out").exists()


# --- item 13: reconstruction needs a head on both sides ----------------------------------------------------------

@pytest.mark.slow
def test_a_checkpoint_without_a_head_against_its_random_twin_reads_neither_and_says_why(models_dir, monkeypatch):
    import analysis.probe.reconstruction

    headless = models_dir / "headless"
    if not headless.exists():
        headless_demo(headless)
    a = load_model(ModelSpec(str(headless), device="cpu"))
    b = load_model(ModelSpec(f"random:{headless}", device="cpu"))
    assert a.mlm_head is None and b.mlm_head == "own"  # the twin got a random head the checkpoint lacks
    calls = []
    real = analysis.probe.reconstruction.probe
    monkeypatch.setattr(analysis.probe.reconstruction, "probe", lambda *x, **k: calls.append(1) or real(*x, **k))
    result = compare([a, b], TextInputs(tuple(TEXTS)), CompareConfig())
    assert calls == []  # neither side read through a head
    s = result.layer_summary
    assert s["recon_accuracy_a"].isna().all() and s["recon_accuracy_b"].isna().all()
    why = result.info["reconstruction"]
    assert "no MLM head of its own" in why[str(headless)]
    assert "skipped" in why[f"random:{headless}"] and str(headless) in why[f"random:{headless}"]


# --- item 8: models of another depth -----------------------------------------------------------------------------

@pytest.mark.slow
def test_another_depth_pairs_layers_by_index_or_relative_depth_and_names_those_left_out(models_dir, tmp_path):
    from cli.main import main

    deep = models_dir / "deep"
    if not deep.exists():
        deep_demo(deep)
    a, b = load_model(ModelSpec("demo", device="cpu")), load_model(ModelSpec(str(deep), device="cpu"))
    assert (a.num_layers, b.num_layers) == (4, 7)
    inputs = TextInputs(tuple(TEXTS), labels=tuple(LABELS[i % 3] for i in range(len(TEXTS))))
    plain_a, plain_b = plain_cls(DEMO_DIR, TEXTS), plain_cls(deep, TEXTS)
    for pairing, pairs, left_out in (("index", [(i, i) for i in range(5)], [5, 6, 7]),
                                     ("relative", [(0, 0), (1, 2), (2, 4), (3, 5), (4, 7)], [1, 3, 6])):
        result = compare([a, b], inputs, CompareConfig(folds=2, reconstruction=False, pairing=pairing))
        s = result.layer_summary
        assert list(zip(s["layer"], s["layer_b"], strict=True)) == pairs
        (info,) = result.info["layer_pairs"]
        assert info["left_out_b"] == left_out and info["left_out_a"] == [] and info["depths"] == [4, 7]
        for (i, j), cka in zip(pairs, s["cka"], strict=True):
            if i == 0:
                assert np.isnan(cka)  # [CLS] at the embeddings: the same for every text
            else:
                assert cka == pytest.approx(plain_cka(plain_a[i], plain_b[j]), abs=2e-4)
        movers = result.movers
        assert list(dict.fromkeys(zip(movers["layer"], movers["layer_b"], strict=True))) == pairs
    # the CLI's flag
    data = rows_csv(tmp_path / "rows.csv")
    assert main(["compare", "--model", "demo", "--model", str(deep), "--data", str(data), "--out",
                 str(tmp_path / "out"), "--folds", "2", "--no-reconstruction", "--pair-layers", "relative"]) == 0
    s = pd.read_csv(tmp_path / "out" / "layer_summary.csv")
    assert s["layer_b"].tolist() == [0, 2, 4, 5, 7]
    assert json.loads((tmp_path / "out" / "run.json").read_text())["layer_pairs"][0]["left_out_b"] == [1, 3, 6]


@pytest.mark.slow
def test_the_reconstruction_of_another_depth_follows_the_layer_pairs(models_dir):
    from tests.unit.compare.test_compare import plain_token_correct

    deep = models_dir / "deep"
    if not deep.exists():
        deep_demo(deep)
    a, b = load_model(ModelSpec("demo", device="cpu")), load_model(ModelSpec(str(deep), device="cpu"))
    texts = TEXTS[:10]
    result = compare([a, b], TextInputs(tuple(texts)), CompareConfig(pairing="relative"))
    s = result.layer_summary
    want_a = np.concatenate(plain_token_correct(DEMO_DIR, DEMO_DIR, texts), axis=1)
    want_b = np.concatenate(plain_token_correct(deep, deep, texts), axis=1)
    for _, row in s.iterrows():
        i, j = int(row["layer"]), int(row["layer_b"])
        assert row["recon_accuracy_a"] == pytest.approx(want_a[i].mean(), abs=1e-12)
        assert row["recon_accuracy_b"] == pytest.approx(want_b[j].mean(), abs=1e-12)
        only_a, only_b = int((want_a[i] & ~want_b[j]).sum()), int((want_b[j] & ~want_a[i]).sum())
        assert (row["recon_mcnemar_a_only"], row["recon_mcnemar_b_only"]) == (only_a, only_b)


# --- item 9: the map is drawn as movement is measured ------------------------------------------------------------

def test_the_shared_map_draws_b_rotated_onto_a():
    from analysis.core.projection import exact_pca

    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 50, 8)).astype(np.float32)
    a[:, :, 0] *= 4  # a clear first axis
    q = ortho_group.rvs(8, random_state=1)
    b = (a.astype(np.float64) @ q).astype(np.float32)  # the hidden basis rotated: nothing moved
    b[2] += 0.3 * rng.standard_normal((50, 8)).astype(np.float32)  # at the last layer, something did
    inputs = TextInputs(tuple(f"t{i}" for i in range(50)))
    _, summary, _, coords = compare_pair(a, b, ("A", "B"), inputs, CompareConfig())
    assert summary[0]["mean_movement"] == pytest.approx(0, abs=1e-6)
    frame = pd.concat(coords)
    for layer in range(3):
        part = frame[frame["layer"] == layer]
        xa, xb = part.iloc[:50][["x", "y"]].to_numpy(), part.iloc[50:][["x", "y"]].to_numpy()
        if layer < 2:  # a rotated copy lies on A's points
            np.testing.assert_allclose(xb, xa, atol=1e-5)
        # the map is the PCA of A's vectors and B's rotated onto A's (up to the layer-to-layer 2-D rotation)
        x64, y64 = a[layer].astype(np.float64), b[layer].astype(np.float64)
        r = orthogonal_procrustes(y64, x64)[0]
        want = exact_pca(np.concatenate([x64, y64 @ r]))
        fit = orthogonal_procrustes(want, np.concatenate([xa, xb]))[0]
        np.testing.assert_allclose(want @ fit, np.concatenate([xa, xb]), atol=1e-5)


# --- item 21: undefined layers, the probe's baseline, few rows for the width -------------------------------------

def test_a_constant_layer_has_no_movement_or_neighbour_overlap_and_the_probe_its_baseline():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 30, 6)).astype(np.float32)
    b = a + 0.5 * rng.standard_normal((3, 30, 6)).astype(np.float32)
    a[0], b[0] = a[0, :1], b[0, :1]  # the same vector for every row (layer 0's [CLS])
    labels = tuple(["x"] * 15 + ["y"] * 10 + ["z"] * 5)
    inputs = TextInputs(tuple(f"t{i}" for i in range(30)), labels=labels)
    _, summary, movers, _ = compare_pair(a, b, ("A", "B"), inputs, CompareConfig(folds=3))
    first, rest = summary[0], summary[1:]
    assert np.isnan(first["cka"]) and np.isnan(first["mean_movement"]) and np.isnan(first["median_movement"])
    assert np.isnan(first["neighbours_mostly_changed"])
    assert movers[0]["movement"].isna().all() and movers[0]["neighbour_overlap"].isna().all()
    assert all(np.isfinite(r["mean_movement"]) and np.isfinite(r["neighbours_mostly_changed"]) for r in rest)
    assert all(r["probe_majority_baseline"] == pytest.approx(15 / 30) for r in summary)


def test_the_probe_chart_draws_the_majority_class_baseline():
    from analysis.compare.plots import paired_accuracy_curves

    summary = pd.DataFrame({"model_a": "A", "model_b": "B", "layer": [0, 1], "probe_accuracy_a": [0.5, 0.6],
                            "probe_ci_low_a": [0.4, 0.5], "probe_ci_high_a": [0.6, 0.7], "probe_accuracy_b": [0.5, 0.8],
                            "probe_ci_low_b": [0.4, 0.7], "probe_ci_high_b": [0.6, 0.9],
                            "probe_majority_baseline": [0.45, 0.45]})
    fig = paired_accuracy_curves(summary, "probe", ["embeddings", "layer 1 (last)"], "probe")
    (baseline,) = [t for t in fig.data if t.name == "majority class"]
    assert list(baseline.y) == [0.45, 0.45]


def test_run_json_says_when_rows_are_fewer_than_the_hidden_size(tmp_path):
    from cli.main import main

    data = rows_csv(tmp_path / "rows.csv")
    assert main(["compare", "--model", "demo", "--model", "random:demo", "--data", str(data), "--out",
                 str(tmp_path / "out"), "--folds", "2", "--no-reconstruction"]) == 0
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert "24 rows" in info["few_rows"] and "256" in info["few_rows"]
    assert "constant" in info["undefined_layers"]
