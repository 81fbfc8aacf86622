"""The layer atlas against scikit-learn and plain transformers run directly on tiny models."""

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binomtest
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score, silhouette_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from transformers import AutoModel, AutoTokenizer

from analysis.atlas.atlas import AtlasConfig, atlas
from analysis.core.cka import linear_cka
from analysis.core.inputs import InputError, TextInputs, parse
from analysis.core.layers import parse_layers
from analysis.core.projection import align_signs, project
from analysis.core.separability import check_labels
from analysis.core.store import ArrayStore
from analysis.core.vectors import representations
from cli.main import main
from models.loading import ModelSpec, load_model

WORDS = ["the", "a", "film", "is", "good", "bad", "not", "very", "movie", "and", "it", "was", "i", "liked", "hated",
         "fun", "dull", "!", "."]


def labelled(n=40, seed=0, pairs=False) -> TextInputs:
    rng = np.random.default_rng(seed)
    texts = tuple(" ".join(rng.choice(WORDS, rng.integers(1, 9))) for _ in range(n))
    labels = tuple(str(i % 3) for i in range(n))
    pair = tuple(" ".join(rng.choice(WORDS, rng.integers(1, 4))) for _ in range(n)) if pairs else None
    return TextInputs(texts, pair, labels=labels)


def plain_vectors(path, inputs: TextInputs, pooling="cls") -> np.ndarray:
    """(L + 1, n, d) sentence vectors the straightforward way: one unpadded text at a time."""
    model, tok = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    out = []
    with torch.no_grad():
        for i, text in enumerate(inputs.texts):
            enc = tok(text, inputs.pairs[i] if inputs.pairs else None, return_tensors="pt")
            states = model(**enc, output_hidden_states=True).hidden_states
            if pooling == "cls":
                out.append([h[0, 0] for h in states])
            else:
                keep = ~torch.isin(enc["input_ids"][0], torch.tensor(tok.all_special_ids))
                out.append([h[0, keep].mean(0) for h in states])
    return np.stack([np.stack([v.numpy() for v in layer]) for layer in zip(*out, strict=True)])


def loaded_of(path):
    return load_model(ModelSpec(str(path), device="cpu"))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_vectors_match_plain_transformers_for_every_family(tiny_dir, tmp_path, pooling):
    inputs = labelled(12)
    reps, hit = representations(loaded_of(tiny_dir), inputs, pooling, batch_size=5, store=ArrayStore(tmp_path))
    assert not hit
    np.testing.assert_allclose(reps, plain_vectors(tiny_dir, inputs, pooling), atol=2e-5)


def test_text_pairs_are_encoded_as_cls_a_sep_b_sep(tiny_dirs, tmp_path):
    inputs = labelled(10, pairs=True)
    reps, _ = representations(loaded_of(tiny_dirs["bert"]), inputs, "mean", store=ArrayStore(tmp_path))
    np.testing.assert_allclose(reps, plain_vectors(tiny_dirs["bert"], inputs, "mean"), atol=2e-5)
    alone, _ = representations(loaded_of(tiny_dirs["bert"]), TextInputs(inputs.texts), "mean",
                               store=ArrayStore(tmp_path))
    assert not np.allclose(reps[-1], alone[-1])  # the pair really is part of the input


def test_coordinates_silhouette_and_probe_agree_with_scikit_learn(tiny_dirs, tmp_path):
    path, inputs = tiny_dirs["bert"], labelled(60)
    result = atlas(loaded_of(path), inputs, AtlasConfig(layers="all", folds=3), store=ArrayStore(tmp_path))
    vectors, labels = plain_vectors(path, inputs), np.array(inputs.labels)
    previous = None
    assert (result.coords[result.coords.layer == 0][["x", "y"]] == 0).all().all()  # constant [CLS]: the origin
    for layer in range(1, vectors.shape[0]):
        ours = result.coords[result.coords.layer == layer][["x", "y"]].to_numpy()
        ref = PCA(n_components=2).fit_transform(vectors[layer])
        signs = np.sign((ours * ref).sum(0))
        np.testing.assert_allclose(ours, ref * signs, atol=1e-4)  # equal up to a sign per axis
        if previous is not None:  # the signs that were flipped point the way the previous layer's do
            assert ((ours * previous).sum(0) >= 0).all()
        previous = ours
        row = result.separability.iloc[layer]
        assert row.silhouette == pytest.approx(silhouette_score(vectors[layer], labels), abs=1e-4)
        scores = cross_val_score(make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)), vectors[layer],
                                 labels, cv=StratifiedKFold(3, shuffle=True, random_state=0))
        assert row.probe_accuracy == pytest.approx(scores.mean(), abs=1e-9)
        assert row.probe_accuracy_std == pytest.approx(scores.std(), abs=1e-9)
        oof = cross_val_predict(make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)), vectors[layer],
                                labels, cv=StratifiedKFold(3, shuffle=True, random_state=0))
        assert row.probe_macro_f1 == pytest.approx(f1_score(labels, oof, average="macro"), abs=1e-9)
        wilson = binomtest(int((oof == labels).sum()), len(labels)).proportion_ci(method="wilson")
        assert (row.probe_ci_low, row.probe_ci_high) == pytest.approx((wilson.low, wilson.high), abs=1e-9)
        assert 0 <= row.probe_ci_low <= row.probe_ci_high <= 1
        assert row.majority_baseline == pytest.approx(max(np.mean(labels == c) for c in set(labels)))
    assert result.coords.groupby("layer").example_id.apply(list).map(lambda ids: ids == list(range(60))).all()
    assert (result.coords.label.to_numpy()[:60] == labels).all()


def test_only_the_chosen_layers_are_projected(tiny_dirs, tmp_path):
    result = atlas(loaded_of(tiny_dirs["bert"]), labelled(30), AtlasConfig(layers="-2:", folds=3),
                   store=ArrayStore(tmp_path))
    assert sorted(result.coords.layer.unique()) == [2, 3]
    assert result.separability.layer.tolist() == [0, 1, 2, 3] and result.cka.shape == (4, 4)


def test_embedding_cls_is_constant_and_has_no_cka(tiny_dirs, tmp_path):
    result = atlas(loaded_of(tiny_dirs["bert"]), labelled(30), AtlasConfig(layers="all", folds=3),
                   store=ArrayStore(tmp_path))
    assert result.info["constant_layers"] == [0]  # [CLS] + position 0, whatever the text
    assert np.isnan(result.cka[0]).all() and np.allclose(np.diag(result.cka)[1:], 1)


def naive_cka(x, y):
    """Kornblith et al. (2019) eq. via HSIC with the centring matrix, written out."""
    n = len(x)
    h = np.eye(n) - np.ones((n, n)) / n
    k, l_ = h @ x @ x.T @ h, h @ y @ y.T @ h
    return np.trace(k @ l_) / np.sqrt(np.trace(k @ k) * np.trace(l_ @ l_))


@pytest.mark.parametrize("n, d", [(12, 30), (50, 6)])  # both code paths: Gram (n <= d) and covariance (n > d)
def test_linear_cka_matches_the_hsic_formula(n, d):
    rng = np.random.default_rng(0)
    reps = rng.normal(size=(3, n, d)).astype(np.float32)
    reps[2] = reps[0] @ rng.normal(size=(d, d)).astype(np.float32) + 0.1 * reps[1]
    cka = linear_cka(reps)
    for i in range(3):
        for j in range(3):
            assert cka[i, j] == pytest.approx(naive_cka(reps[i].astype(float), reps[j].astype(float)), abs=1e-5)


@pytest.mark.parametrize("n, d", [(12, 30), (50, 6)])
def test_cka_between_two_models_matches_the_hsic_formula(n, d):
    rng = np.random.default_rng(2)
    a = rng.normal(size=(2, n, d)).astype(np.float32)
    b = np.stack([a[0] @ rng.normal(size=(d, d + 3)), rng.normal(size=(n, d + 3)), np.ones((n, d + 3))])
    b = b.astype(np.float32)
    cka = linear_cka(a, b)
    assert cka.shape == (2, 3) and np.isnan(cka[:, 2]).all()  # a constant layer: undefined
    for i in range(2):
        for j in range(2):
            assert cka[i, j] == pytest.approx(naive_cka(a[i].astype(float), b[j].astype(float)), abs=1e-5)


def test_align_signs_only_flips_signs():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(20, 2))
    out = align_signs([a, -a, a * [1, -1]])
    for c in out:
        np.testing.assert_allclose(np.abs(c), np.abs(a))
        np.testing.assert_allclose(c, a)


def test_representations_are_cached_on_disk(tiny_dirs, tmp_path):
    store, loaded, inputs = ArrayStore(tmp_path), loaded_of(tiny_dirs["bert"]), labelled(20)
    first, hit1 = representations(loaded, inputs, "cls", store=store)
    relabelled = TextInputs(inputs.texts, labels=tuple("x" if i % 2 else "y" for i in range(20)))
    second, hit2 = representations(loaded, relabelled, "cls", store=store)
    assert (hit1, hit2) == (False, True) and np.array_equal(first, second)  # labels do not change vectors
    assert not representations(loaded, inputs, "mean", store=store)[1]  # other pooling
    assert not representations(loaded, inputs, "cls", max_length=4, store=store)[1]  # other max length
    assert not representations(loaded, labelled(20, seed=1), "cls", store=store)[1]  # other data
    other = loaded_of(tiny_dirs["roberta"])
    assert not representations(other, inputs, "cls", store=store)[1]  # other model
    damaged = list((tmp_path / "representations").glob("*/shard_00000.npy"))
    assert len(damaged) == 5  # one layered vector set per key: cls, mean, max length 4, other data, other model
    for path in damaged:
        path.write_bytes(b"garbage")
    again, hit = representations(loaded, inputs, "cls", store=store)  # unreadable entries are recomputed
    assert not hit and np.array_equal(again, first)


def test_fingerprint_follows_the_weights(tiny_dirs, tmp_path):
    import shutil

    from tests.support.models import save_tiny

    copy = tmp_path / "copy"
    shutil.copytree(tiny_dirs["bert"], copy)
    assert loaded_of(copy).fingerprint == loaded_of(tiny_dirs["bert"]).fingerprint
    save_tiny("bert", copy, seed=5)
    assert loaded_of(copy).fingerprint != loaded_of(tiny_dirs["bert"]).fingerprint


@pytest.mark.parametrize("spec, expected", [("all", [0, 1, 2, 3]), ("-2:", [2, 3]), ("0,2", [0, 2]),
                                            ("-1", [3]), ("1:3", [1, 2]), (" ALL ", [0, 1, 2, 3])])
def test_parse_layers(spec, expected):
    assert parse_layers(spec, 4) == expected


@pytest.mark.parametrize("spec, message", [("7", "does not exist"), ("a,b", "cannot read"),
                                           ("5:", "layer 5 in .5:. does not exist"), ("3:1", "selects no")])
def test_parse_layers_errors(spec, message):
    with pytest.raises(InputError, match=message):
        parse_layers(spec, 4)


@pytest.mark.parametrize("labels, folds, message", [
    (None, 5, "no label column"),
    (("a",) * 10, 5, "single class"),
    (("a", "b", "a"), 5, "fewer than the 5 folds"),
    (("a",) * 10 + ("b",) * 2, 5, "class 'b' has 2 row"),
])
def test_bad_labels(labels, folds, message):
    with pytest.raises(InputError, match=message):
        check_labels(labels, folds)


def test_labels_read_as_text_so_numbers_and_strings_agree():
    csv = parse("text,label\na,1\nb,0\n", "x.csv", label_column="label")
    jsonl = parse('{"text": "a", "label": 1}\n{"text": "b", "label": 0.0}\n', "x.jsonl", label_column="label")
    assert csv.labels == jsonl.labels == ("1", "0")


def test_empty_and_missing_texts_or_labels_are_skipped_and_counted():
    data = parse('{"text": null, "label": 1}\n{"text": "", "label": 1}\n{"text": "ok", "label": null}\n'
                 '{"text": "fine", "label": "pos"}\n', "x.jsonl", label_column="label")
    assert data.texts == ("fine",) and data.labels == ("pos",) and data.skipped_empty == 3 and data.ids == (3,)


def test_row_limit_is_an_error_not_a_silent_cut(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERLENS_ATLAS_MAX_ROWS", "10")
    with pytest.raises(InputError, match="more than the atlas' limit of 10"):
        atlas(loaded_of(tiny_dirs["bert"]), labelled(30), store=ArrayStore(tmp_path))
    sample = labelled(30).sample(10, seed=3)
    assert len(sample) == 10 and list(sample.ids) == sorted(sample.ids)
    result = atlas(loaded_of(tiny_dirs["bert"]), sample, AtlasConfig(folds=2, layers="-1"), store=ArrayStore(tmp_path))
    assert result.coords.example_id.tolist() == list(sample.ids)  # ids point at the source rows


@pytest.mark.parametrize("method", ["umap", "tsne"])
@pytest.mark.slow
def test_nonlinear_methods_give_finite_coordinates(tiny_dirs, tmp_path, method):
    result = atlas(loaded_of(tiny_dirs["bert"]), labelled(30), AtlasConfig(method=method, layers="-1", folds=3),
                   store=ArrayStore(tmp_path))
    assert len(result.coords) == 30 and np.isfinite(result.coords[["x", "y"]].to_numpy()).all()


def test_cli_writes_the_contract_files(tiny_dirs, tmp_path):
    data = tmp_path / "rows.tsv"
    inputs = labelled(30, pairs=True)
    rows = ["sentence\taspect\tgold"] + [f"{t}\t{p}\t{lab}" for t, p, lab in
                                        zip(inputs.texts, inputs.pairs, inputs.labels, strict=True)]
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    assert main(["atlas", "--model", str(tiny_dirs["bert"]), "--data", str(data), "--text-column", "sentence",
                 "--pair-column", "aspect", "--label-column", "gold", "--layers", "0,3", "--folds", "3",
                 "--out", str(out)]) == 0
    coords = pd.read_csv(out / "coords.csv")
    assert list(coords.columns) == ["layer", "example_id", "x", "y", "label"]
    assert coords.layer.unique().tolist() == [0, 3] and coords.example_id.tolist()[:30] == list(range(30))
    sep = pd.read_csv(out / "separability.csv")
    assert list(sep.columns) == ["layer", "silhouette", "probe_accuracy", "probe_accuracy_std", "probe_macro_f1",
                                 "probe_ci_low", "probe_ci_high", "majority_baseline"] and len(sep) == 4
    expected = atlas(loaded_of(tiny_dirs["bert"]), inputs, AtlasConfig(layers="0,3", folds=3))
    np.testing.assert_allclose(sep.probe_accuracy, expected.separability.probe_accuracy)
    cka = pd.read_csv(out / "cka.csv", index_col="layer")
    assert cka.shape == (4, 4)
    run = json.loads((out / "run.json").read_text())
    assert run["pair_column"] == "aspect" and run["rows"] == 30 and run["layers"] == [0, 3]


@pytest.mark.parametrize("content, extra, message", [
    ("text,label\na,1\nb,1\nc,1\nd,1\ne,1\n", [], "single class"),
    ("text,gold\na,1\n", [], "no column 'label'"),
    ("text,label\na,1\nb,2\n", [], "fewer than the 5 folds"),
    ("text,label\n" + "a,1\nb,2\n" * 5, ["--layers", "x"], "cannot read layers"),
])
def test_cli_bad_input_is_one_line(tiny_dirs, tmp_path, capsys, content, extra, message):
    data = tmp_path / "rows.csv"
    data.write_text(content)
    code = main(["atlas", "--model", str(tiny_dirs["bert"]), "--data", str(data), "--out", str(tmp_path / "o"),
                 *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and message in err[0]


def test_bundled_demo_set():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "analysis" / "data" / "demo_sentiment.csv"
    data = parse(path.read_bytes(), path.name, label_column="label")
    aspects = parse(path.read_bytes(), path.name, pair_column="aspect", label_column="label")
    assert len(data) >= 300 and set(data.labels) == {"positive", "negative", "neutral"}
    assert 0 < len(aspects) < len(data)


@pytest.mark.parametrize("shape", [(700, 768), (1500, 64), (40, 300)])
def test_pca_is_exact_on_a_flat_spectrum(shape):
    """A flat spectrum is where a randomized solver drifts (14-44 degrees on 700 x 768): the atlas's axes must
    be exact PCA's, i.e. numpy's full SVD of the centred matrix, up to the sign of each axis."""
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    centred = x.astype(np.float64) - x.astype(np.float64).mean(0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    ref = u[:, :2] * s[:2]
    ours = project(x, "pca")
    signs = np.sign((ours * ref).sum(0))
    np.testing.assert_allclose(ours, ref * signs, atol=1e-6 * np.abs(ref).max(), rtol=1e-5)


@pytest.mark.parametrize("spec, message", [("", "no layers given"), ("2:9", "layer 9 in '2:9' does not exist"),
                                           ("-20:3", "layer -20"), ("0,7", "layer 7 does not exist")])
def test_layers_out_of_range_or_empty_are_errors_not_clamped(spec, message):
    from analysis.core.layers import parse_layers

    with pytest.raises(InputError, match=re.escape(message)):
        parse_layers(spec, 5)


def test_more_of_the_last_layers_than_the_model_has_is_all_of_them_and_said():
    from analysis.core.layers import layers_note, parse_layers

    assert parse_layers("-6:", 5) == [0, 1, 2, 3, 4]
    assert layers_note("-6:", 5) == "layers -6: asks for the last 6 hidden states; this model has 5: all are shown"
    assert layers_note("-5:", 5) is None and layers_note("all", 5) is None


@pytest.mark.parametrize("shape", [(50, 8), (6, 20)])  # covariance eigendecomposition and full SVD
def test_pca_explained_variance_is_scikit_learns(shape):
    """Issue 24.10: the share of variance on each PCA axis, from the same exact PCA as the coordinates."""
    from analysis.core.projection import exact_pca

    x = np.random.default_rng(3).normal(size=shape) * np.linspace(3, 0.5, shape[1])
    scores, ratio = exact_pca(x, variance=True)
    np.testing.assert_allclose(scores, exact_pca(x))
    np.testing.assert_allclose(ratio, PCA(n_components=2, svd_solver="full").fit(x).explained_variance_ratio_,
                               rtol=1e-9)
    centred = x - x.mean(0)
    np.testing.assert_allclose(ratio, np.linalg.svd(centred, compute_uv=False)[:2] ** 2 / (centred ** 2).sum())


@pytest.mark.slow
def test_atlas_records_the_variance_of_each_pca_panel(tiny_dirs, tmp_path):
    inputs = labelled(30)
    result = atlas(loaded_of(tiny_dirs["bert"]), inputs, AtlasConfig(layers="all", folds=3),
                   store=ArrayStore(tmp_path))
    vectors = plain_vectors(tiny_dirs["bert"], inputs)
    assert result.info["constant_layers"] == [0] and result.info["explained_variance"][0] is None
    for layer, ratio in zip(result.info["layers"][1:], result.info["explained_variance"][1:], strict=True):
        ref = PCA(n_components=2, svd_solver="full").fit(vectors[layer]).explained_variance_ratio_
        np.testing.assert_allclose(ratio, ref, rtol=1e-4)
    tsne = atlas(loaded_of(tiny_dirs["bert"]), inputs, AtlasConfig(layers="-2:", folds=3, method="tsne"),
                 store=ArrayStore(tmp_path))
    assert tsne.info["explained_variance"] is None  # t-SNE axes explain no variance


@pytest.mark.slow
def test_the_projection_is_its_own_stage_of_the_progress(tiny_dirs, tmp_path, monkeypatch):
    """Issue 24.10: the bar sat full at 'scoring layers 4/4' while t-SNE ran: the projection stage starts at 0
    before the first layer is projected, and the atlas says how long each stage took."""
    import analysis.core.projection as projection

    events, real = [], projection.project
    monkeypatch.setattr(projection, "project", lambda *a, **k: (events.append("project"), real(*a, **k))[1])
    result = atlas(loaded_of(tiny_dirs["bert"]), labelled(30), AtlasConfig(layers="-2:", folds=3, method="tsne"),
                   progress=lambda stage, done, n: events.append((stage, done, n)), store=ArrayStore(tmp_path))
    first = events.index("project")
    assert events[first - 1] == ("projecting (t-SNE)", 0, 2)
    assert ("scoring layers", 0, 4) in events[:events.index(("scoring layers", 4, 4))]
    assert events[-1] == ("projecting (t-SNE)", 2, 2)
    info = result.info
    assert {"vectors_seconds", "scoring_seconds", "projection_seconds"} <= set(info)
    assert info["vectors_seconds"] + info["scoring_seconds"] + info["projection_seconds"] <= info["seconds"] + 1e-3


@pytest.mark.parametrize("pooling, name", [("cls", "[CLS] vector"), ("mean", "mean of the text's tokens")])
def test_the_atlas_names_the_pooling_it_used(tiny_dirs, tmp_path, pooling, name):
    result = atlas(loaded_of(tiny_dirs["bert"]), labelled(30), AtlasConfig(pooling=pooling, layers="-1:", folds=3),
                   store=ArrayStore(tmp_path))
    assert result.info["pooling_name"] == name
    assert result.info["layer_names"] == loaded_of(tiny_dirs["bert"]).anatomy.layer_names()


def test_a_sentence_encoders_own_pooling_is_named_as_such(tiny_dirs, tmp_path):
    from tests.unit.models.test_any_checkpoint import sentence_transformers_dir

    loaded = loaded_of(sentence_transformers_dir(tiny_dirs["bert"], tmp_path / "st", mode="max"))
    result = atlas(loaded, labelled(30), AtlasConfig(pooling="model", layers="-1:", folds=3),
                   store=ArrayStore(tmp_path / "store"))
    assert result.info["pooling_name"] == "checkpoint's own pooling (max of the tokens, sentence-transformers)"
    from analysis.atlas.atlas import pooling_name

    assert pooling_name("model", "mean+normalize") == ("checkpoint's own pooling (mean of the tokens, then "
                                                       "L2-normalised, sentence-transformers)")


@pytest.mark.slow
def test_an_approximate_atlas_states_its_cka_with_float32_per_layer():
    from analysis.atlas.atlas import AtlasConfig, atlas
    from analysis.core.cka import linear_cka
    from analysis.core.precision import AGREEMENT_ROWS
    from analysis.core.vectors import extract
    from models.loading import ModelSpec, load_model

    texts = tuple(f"text number {i} is {'good' if i % 2 else 'bad'} ." for i in range(40))
    inputs = TextInputs(texts, labels=tuple(str(i % 2) for i in range(40)))
    config = AtlasConfig(layers="all", folds=2)
    exact = atlas(load_model(ModelSpec("demo", device="cpu")), inputs, config)
    assert exact.info["precision"] == {"mode": "exact: float32"}
    bf16 = load_model(ModelSpec("demo", device="cpu", dtype="bfloat16"))
    approx = atlas(bf16, inputs, config)
    agreement = approx.info["precision"]["agreement"]
    assert approx.info["precision"]["mode"].startswith("approximate") and agreement["rows"] == min(40, AGREEMENT_ROWS)
    ours = extract(bf16, inputs, "cls")
    theirs = extract(load_model(ModelSpec("demo", device="cpu", dtype="float32")), inputs, "cls")
    by_hand = [linear_cka(ours[i:i + 1], theirs[i:i + 1])[0, 0] for i in range(len(ours))]
    np.testing.assert_allclose(agreement["cka_per_layer"], by_hand, rtol=0, atol=1e-5)
    assert 0.99 < agreement["min_cka"] < 1  # bfloat16 moves the vectors a little, not their geometry
