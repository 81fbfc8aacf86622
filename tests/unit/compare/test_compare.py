"""Comparison of checkpoints (analysis.compare): each number against a plain computation."""

from math import comb

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes
from scipy.stats import ortho_group

from analysis.compare.movers import cosine_distance, mcnemar, movement, nearest, neighbour_overlap
from analysis.compare.run import CompareConfig, aligned_maps, compare_pair, same_tokenizer
from analysis.core.cka import _gram_cka, debiased_cka, linear_cka, paired_cka
from analysis.core.inputs import InputError, TextInputs
from analysis.tasks.comparing import compare
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
    rows = paired_cka(a, b, [0, 3], seed=0)
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
    cross, summary, movers, _ = compare_pair(a, b, ("A", "B"), inputs, CompareConfig())
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
    result = compare([demo, demo], inputs, CompareConfig(folds=3))
    s = result.layer_summary
    defined = s["cka"].notna()  # layer 0's [CLS] is the same for every text: undefined, movement and overlap too
    assert defined.sum() == len(s) - 1
    assert np.allclose(s.loc[defined, "cka"], 1) and np.allclose(s.loc[defined, "mean_movement"], 0, atol=1e-6)
    assert s.loc[~defined, ["mean_movement", "neighbours_mostly_changed"]].isna().all(axis=None)
    assert (s.loc[defined, "neighbours_mostly_changed"] == 0).all() and (s["probe_change"] == 0).all()
    assert (s["mcnemar_p"] == 1).all()
    assert set(result.movers.columns) >= {"model_b", "layer", "example_id", "text", "label", "movement",
                                          "neighbour_overlap"}
    other = load_model(ModelSpec(str(tiny_dirs["roberta"]), device="cpu"))
    with pytest.raises(InputError, match="different tokenizers"):
        same_tokenizer(demo, other)


@pytest.mark.slow
def test_the_cli_writes_the_five_files_and_refuses_in_one_line(tmp_path, tiny_dirs, capsys):
    import json

    import pandas as pd

    from cli.main import main

    data = tmp_path / "rows.csv"
    data.write_text("text,label\n" + "".join(f"film number {i} is {'good' if i % 2 else 'bad'} .,{i % 2}\n"
                                             for i in range(24)))
    out = tmp_path / "out"
    assert main(["compare", "--model", "demo", "--model", "demo", "--data", str(data), "--out", str(out),
                 "--folds", "3"]) == 0
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


# --- reconstruction accuracy per layer, both models, and its change (issue 28, 2.) -------------------------------

TEXTS = ("the film is good .", "a very dull movie !", "it was not bad", "i liked the film and it was fun",
         "the movie is very bad , i hated it", "a good film", "it was dull", "not a fun movie .",
         "the film was good and very fun !", "i hated the dull film")


def fine_tuned_classifier(base_dir, out, noise=0.15, seed=3):
    """The tiny masked LM's encoder saved as a sequence classifier (no MLM head), its upper layers moved a little:
    what a fine-tuning job leaves behind."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from tests.support.models import tiny_tokenizer

    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=2,
                                                               id2label={0: "neg", 1: "pos"})
    with torch.no_grad():
        for p in model.bert.encoder.layer[1:].parameters():
            p.add_(noise * torch.randn_like(p))
    model.save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


def plain_token_correct(encoder_dir, head_dir, texts):
    """Per layer, whether the MLM head of ``head_dir`` read at each non-special token of each text (in reading
    order) gives the input token: transformers alone."""
    import torch
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(encoder_dir)
    encoder = AutoModel.from_pretrained(encoder_dir, add_pooling_layer=False).eval()
    head = AutoModelForMaskedLM.from_pretrained(head_dir).eval().cls
    per_text = []
    with torch.no_grad():
        for text in texts:
            enc = tok(text, return_tensors="pt")
            states = encoder(**enc, output_hidden_states=True).hidden_states
            ids = enc["input_ids"][0]
            keep = ~torch.isin(ids, torch.tensor(tok.all_special_ids))
            per_text.append(np.stack([(head(s[0][keep]).argmax(-1) == ids[keep]).numpy() for s in states]))
    return per_text  # (layers, tokens of the text) each


def test_reconstruction_per_layer_is_each_models_token_accuracy_with_wilson_and_mcnemar_on_the_same_tokens(
        tiny_dirs, tmp_path):
    from scipy.stats import binomtest

    base = tiny_dirs["bert"]
    clf = fine_tuned_classifier(base, tmp_path / "clf")
    a = load_model(ModelSpec(str(base), device="cpu"))
    b = load_model(ModelSpec(str(clf), device="cpu", head_from=str(base)))
    inputs = TextInputs(TEXTS, labels=tuple("pos" if i % 2 else "neg" for i in range(len(TEXTS))))
    result = compare([a, b], inputs, CompareConfig(folds=2))
    s = result.layer_summary
    want_a = np.concatenate(plain_token_correct(base, base, TEXTS), axis=1)
    want_b = np.concatenate(plain_token_correct(clf, base, TEXTS), axis=1)
    assert len(s) == len(want_a)
    for layer, row in s.iterrows():
        right_a, right_b = want_a[layer], want_b[layer]
        n = len(right_a)
        assert row["recon_tokens"] == n
        assert row["recon_accuracy_a"] == pytest.approx(right_a.mean(), abs=1e-12)
        assert row["recon_accuracy_b"] == pytest.approx(right_b.mean(), abs=1e-12)
        assert row["recon_change"] == pytest.approx(right_b.mean() - right_a.mean(), abs=1e-12)
        for side, right in (("a", right_a), ("b", right_b)):
            ci = binomtest(int(right.sum()), n).proportion_ci(method="wilson")
            assert (row[f"recon_ci_low_{side}"], row[f"recon_ci_high_{side}"]) == pytest.approx(
                (ci.low, ci.high), abs=1e-9)
        only_a, only_b = int((right_a & ~right_b).sum()), int((right_b & ~right_a).sum())
        m = only_a + only_b
        p = min(1.0, 2 * sum(comb(m, k) for k in range(min(only_a, only_b) + 1)) / 2 ** m) if m else 1.0
        assert (row["recon_mcnemar_a_only"], row["recon_mcnemar_b_only"]) == (only_a, only_b)
        assert row["recon_mcnemar_p"] == pytest.approx(p)
        assert row["recon_change_ci_low"] <= row["recon_change"] <= row["recon_change_ci_high"]
    assert s["recon_change"].abs().max() > 0 and (s["recon_mcnemar_b_only"] > 0).any()  # both ways discordant
    heads = result.info["mlm_heads"]
    assert heads == {a.spec.name: "own", b.spec.name: f"from {base}"}


def test_the_change_interval_is_a_paired_bootstrap_over_sentences():
    from analysis.compare.recon import paired_change_interval

    rng = np.random.default_rng(1)
    counted = rng.integers(0, 9, 40)
    right_a = np.stack([rng.binomial(counted, 0.6) for _ in range(3)], axis=1)
    right_b = np.stack([rng.binomial(counted, 0.7) for _ in range(3)], axis=1)
    low, high = paired_change_interval(counted, right_a, right_b, resamples=300, seed=4)
    draws = np.random.default_rng(4).integers(0, 40, (300, 40))
    diffs = np.array([(right_b[d].sum(0) - right_a[d].sum(0)) / counted[d].sum() for d in draws])
    want_low, want_high = np.percentile(diffs, [2.5, 97.5], axis=0)
    np.testing.assert_allclose(low, want_low, atol=1e-12)
    np.testing.assert_allclose(high, want_high, atol=1e-12)


def test_a_model_without_an_mlm_head_has_blank_reconstruction_columns_and_says_why(tiny_dirs, tmp_path):
    base = tiny_dirs["bert"]
    clf = fine_tuned_classifier(base, tmp_path / "clf")
    a = load_model(ModelSpec(str(base), device="cpu"))
    b = load_model(ModelSpec(str(clf), device="cpu"))  # no head lent
    result = compare([a, b], TextInputs(TEXTS), CompareConfig())
    s = result.layer_summary
    # the pair has one head only: neither side is read (issue 34, item 13: no probe spent on one side)
    assert s["recon_accuracy_a"].isna().all() and s["recon_accuracy_b"].isna().all()
    assert s["recon_change"].isna().all()
    assert result.info["mlm_heads"][b.spec.name] is None
    assert "head-from" in result.info["reconstruction"][b.spec.name]
    assert "skipped" in result.info["reconstruction"][a.spec.name]


@pytest.mark.parametrize("debiased", [False, True])
def test_the_resampled_ckas_are_the_gram_cka_of_each_resampled_gram(debiased):
    from analysis.core.cka import _resampled_cka

    a, b = layers(8, n=40, d=6)[0].astype(np.float64), layers(9, n=40, d=5)[0].astype(np.float64)
    b = b + a[:, :5]
    kx, ky = a @ a.T, b @ b.T
    draws = np.random.default_rng(2).integers(0, 40, (25, 40))
    counts = np.zeros((25, 40))
    np.add.at(counts, (np.arange(25)[:, None], draws), 1)
    got = _resampled_cka(kx, ky, counts, debiased)
    want = [_gram_cka(kx[np.ix_(idx, idx)], ky[np.ix_(idx, idx)], debiased) for idx in draws]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    rows = paired_cka(layers(8), layers(8) + layers(9), [1, 2], seed=5, max_rows=50, debiased=debiased)
    sub = np.sort(np.random.default_rng(5).choice(60, 50, replace=False))  # the interval's seeded 50 of 60 rows
    for row in rows:
        x, y = layers(8)[row["layer"]][sub].astype(np.float64), (layers(8) + layers(9))[row["layer"]][sub]
        y = y.astype(np.float64)
        leave = np.array([_gram_cka((x @ x.T)[np.ix_(k, k)], (y @ y.T)[np.ix_(k, k)], debiased)
                          for k in (np.flatnonzero(np.arange(50) != i) for i in range(50))])
        half = 1.959964 * np.sqrt(49 / 50 * ((leave - leave.mean()) ** 2).sum())
        low, high = max(row["cka"] - half, -1 if debiased else 0), min(row["cka"] + half, 1)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high), rel=1e-6)


@pytest.mark.parametrize("n", [8, 60])  # fewer rows than dimensions (Grams), more (cross-covariances)
def test_cross_cka_two_layers_at_a_time_is_linear_cka(n):
    from analysis.core.cka import cross_cka

    a, b = layers(10, n=n, d=12, depth=4), layers(11, n=n, d=10, depth=3)
    a[0] = a[0, :1]  # a constant layer: no CKA
    np.testing.assert_allclose(cross_cka(a, b), linear_cka(a, b), rtol=1e-6, equal_nan=True)
    x, y = a[2].astype(np.float64), b[1].astype(np.float64)
    x, y = x - x.mean(0), y - y.mean(0)
    plain = np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))
    assert cross_cka(a, b)[2, 1] == pytest.approx(plain, rel=1e-5)
    assert np.isnan(cross_cka(a, b)[0]).all()


@pytest.mark.slow
def test_the_cka_interval_is_a_jackknife_around_the_estimate_even_with_few_rows():
    """Review (issue 28): resampling rows with replacement duplicates rows, which raises CKA (a row agrees with its
    copy), so the bootstrap interval of 77 rows x 64 dims sat above its own estimate, and debiased CKA's interval
    missed the population value every time. The interval is now the delete-one jackknife: no duplicates."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)) / 8

    def draw(m):
        x = rng.standard_normal((m, 64))
        return x, x @ w * 0.5 + rng.standard_normal((m, 64))

    big = draw(6000)
    population = _gram_cka(big[0] @ big[0].T, big[1] @ big[1].T, debiased=True)
    covered = 0
    for _ in range(20):
        x, y = draw(77)
        for debiased in (False, True):
            row = paired_cka(x[None].astype(np.float32), y[None].astype(np.float32), [0], debiased=debiased)[0]
            assert row["ci_low"] <= row["cka"] <= row["ci_high"]
            assert (0 if not debiased else -1) <= row["ci_low"] and row["ci_high"] <= 1
            # the jackknife by hand: the estimate on every row but one, on the float32 rows the layer holds
            xs, ys = x.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)
            leave = [_gram_cka(xs[keep] @ xs[keep].T, ys[keep] @ ys[keep].T, debiased)
                     for keep in (np.arange(77) != i for i in range(77))]
            se = np.sqrt(76 / 77 * ((np.array(leave) - np.mean(leave)) ** 2).sum())
            low, high = row["cka"] - 1.959964 * se, row["cka"] + 1.959964 * se
            assert (row["ci_low"], row["ci_high"]) == pytest.approx((max(low, -1 if debiased else 0), min(high, 1)),
                                                                    abs=1e-6)
            covered += debiased and row["ci_low"] <= population <= row["ci_high"]
    assert covered >= 17  # debiased CKA's interval covers the population value (95% nominal; 20 draws)
