"""The neurons technique against a plain computation: hidden states from transformers one text at a time, the
probe, the ranking and the ablated accuracies by scikit-learn, and the downstream accuracy by running the layers
after the ablated state by hand (no hook), on a tiny BERT."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from transformers import AutoModelForMaskedLM

from analysis.core.inputs import InputError, TextInputs
from analysis.neurons.ablation import neurons, unit_sets
from analysis.neurons.options import NeuronsConfig
from models.loading import ModelSpec, load_model

WORDS = ["good", "bad", "fun", "dull", "film", "movie", "very", "not", "liked", "hated"]


def labelled(n: int = 80) -> TextInputs:
    rng = np.random.default_rng(0)
    texts, labels = [], []
    for i in range(n):
        words = list(rng.choice(WORDS, 5))
        label = "pos" if i % 2 else "neg"
        words.insert(int(rng.integers(0, 5)), "good fun" if label == "pos" else "bad dull")
        texts.append(" ".join(words))
        labels.append(label)
    return TextInputs(tuple(texts), labels=tuple(labels))


def plain_states(model, tok, texts) -> np.ndarray:
    """(L + 1, n, hidden) [CLS] states, one text at a time."""
    out = []
    with torch.no_grad():
        for text in texts:
            states = model.base_model(**tok(text, return_tensors="pt"), output_hidden_states=True).hidden_states
            out.append(np.stack([h[0, 0].numpy() for h in states]))
    return np.stack(out, axis=1)


def downstream(model, tok, texts, state: int, units) -> np.ndarray:
    """The last state's [CLS] after zeroing ``units`` of ``state`` and running the later BERT layers by hand."""
    out = []
    with torch.no_grad():
        for text in texts:
            h = model.base_model(**tok(text, return_tensors="pt"), output_hidden_states=True).hidden_states[state]
            h = h.clone()
            h[..., units] = 0
            for layer in model.base_model.encoder.layer[state:]:
                h = layer(h)
                h = h[0] if isinstance(h, tuple) else h
            out.append(h[0, 0].numpy())
    return np.stack(out)


def test_ranking_and_ablation_equal_a_plain_scikit_learn_computation(tiny_dirs):
    path = tiny_dirs["bert"]
    data = labelled()
    config = NeuronsConfig(k=3, random_seeds=2, batch_size=16)
    result = neurons(load_model(ModelSpec(str(path), device="cpu")), data, config)
    model = AutoModelForMaskedLM.from_pretrained(path).eval()
    tok = load_model(ModelSpec(str(path), device="cpu")).tokenizer
    x = plain_states(model, tok, data.texts)
    y = np.asarray(data.labels)
    train, test = train_test_split(np.arange(len(y)), test_size=0.3, random_state=0, stratify=list(y))

    def probe(features):
        p = make_pipeline(StandardScaler(), LogisticRegression(solver="saga", l1_ratio=0.5, C=1.0, max_iter=3000,
                                                               tol=1e-5, random_state=0))
        return p.fit(features[train], y[train])

    final = x.shape[0] - 1
    final_probe = probe(x[final])
    checked = 0
    for state in range(x.shape[0]):
        p = probe(x[state])
        scores = np.abs(p[-1].coef_).max(axis=0)
        ours = result.ranking[result.ranking.layer == state]
        rows = result.ablation[result.ablation.layer == state].set_index(["ablated", "seed"])
        if not scores.any():  # issue 53 item 16: no top units where every unit scores 0 (said, not ablated)
            assert ours.empty and list(rows.index.get_level_values(0)) == ["none"], state
            assert "every unit scores 0" in result.info["undefined"][str(state)]
            continue
        top = set(ours["unit"].iloc[:3])
        assert top == set(np.argsort(-scores, kind="stable")[:3]), state
        np.testing.assert_allclose(ours.sort_values("unit")["score"], scores, rtol=1e-3, atol=1e-4)
        assert rows.loc[("none", pd_na())]["accuracy"] == pytest.approx(p.score(x[state][test], y[test]))
        for ablated, seed, units in unit_sets(scores, 3, 2, 0):
            zeroed = x[state][test].copy()
            zeroed[:, units] = 0
            got = rows.loc[(ablated, seed if seed is not None else pd_na())]
            assert got["accuracy"] == pytest.approx(p.score(zeroed, y[test])), (state, ablated, seed)
            if 1 <= state:  # downstream, by hand: the later layers run on the zeroed state
                after = downstream(model, tok, [data.texts[i] for i in test], state, list(units))
                assert got["final_accuracy"] == pytest.approx(final_probe.score(after, y[test])), (state, ablated)
                checked += 1
            assert got["ci_low"] <= got["accuracy"] <= got["ci_high"]
    assert checked == sum(1 for s in range(1, x.shape[0]) if str(s) not in result.info["undefined"]) * 4
    majority = max(set(y[train]), key=list(y[train]).count)
    assert (result.ablation["majority"] == np.mean(y[test] == majority)).all()


def pd_na():
    import pandas as pd

    return pd.NA


def test_bad_labels_are_one_line():
    loaded = load_model(ModelSpec("demo", device="cpu"))
    with pytest.raises(InputError, match="single class"):
        neurons(loaded, TextInputs(("a", "b", "c"), labels=("x", "x", "x")))
    with pytest.raises(InputError, match="no label column"):
        neurons(loaded, TextInputs(("a", "b")))
    with pytest.raises(InputError, match="has one row"):
        neurons(loaded, TextInputs(("a", "b", "c"), labels=("x", "x", "y")))
