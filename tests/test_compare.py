"""Comparison of checkpoints (analysis.compare): each number against a plain computation."""

from math import comb

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes
from scipy.stats import ortho_group

from analysis.compare.cka import _gram_cka, debiased_cka, linear_cka, paired_cka
from analysis.compare.movers import cosine_distance, mcnemar, movement, nearest, neighbour_overlap
from analysis.compare.run import CompareConfig, aligned_maps, compare, compare_pair, same_tokenizer
from analysis.inputs import InputError, TextInputs
from models.loading import ModelSpec, load_model


def layers(seed=0, n=60, d=12, depth=4):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((depth, n, d)).astype(np.float32)


def plain_debiased(x, y):
    """Song et al. 2012 eq. 5 with explicit n x n Gram matrices."""
    def hsic(p, q):
        n = len(p)
        p, q = p.copy(), q.copy()
        np.fill_diagonal(p, 0)
        np.fill_diagonal(q, 0)
        one = np.ones(n)
        return (np.trace(p @ q) + one @ p @ one * (one @ q @ one) / ((n - 1) * (n - 2))
                - 2 / (n - 2) * one @ p @ q @ one) / (n * (n - 3))
    gx, gy = x @ x.T, y @ y.T
    return hsic(gx, gy) / np.sqrt(hsic(gx, gx) * hsic(gy, gy))


def test_debiased_cka_is_the_unbiased_hsic_formula_and_near_zero_for_unrelated_data():
    a = layers(1)[0].astype(np.float64)
    b = layers(2)[0].astype(np.float64)
    want = plain_debiased(a - a.mean(0), b - b.mean(0))
    assert debiased_cka(a, b) == pytest.approx(want, abs=1e-10)
    assert _gram_cka(*(torch_gram(a), torch_gram(b)), debiased=True) == pytest.approx(want, abs=1e-10)
    # unrelated data with d near n: the plain estimator is biased far above 0, the debiased one is not
    x, y = np.random.default_rng(3).standard_normal((2, 20, 15))
    assert linear_cka(x[None], y[None])[0, 0] > 0.5 and abs(debiased_cka(x, y)) < 0.2


def torch_gram(x):
    return x @ x.T


def test_paired_cka_gives_the_layer_cka_with_an_interval_around_it():
    a, b = layers(1), layers(1) + 0.5 * layers(2)
    rows = paired_cka(a, b, [0, 3], boot=100, seed=0)
    for row in rows:
        want = linear_cka(a[row["layer"]][None], b[row["layer"]][None])[0, 0]
        assert row["cka"] == pytest.approx(want)
        assert 0 <= row["ci_low"] <= row["cka"] <= row["ci_high"] <= 1
        # the Gram form of plain CKA is the same number
        assert _gram_cka(torch_gram(a[row["layer"]].astype(np.float64)), torch_gram(b[row["layer"]].astype(np.float64)),
                         debiased=False) == pytest.approx(want, abs=1e-6)


def test_a_rotated_copy_has_cka_1_no_aligned_movement_and_the_same_neighbours_but_a_raw_distance():
    a = layers(4)
    q = ortho_group.rvs(a.shape[2], random_state=0)
    b = (a.astype(np.float64) @ q).astype(np.float32)  # the hidden basis rotated, consistently at every layer
    inputs = TextInputs(tuple(f"t{i}" for i in range(a.shape[1])))
    cross, summary, movers, _ = compare_pair(a, b, ("A", "B"), inputs, CompareConfig(boot=20))
    for row in summary:
        assert row["cka"] == pytest.approx(1, abs=1e-5) and row["mean_movement"] == pytest.approx(0, abs=1e-6)
        assert row["neighbours_mostly_changed"] == 0
    m = movers[0]
    assert (m["neighbour_overlap"] == 1).all() and m["movement_raw"].mean() > 0.1
    # Procrustes is scipy's: B's rotation onto A
    aligned, _ = movement(a[1], b[1])
    r = orthogonal_procrustes(b[1].astype(np.float64), a[1].astype(np.float64))[0]
    np.testing.assert_allclose(aligned, cosine_distance(a[1], b[1].astype(np.float64) @ r), atol=1e-12)
    assert {r["layer_a"] for r in cross} == set(range(len(a)))


def test_mcnemar_is_the_exact_binomial_test_on_discordant_pairs():
    rng = np.random.default_rng(0)
    right_a, right_b = rng.random(80) < 0.6, rng.random(80) < 0.75
    got = mcnemar(right_a, right_b)
    b, c = int((right_a & ~right_b).sum()), int((right_b & ~right_a).sum())
    n = b + c
    plain = min(1.0, 2 * sum(comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n)
    assert (got["a_only"], got["b_only"]) == (b, c) and got["p_value"] == pytest.approx(plain)
    assert mcnemar(right_a, right_a)["p_value"] == 1.0


def test_nearest_neighbours_are_the_brute_force_cosine_ones():
    x = layers(5)[0]
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    sim = unit @ unit.T
    np.fill_diagonal(sim, -np.inf)
    want = np.argsort(-sim, axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(nearest(x, 10, block=7), want)
    overlap = neighbour_overlap(x, layers(6)[0], 10)
    by_hand = [len(set(w) & set(v)) / 10 for w, v in zip(want, nearest(layers(6)[0], 10), strict=True)]
    np.testing.assert_allclose(overlap, by_hand)


def test_aligned_maps_keep_a_point_fixed_when_its_vectors_do_not_change():
    a = layers(7)
    a[1:] = a[0]  # every layer the same vectors
    maps = aligned_maps(a, a.copy(), [0, 1, 2, 3])
    for ca, cb in maps[1:]:
        np.testing.assert_allclose(ca, maps[0][0], atol=1e-8)
        np.testing.assert_allclose(cb, maps[0][1], atol=1e-8)


def test_a_model_compared_with_itself_and_a_different_tokenizer_refused(tiny_dirs):
    demo = load_model(ModelSpec("demo", device="cpu"))
    texts = tuple(f"this film is {'good' if i % 2 else 'bad'} number {i} ." for i in range(30))
    inputs = TextInputs(texts, labels=tuple(str(i % 2) for i in range(30)))
    result = compare([demo, demo], inputs, CompareConfig(boot=20, folds=3))
    s = result.layer_summary
    defined = s["cka"].notna()  # layer 0's [CLS] is the same for every text: undefined
    assert np.allclose(s.loc[defined, "cka"], 1) and np.allclose(s["mean_movement"], 0, atol=1e-6)
    assert (s["neighbours_mostly_changed"] == 0).all() and (s["probe_change"] == 0).all()
    assert (s["mcnemar_p"] == 1).all()
    assert set(result.movers.columns) >= {"model_b", "layer", "example_id", "text", "label", "movement",
                                          "neighbour_overlap"}
    other = load_model(ModelSpec(str(tiny_dirs["roberta"]), device="cpu"))
    with pytest.raises(InputError, match="different tokenizers"):
        same_tokenizer(demo, other)


def test_the_cli_writes_the_five_files_and_refuses_in_one_line(tmp_path, tiny_dirs, capsys):
    import json

    import pandas as pd

    from analysis.cli import main

    data = tmp_path / "rows.csv"
    data.write_text("text,label\n" + "".join(f"film number {i} is {'good' if i % 2 else 'bad'} .,{i % 2}\n"
                                             for i in range(24)))
    out = tmp_path / "out"
    assert main(["compare", "--model", "demo", "--model", "demo", "--data", str(data), "--out", str(out),
                 "--bootstrap", "20", "--folds", "3"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["cka_cross.csv", "coords_aligned.csv", "layer_summary.csv",
                                                     "movers.csv", "run.json"]
    summary = pd.read_csv(out / "layer_summary.csv")
    assert summary["cka"].isna().tolist() == summary["cka_ci_low"].isna().tolist()  # undefined: no interval either
    assert json.loads((out / "run.json").read_text())["models"] == ["demo", "demo"]
    assert len(pd.read_csv(out / "movers.csv")) == 24 * len(summary)
    capsys.readouterr()
    assert main(["compare", "--model", "demo", "--data", str(data), "--out", str(tmp_path / "x")]) == 2
    assert main(["compare", "--model", "demo", "--model", str(tiny_dirs["roberta"]), "--data", str(data),
                 "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "at least twice" in err[0] and "different tokenizers" in err[-1] and len(err) == 2
    assert not (tmp_path / "y").exists()  # nothing half-written
