"""Nearest tokens (analysis.tokens.search): the exact faiss index and the streaming brute force equal a plain
numpy cosine search on small planted data; the approximate indexes' recall@10 is measured against exact; the
neighbour summary counts what it says."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.tokens import search
from analysis.tokens.vectors import TokenVectors, write_arrays


def planted(directory, n_texts=60, per_text=25, hidden=24, layers=2, seed=0) -> TokenVectors:
    rng = np.random.default_rng(seed)
    n = n_texts * per_text
    centres = rng.normal(size=(12, hidden))
    words = rng.integers(0, 12, size=n)
    vectors = np.stack([centres[words] * (layer + 1) + rng.normal(size=(n, hidden)) for layer in range(layers)])
    tokens = pd.DataFrame({"row": np.arange(n), "text_id": np.repeat(np.arange(n_texts), per_text),
                           "position": np.tile(np.arange(1, per_text + 1), n_texts), "token_id": words + 5,
                           "token": [f"w{w}" for w in words], "word_index": np.tile(np.arange(per_text), n_texts),
                           "word": [f"W{w}" for w in words], "first_subword": True,
                           "start": 0, "end": 2, "upos": np.where(words < 6, "NOUN", "VERB"),
                           "deprel": np.where(words % 2 == 0, "obj", "nsubj")})
    texts = pd.DataFrame({"text_id": np.arange(n_texts), "text": [f"text {t}" for t in range(n_texts)]})
    return write_arrays(directory, vectors, tokens, texts, shard_rows=400)


def numpy_cosine(x: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64)
    q = q.astype(np.float64)
    sims = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (x / np.linalg.norm(x, axis=1, keepdims=True)).T
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(sims, order, 1), order


@pytest.fixture(scope="module")
def tv(tmp_path_factory):
    return planted(tmp_path_factory.mktemp("planted"))


def all_vectors(tv, layer):
    return np.concatenate([np.asarray(b, np.float32) for _, b in tv.layer_blocks(layer)])


def test_shards_are_cut_at_text_boundaries_and_read_back_per_layer(tv):
    assert len(tv.manifest["shards"]) > 2
    tokens = tv.tokens()
    for s in tv.manifest["shards"]:
        ids = tokens["text_id"].to_numpy()[s["first_row"]:s["first_row"] + s["rows"]]
        assert set(ids).isdisjoint(tokens["text_id"].to_numpy()[:s["first_row"]])
    rows = np.array([5, 1400, 3, 777, 777])
    np.testing.assert_array_equal(tv.rows_at(1, rows), all_vectors(tv, 1)[rows])


@pytest.mark.parametrize("layer", [0, 1])
def test_exact_index_and_brute_force_equal_a_numpy_cosine_search(tv, layer):
    x = all_vectors(tv, layer)
    q = x[[0, 10, 999, 1499]]
    want_s, want_i = numpy_cosine(x, q, 10)
    search.build_index(tv, layer, "flat")
    got_s, got_i = search.search(search.load_index(tv, layer, "flat"), q, 10)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_s, want_s, atol=1e-5)
    bf_s, bf_i = search.brute_force(tv, layer, q, 10, chunk=128)
    np.testing.assert_array_equal(bf_i, want_i)
    np.testing.assert_allclose(bf_s, want_s, atol=1e-5)


def numpy_neighbours_without_self(x: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query row's ``k`` nearest other rows by a float64 numpy cosine: the query's own row excluded."""
    x = x.astype(np.float64)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    sims = u[rows] @ u.T
    sims[np.arange(len(rows)), rows] = -np.inf
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(sims, order, 1), order


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_the_approximate_indexes_recall_leaves_the_query_row_out(tv, kind):
    """recall@10 is of each query's 10 nearest *other* rows: its own row (cosine 1, always found) would be a free
    tenth of the score. The reference: a float64 numpy search over every row with the query's own row excluded,
    and the index's answer for k + 1 with the query's row dropped, compared as sets (no ties in planted data)."""
    info = search.build_index(tv, 1, kind)
    assert info["kind"] == kind and info["rows"] == tv.rows
    measured = search.measure_recall(tv, 1, kind, queries=100, k=10)
    x = all_vectors(tv, 1)
    rows = np.sort(np.random.default_rng(0).choice(tv.rows, 100, replace=False))
    _, exact = numpy_neighbours_without_self(x, rows, 10)
    _, found = search.search(search.load_index(tv, 1, kind), x[rows], 11)
    found = [[r for r in f if r != q][:10] for f, q in zip(found.tolist(), rows.tolist(), strict=True)]
    want = np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact.tolist(), strict=True)])
    assert measured["recall@10"] == pytest.approx(want)
    assert 0.5 < measured["recall@10"] <= 1.0  # planted clusters: the approximate index finds most neighbours


def test_recall_is_tie_aware_and_set_based_without_scores():
    exact = np.array([[1, 2, 3]])
    assert search.recall_at(exact, exact) == 1.0
    twins = np.array([[0.9, 0.8, 0.8]]), np.array([[1, 2, 3]])  # rows 3 and 4: the same vector
    assert search.recall_at(np.array([[1, 2, 4]]), twins[1]) == pytest.approx(2 / 3)
    assert search.recall_at(np.array([[1, 2, 4]]), twins[1], np.array([[0.9, 0.8, 0.8]]), twins[0]) == 1.0
    assert search.recall_at(np.array([[1, 2, 5]]), twins[1], np.array([[0.9, 0.8, 0.7]]), twins[0]) == \
        pytest.approx(2 / 3)
    assert search.recall_at(exact * 0 - 1, exact) == 0.0


def test_an_index_is_cached_and_rebuilt_only_when_asked(tv):
    first = search.build_index(tv, 0, "flat")
    again = search.build_index(tv, 0, "flat")
    assert again["cached"] and again["build_seconds"] == first["build_seconds"]
    assert not search.build_index(tv, 0, "flat", force=True)["cached"]
    assert not list((tv.directory / "index").glob("*.tmp"))


def test_neighbours_leave_the_query_out_and_carry_their_text(tv):
    x = all_vectors(tv, 1)
    found = search.neighbours(tv, 42, 1, k=5, kind="flat")
    _, want = numpy_cosine(x, x[[42]], 6)
    assert found["row"].tolist() == [r for r in want[0] if r != 42][:5]
    assert found["rank"].tolist() == [1, 2, 3, 4, 5]
    assert found["marked"].str.contains(r"\[\[").all()
    brute = search.neighbours(tv, 42, 1, k=5, kind=None)
    assert brute["row"].tolist() == found["row"].tolist()


def test_neighbours_across_layers_and_their_summary(tv):
    tokens = tv.tokens()
    found = search.across_layers(tv, 42, k=8, kind="flat")
    assert found.groupby("layer").size().to_dict() == {0: 8, 1: 8}
    table = search.summary(tokens.iloc[42], found)
    for _, row in table.iterrows():
        group = found[found["layer"] == row["layer"]]
        assert row["same_word"] == pytest.approx((group["word"].str.casefold() == tokens.iloc[42]["word"].casefold()
                                                  ).mean())
        assert row["same_upos"] == pytest.approx((group["upos"] == tokens.iloc[42]["upos"]).mean())
        assert sum(__import__("json").loads(row["upos"]).values()) == 8
    # the planted word clusters sharpen with depth: more same-word neighbours at layer 1
    assert table.set_index("layer")["same_word"][1] >= table.set_index("layer")["same_word"][0]


def test_rows_are_found_by_text_position_and_word(tv):
    tokens = tv.tokens()
    assert search.find_rows(tokens, text_id=2, position=3).tolist() == [2 * 25 + 2]
    rows = search.find_rows(tokens, word="w3")
    assert (tokens.loc[rows, "token"] == "w3").all() and len(rows) == (tokens["token"] == "w3").sum()
    pieces = tokens.assign(word=np.where(tokens["token"] == "w3", "w3ing", tokens["word"]))
    pieces.loc[5, "word"] = "W3"  # a whole word wins over the pieces of longer ones
    assert search.find_rows(pieces, word="w3").tolist() == [5]
    assert len(search.find_rows(pieces.drop(index=5), word="w3")) == (tokens["token"] == "w3").sum() - (
        tokens.loc[5, "token"] == "w3")
    with pytest.raises(Exception, match="'nothing' matches nothing"):
        search.find_rows(tokens, word="nothing")


def test_standardised_neighbours_are_the_cosine_of_z_scored_vectors(tv):
    x = all_vectors(tv, 1).astype(np.float64)
    z = (x - x.mean(0)) / x.std(0)
    found = search.neighbours(tv, 42, 1, k=6, standardize=True)
    want_s, want_i = numpy_cosine(z, z[[42]], 7)
    assert found["row"].tolist() == [r for r in want_i[0] if r != 42][:6]
    np.testing.assert_allclose(found["cosine"], want_s[0][1:7], atol=1e-5)
    mean, std = search.layer_moments(tv, 1)
    np.testing.assert_allclose(mean, x.mean(0), atol=1e-9)
    np.testing.assert_allclose(std, x.std(0), rtol=1e-9)


def test_neighbours_that_find_nothing_say_why(tmp_path):
    """A token with no other token to be near (an extraction of one token) is one line with the reason, at every
    kind of search, instead of an empty table."""
    one = planted(tmp_path / "one", n_texts=1, per_text=1)
    for kind in ("flat", None, "hnsw"):
        with pytest.raises(search.InputError, match=r"no neighbours: the extraction holds 1 token"):
            search.neighbours(one, 0, 1, k=5, kind=kind)
    with pytest.raises(search.InputError, match="no neighbours"):
        search.across_layers(one, 0, k=3, kind="flat")
    three = planted(tmp_path / "three", n_texts=1, per_text=3)
    assert len(search.neighbours(three, 0, 1, k=10, kind="flat")) == 2  # fewer than k: what there is


def test_a_query_that_matches_nothing_names_it_and_the_nearest_spellings(tv):
    tokens = tv.tokens()
    with pytest.raises(search.InputError) as err:
        search.find_rows(tokens, word="W13")
    message = str(err.value)
    assert "'W13'" in message and "w1" in message and "w3" in message and "\n" not in message
    with pytest.raises(search.InputError, match="'zzzz'.*no word or token of the extraction is spelled close"):
        search.find_rows(tokens, word="zzzz")
    with pytest.raises(search.InputError, match=r"text 2 has no token at position 99 \(positions 1\.\.25\)"):
        search.find_rows(tokens, text_id=2, position=99)
    with pytest.raises(search.InputError, match=r"no text 500: text ids 0\.\.59"):
        search.find_rows(tokens, text_id=500, position=1)
    with pytest.raises(search.InputError, match="text 3 has no word or token 'W13'"):
        search.find_rows(tokens, text_id=3, word="W13")


def test_the_summary_counts_urls_and_addresses_as_such_not_as_words(tv):
    tokens = tv.tokens()
    found = search.across_layers(tv, 42, k=8, kind="flat", layers=[1])
    found.loc[found.index[:3], "word"] = ["https://example.com/a/b", "www.example.org", "someone@example.com"]
    words = __import__("json").loads(search.summary(tokens.iloc[42], found)["words"].iat[0])
    assert words.get("<url>") == 2 and words.get("<e-mail>") == 1
    assert not any("example" in w for w in words)
    assert sum(words.values()) == 8
