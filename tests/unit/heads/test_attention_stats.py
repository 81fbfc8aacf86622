"""Head statistics (analysis.heads.stats, run.analyse; Clark et al. 2019 §3, §6) against plain transformers and
numpy on tiny models of every family, on planted attention tensors (a previous-token head, planted per-sentence
shares for the interval's coverage), word-level attention (§4.1) on WordPiece, SentencePiece and byte-level BPE,
the eager path's hidden states, and the head map's Jensen-Shannon distances against scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from transformers import AutoModel, AutoTokenizer

from analysis.core.activations import encode_words
from analysis.core.inputs import InputError, TextInputs
from analysis.heads.model import load_eager
from analysis.heads.run import analyse
from analysis.heads.stats import STATISTICS, TokenStatistics, js_distances, punctuation_ids, t_interval
from analysis.heads.words import pooling_matrices, word_attention, word_attention_loop
from models.loading import ModelSpec, load_model
from tests.unit.structure.test_structure_words import SENTENCES, families, reference_tokenizer  # noqa: F401  (fixture)

TEXTS = TextInputs(("the film is good .", "i liked the movie , and it was fun !", "not very good",
                    "it was a bad film ? very bad", "fun"))
FAMILIES = ["bert", "albert", "roberta", "xlm-roberta", "distilbert", "electra"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_eager_path_gives_the_default_paths_hidden_states(tiny_dirs, family):
    spec = ModelSpec(str(tiny_dirs[family]), device="cpu")
    default, eager = load_model(spec), load_eager(spec)
    assert eager.model.config._attn_implementation == "eager"
    assert default.model.config._attn_implementation != "eager"  # the default is left as it was
    ids = torch.randint(5, 99, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        a = default.model.base_model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        b = eager.model.base_model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x[mask.bool()], y[mask.bool()], rtol=1e-5, atol=1e-5)


def reference_statistics(directory, texts) -> np.ndarray:
    """``(layers, heads, statistics)`` by a loop: each text alone through transformers, each statistic in
    numpy, averaged over tokens then over sentences."""
    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    punct = set(punctuation_ids(tok).nonzero()[0].tolist())
    per_sentence = []
    for text in texts:
        ids = tok(text)["input_ids"]
        with torch.no_grad():
            maps = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
        n = len(ids)
        values = np.zeros((len(maps), maps[0].shape[1], len(STATISTICS)))
        for layer, a in enumerate(maps):
            a = a[0].double().numpy()
            for h in range(a.shape[0]):
                rows = a[h]
                ent = [-sum(p * math.log(p) for p in row if p > 0) for row in rows]
                values[layer, h] = [
                    np.mean(ent), math.log(n),
                    np.mean([sum(rows[i, j] for j in range(n) if ids[j] == tok.cls_token_id) for i in range(n)]),
                    np.mean([sum(rows[i, j] for j in range(n) if ids[j] == tok.sep_token_id) for i in range(n)]),
                    np.mean([sum(rows[i, j] for j in range(n) if ids[j] in punct) for i in range(n)]),
                    np.mean([rows[i, i] for i in range(n)]), np.mean([rows[i, i - 1] for i in range(1, n)]),
                    np.mean([rows[i, i + 1] for i in range(n - 1)]),
                    np.mean([sum(rows[i, j] * abs(i - j) for j in range(n)) for i in range(n)])]
        per_sentence.append(values)
    return np.stack(per_sentence)


@pytest.mark.parametrize("family", FAMILIES)
def test_statistics_equal_a_plain_loop_over_transformers(tiny_dirs, family):
    loaded = load_eager(ModelSpec(str(tiny_dirs[family]), device="cpu"))
    result = analyse(loaded, TEXTS, batch_size=2, max_cells=200)  # several batches, padded ones included
    ref = reference_statistics(tiny_dirs[family], TEXTS.texts)
    table = result.heads
    layers, heads = ref.shape[1:3]
    assert len(table) == layers * heads and (table["sentences"] == len(TEXTS.texts)).all()
    mean = ref.mean(0)
    half = 2.7764451051977987 * ref.std(0, ddof=1) / math.sqrt(len(ref))  # t_{0.975, 4}
    for k, name in enumerate(STATISTICS):
        got = table[name].to_numpy().reshape(layers, heads)
        np.testing.assert_allclose(got, mean[..., k], rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(table[f"{name}_high"].to_numpy().reshape(layers, heads) - got, half[..., k],
                                   rtol=1e-3, atol=1e-5, err_msg=name)
        assert (table[f"{name}_low"] <= table[name] + 1e-12).all() and (table[name] <= table[f"{name}_high"] +
                                                                         1e-12).all()
    assert result.clusters is not None and list(result.clusters.columns) == ["layer", "head", "x", "y"]
    assert result.relations is None  # texts: no parsing
    # the baseline beside each statistic: uniform attention over each sentence, by a plain loop over its ids
    tok = AutoTokenizer.from_pretrained(tiny_dirs[family])
    punct = set(punctuation_ids(tok).nonzero()[0].tolist())
    plain = []
    for text in TEXTS.texts:
        ids = tok(text)["input_ids"]
        n = len(ids)
        plain.append({"entropy": math.log(n), "cls": ids.count(tok.cls_token_id) / n,
                      "sep": ids.count(tok.sep_token_id) / n, "punct": sum(i in punct for i in ids) / n,
                      "self": 1 / n, "previous": 1 / n, "next": 1 / n,
                      "distance": np.mean([sum(abs(i - j) for j in range(n)) / n for i in range(n)])})
    for name, value in result.info["uniform_attention"].items():
        assert value == pytest.approx(np.mean([row[name] for row in plain]), rel=1e-5), name


def planted(n_sentences, length, make_row):
    """``(sentences, 1, length, length)`` attention with ``make_row(s, i)`` as row ``i`` of sentence ``s``."""
    a = torch.zeros((n_sentences, 1, length, length), dtype=torch.float64)
    for s in range(n_sentences):
        for i in range(length):
            a[s, 0, i] = torch.as_tensor(make_row(s, i))
    return a


def test_a_previous_token_head_scores_one_for_previous():
    length = 6

    def row(s, i):
        out = np.zeros(length)
        out[max(i - 1, 0) if i else 0] = 1.0  # the first token attends to itself
        return out

    stats = TokenStatistics(1, 1)
    flags = torch.zeros((3, length, 3))
    flags[:, 0, 0] = 1  # [CLS]
    flags[:, -1, 1] = 1  # [SEP]
    stats.add(0, planted(3, length, row), torch.tensor([length] * 3), flags)
    t = stats.table().iloc[0]
    assert t["previous"] == 1 and t["next"] == 0 and t["entropy"] == 0
    assert t["self"] == pytest.approx(1 / length) and t["distance"] == pytest.approx((length - 1) / length)
    assert t["cls"] == pytest.approx(2 / length) and t["sep"] == 0
    assert t["previous_low"] == t["previous_high"] == 1  # the same in every sentence


def test_the_t_interval_contains_its_estimate_and_covers_a_planted_value_at_its_rate():
    """Each sentence's share of attention to itself is planted as p_s ~ Beta(2, 5) (mean 2/7), the rest spread
    evenly; 400 corpora of 30 sentences: the 95% interval covers 2/7 in 95% of them (binomial tolerance)."""
    rng = np.random.default_rng(7)
    length, n, trials, covered = 5, 30, 400, 0
    lengths = torch.tensor([length] * n)
    flags = torch.zeros((n, length, 3))
    eye = torch.eye(length, dtype=torch.float64)
    for _ in range(trials):
        p = torch.as_tensor(rng.beta(2, 5, n))[:, None, None, None]
        a = p * eye + (1 - p) * (1 - eye) / (length - 1)
        stats = TokenStatistics(1, 1)
        stats.add(0, a, lengths, flags)
        row = stats.table().iloc[0]
        assert row["self_low"] <= row["self"] <= row["self_high"]
        covered += row["self_low"] <= 2 / 7 <= row["self_high"]
    rate = covered / trials
    assert abs(rate - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / trials), rate


def test_t_interval_matches_scipy():
    from scipy import stats

    x = np.random.default_rng(0).normal(size=17)
    mean, low, high = t_interval(x.sum(), (x * x).sum(), len(x))
    ref = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert (low, high) == pytest.approx(ref) and mean == pytest.approx(x.mean())
    assert np.isnan(t_interval(np.array(1.0), np.array(1.0), 1)[1])


def test_js_distances_equal_scipy():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6), size=(4, 5))  # 4 tokens, 5 heads, 6 positions
    p[0, 0, :2] = 0
    p[0, 0] /= p[0, 0].sum()
    got = js_distances(torch.from_numpy(p), chunk_elements=50).numpy()
    ref = np.array([[sum(jensenshannon(p[t, i], p[t, j], base=2) for t in range(4)) for j in range(5)]
                    for i in range(5)])
    np.testing.assert_allclose(got, ref, atol=2e-6)


def test_the_head_map_is_seeded(tiny_dirs):
    loaded = load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    a = analyse(loaded, TEXTS, cluster_tokens=20, seed=3).clusters
    b = analyse(loaded, TEXTS, cluster_tokens=20, seed=3).clusters
    assert a.equals(b) and len(a) == 6 and np.isfinite(a[["x", "y"]].to_numpy()).all()


@pytest.mark.parametrize("family", ["wordpiece", "sentencepiece", "bpe"])
def test_word_attention_sums_attended_pieces_and_averages_attending_ones(families, family):  # noqa: F811
    loaded = load_eager(ModelSpec(str(families[family]), device="cpu"))
    encoded = encode_words(loaded.tokenizer, SENTENCES, 1000)
    ref_tok = reference_tokenizer(families[family])
    model = AutoModel.from_pretrained(families[family], attn_implementation="eager").eval()
    idx = [0, 6, 2]  # the last sentence splits words into several pieces
    width = max(len(encoded.input_ids[i]) for i in idx)
    maps = []
    for i in idx:
        enc = ref_tok(SENTENCES[i], is_split_into_words=True, return_tensors="pt")
        assert enc.word_ids() == encoded.word_ids[i]
        with torch.no_grad():
            a = model(**enc, output_attentions=True).attentions[-1][0]
        padded = torch.zeros((a.shape[0], width, width))
        padded[:, :a.shape[1], :a.shape[1]] = a
        maps.append(padded)
    assert any(len([w for w in encoded.word_ids[6] if w == k]) > 1 for k in range(len(SENTENCES[6])))
    mean, total = pooling_matrices([encoded.word_ids[i] for i in idx], [len(SENTENCES[i]) for i in idx], width)
    words = word_attention(torch.stack(maps), mean, total).numpy()
    for row, i in enumerate(idx):
        n = len(SENTENCES[i])
        ref = word_attention_loop(maps[row].numpy(), encoded.word_ids[i], n)
        np.testing.assert_allclose(words[row, :, :n, :n], ref, atol=1e-6)
        assert np.all(words[row, :, n:, :] == 0) and np.all(words[row, :, :, n:] == 0)


def test_punctuation_in_each_tokenizer(families):  # noqa: F811
    for name in ("wordpiece", "sentencepiece", "bpe"):
        tok = AutoTokenizer.from_pretrained(families[name])
        marks = punctuation_ids(tok)
        for text in (",", "?"):
            ids = [i for i in tok(text, add_special_tokens=False)["input_ids"]]
            assert any(marks[i] for i in ids), (name, text, tok.convert_ids_to_tokens(ids))
        word = tok("film", add_special_tokens=False)["input_ids"]
        assert not any(marks[i] for i in word)
        assert not marks[tok.cls_token_id] and not marks[tok.sep_token_id]


def test_bad_inputs(tiny_dirs):
    spec = ModelSpec(str(tiny_dirs["bert"]), device="cpu")
    with pytest.raises(InputError, match="gives no attention weights"):
        analyse(load_model(spec), TEXTS)  # the default (SDPA) path
    with pytest.raises(InputError, match="corpus is empty"):
        analyse(load_eager(spec), TextInputs(()))
