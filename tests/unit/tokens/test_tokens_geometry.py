"""Layer geometry (analysis.tokens.geometry) against plain numpy formulas on planted data: an isotropic Gaussian
has anisotropy near 0, a shared offset raises it to |c|^2 / (|c|^2 + d sigma^2), the rogue dimensions are the
offset's, and self-similarity, intra-sentence similarity and the explained variance are what their definitions
give, computed here directly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.tokens.geometry import geometry, pair_cosine
from analysis.tokens.vectors import write_arrays

D, TEXTS, PER_TEXT = 32, 200, 10
N = TEXTS * PER_TEXT


def planted(directory, offset: np.ndarray, seed=0):
    """Layer 0: isotropic N(0, I); layer 1: N(0, I) + offset; 20 word types, each a word of many texts."""
    rng = np.random.default_rng(seed)
    iso = rng.normal(size=(N, D))
    vectors = np.stack([iso, iso + offset]).astype(np.float16)
    words = rng.integers(0, 20, size=N)
    tokens = pd.DataFrame({"row": np.arange(N), "text_id": np.repeat(np.arange(TEXTS), PER_TEXT),
                           "position": np.tile(np.arange(1, PER_TEXT + 1), TEXTS), "token_id": words,
                           "token": [f"t{w}" for w in words], "word_index": np.tile(np.arange(PER_TEXT), TEXTS),
                           "word": [f"Word{w}" for w in words], "first_subword": True, "start": -1, "end": -1})
    texts = pd.DataFrame({"text_id": np.arange(TEXTS), "text": [""] * TEXTS})
    return write_arrays(directory, vectors, tokens, texts, shard_rows=300), vectors.astype(np.float64), words


def all_pairs(x: np.ndarray) -> float:
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    sims = u @ u.T
    return float((sims.sum() - np.trace(sims)) / (len(x) * (len(x) - 1)))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    offset = np.zeros(D)
    offset[[3, 17]] = [4.0, 2.0]  # |c|^2 = 20 against d sigma^2 = 32
    tv, x, words = planted(tmp_path_factory.mktemp("geometry"), offset)
    table, rogue = geometry(tv, blocks=10, boots=100, min_count=5, max_types=1000, max_occurrences=1000,
                            max_texts=10_000)
    return tv, x, words, offset, table.set_index("layer"), rogue


def test_anisotropy_is_the_all_pairs_mean_cosine(run):
    _, x, _, offset, table, _ = run
    for layer in (0, 1):
        assert table.loc[layer, "anisotropy"] == pytest.approx(all_pairs(x[layer]), abs=1e-6)
        low, high = table.loc[layer, "anisotropy_low"], table.loc[layer, "anisotropy_high"]
        assert low <= table.loc[layer, "anisotropy"] <= high
    assert abs(table.loc[0, "anisotropy"]) < 0.01  # isotropic: near 0
    predicted = offset @ offset / (offset @ offset + D)  # cos of two draws: |c|^2 / (|c|^2 + d sigma^2)
    assert table.loc[1, "anisotropy"] == pytest.approx(predicted, abs=0.05)
    assert table.loc[1, "anisotropy_low"] > table.loc[0, "anisotropy_high"]


def test_rogue_dimensions_are_the_offsets_and_add_up_to_the_anisotropy(run):
    _, x, _, _, table, rogue = run
    top = rogue[rogue["layer"] == 1].sort_values("rank")
    assert top["dim"].tolist()[:2] == [3, 17]
    u = x[1] / np.linalg.norm(x[1], axis=1, keepdims=True)
    per_dim = (u.sum(0) ** 2 - (u ** 2).sum(0)) / (N * (N - 1))  # each dimension's share of the all-pairs sum
    assert top["contribution"].tolist() == pytest.approx(np.sort(per_dim)[::-1][:10].tolist(), abs=1e-6)
    assert per_dim.sum() == pytest.approx(table.loc[1, "anisotropy"], abs=1e-6)
    assert table.loc[1, "rogue_top3_share"] > 0.8


def test_self_and_intra_similarity_follow_their_definitions(run):
    _, x, words, _, table, _ = run
    for layer in (0, 1):
        self_sim = np.mean([pair_cosine(x[layer][words == w]) for w in range(20)])
        assert table.loc[layer, "self_similarity"] == pytest.approx(self_sim, abs=1e-5)
        assert table.loc[layer, "self_similarity_adjusted"] == pytest.approx(self_sim - table.loc[layer, "anisotropy"])
        intra = []
        for t in range(TEXTS):
            s = x[layer][t * PER_TEXT:(t + 1) * PER_TEXT]
            m = s.mean(0)
            intra.append(np.mean(s @ m / np.linalg.norm(s, axis=1) / np.linalg.norm(m)))
        assert table.loc[layer, "intra_similarity"] == pytest.approx(np.mean(intra), abs=1e-5)
    assert table.loc[0, "word_types"] == 20


def test_explained_variance_and_effective_rank(run):
    _, x, _, _, table, _ = run
    for layer in (0, 1):
        lam = np.linalg.eigvalsh(np.cov(x[layer], rowvar=False))[::-1]
        p = lam / lam.sum()
        assert table.loc[layer, "top1_variance"] == pytest.approx(p[0], rel=1e-4)
        assert table.loc[layer, "top10_variance"] == pytest.approx(p[:10].sum(), rel=1e-4)
        assert table.loc[layer, "effective_rank"] == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-4)
        assert table.loc[layer, "effective_rank_low"] <= table.loc[layer, "effective_rank_high"]
    assert table.loc[0, "effective_rank"] > 0.9 * D  # isotropic: nearly full rank
