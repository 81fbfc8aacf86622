"""The geometry of each layer's token vectors (issue 29 item 4), streamed from the mapped float16 shards.

Following Ethayarajh (2019, *How contextual are contextualized word representations?*) and Timkey & van
Schijndel (2021, *All bark and no bite: rogue dimensions ...*), per hidden state:

- **anisotropy**: the expected cosine between two different tokens of the corpus, over *all* pairs, exactly:
  with ``u_i = x_i / |x_i|`` and ``S = sum_i u_i``, ``mean_{i != j} cos = (|S|^2 - n) / (n (n - 1))``;
- **rogue dimensions**: the same sum split by dimension, ``c_k = (S_k^2 - sum_i u_ik^2) / (n (n - 1))`` (the
  ``c_k`` add up to the anisotropy); the dimensions with the largest ``c_k`` and their share;
- **self-similarity**: the mean cosine between the occurrences of one word type (case-folded word, its first
  subword; types seen at least ``min_count`` times, up to ``max_types`` types and ``max_occurrences`` each,
  sampled), averaged over types; also minus the anisotropy (Ethayarajh's baseline-adjusted figure);
- **intra-sentence similarity**: the mean cosine between a text's tokens and the text's mean vector, averaged over
  up to ``max_texts`` sampled texts; also minus the anisotropy;
- **variance**: the covariance's eigenvalues: the share of variance in the top 1 and top 10 principal
  components, the components for 90 %, and the effective rank ``exp(H(lambda / sum lambda))`` (Roy & Vetterli).

Intervals (95 %), over ``blocks`` contiguous groups of texts (documents are runs of texts: a block keeps their
correlation):

- anisotropy and rogue dimensions: a bootstrap of the blocks, each replicate the exact all-pairs U-statistic of the
  resampled multiset (pairs of a token with its own copy left out);
- the variance statistics (top-1 and top-10 variance, components for 90 %, effective rank): a delete-a-block
  jackknife (:func:`analysis.core.jackknife.jackknife`, Busing et al. 1999), never a bootstrap: a bootstrap resample
  repeats whole blocks, and the covariance of repeated rows has fewer effective directions, so its intervals sat
  below the estimate (issue 34). The interval is the jackknife's bias-corrected value +- ``t(g-1)`` standard
  errors (``g`` blocks), widened where needed to contain the estimate itself. These statistics are biased in
  small samples (the sample covariance's eigenvalues spread out: the effective rank of isotropic data comes out
  low); the jackknife removes the bias of order 1/n, so the interval aims at the population value. Measured
  coverage on planted data is in docs/tokens.md; top-1 and top-10 variance of a spectrum with equal leading
  eigenvalues (isotropic data) are not covered: the largest sample eigenvalue's bias there is not of order 1/n;
- self-similarity and intra-sentence similarity: a bootstrap over the sampled types and texts.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from scipy import stats
from threadpoolctl import threadpool_limits

from analysis.core.jackknife import jackknife
from analysis.tokens.search import normalise
from analysis.tokens.vectors import TokenVectors

ALPHA = 0.05


def _interval(values: np.ndarray) -> tuple[float, float]:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if not len(values):
        return float("nan"), float("nan")
    return float(np.quantile(values, ALPHA / 2)), float(np.quantile(values, 1 - ALPHA / 2))


def block_of_rows(text_ids: np.ndarray, n_texts: int, blocks: int) -> np.ndarray:
    return (text_ids.astype(np.int64) * blocks) // max(1, n_texts)


def pair_cosine(u: np.ndarray) -> float:
    """Mean cosine over the distinct pairs of rows of ``u`` (rows normalised here): ``(|S|^2 - n) / (n(n-1))``."""
    u = normalise(u).astype(np.float64)
    n = len(u)
    s = u.sum(0)
    return float((s @ s - (u * u).sum()) / (n * (n - 1)))


def _variance(cov: np.ndarray) -> dict:
    lam = np.clip(np.linalg.eigvalsh(cov)[::-1], 0, None)
    total = lam.sum()
    if total <= 0:
        return {"top1_variance": np.nan, "top10_variance": np.nan, "components_90": np.nan, "effective_rank": np.nan}
    p = lam / total
    nz = p[p > 0]
    return {"top1_variance": float(p[0]), "top10_variance": float(p[:10].sum()),
            "components_90": int(np.searchsorted(np.cumsum(p), 0.9) + 1),
            "effective_rank": float(np.exp(-(nz * np.log(nz)).sum()))}


def variance_intervals(acc: dict, value: dict) -> dict:
    """``{name: (low, high)}`` of each variance statistic (``value``: :func:`_variance` of all rows) by the
    delete-a-block jackknife over the accumulated blocks (``acc``: :func:`stream_layer`): each block's rows left
    out in turn (empty blocks are no units), weighted by the blocks' row counts; bias-corrected value +-
    ``t(g-1)`` se, widened to contain ``value``, kept in the statistic's range (a share in [0, 1], a count or a
    rank in [1, hidden])."""
    N = acc["N"]
    live = np.flatnonzero(N > 0)
    leave_out = []
    for j in live:
        w = np.ones(len(N))
        w[j] = 0
        leave_out.append(_variance(_covariance(acc["X"], acc["XX"], N, w)))
    t = stats.t.ppf(1 - ALPHA / 2, max(len(live) - 1, 1))
    d = acc["X"].shape[1]
    bounds = {"top1_variance": (0, 1), "top10_variance": (0, 1), "components_90": (1, d), "effective_rank": (1, d)}
    out = {}
    for name, estimate in value.items():
        se, bias = jackknife(estimate, [v[name] for v in leave_out], N[live])
        if not (np.isfinite(estimate) and np.isfinite(se)):
            out[name] = (float("nan"), float("nan"))
            continue
        centre, (lowest, highest) = estimate - bias, bounds.get(name, (-np.inf, np.inf))
        out[name] = (float(max(lowest, min(estimate, centre - t * se))),
                     float(min(highest, max(estimate, centre + t * se))))
    return out


def stream_layer(tv: TokenVectors, layer: int, block_ids: np.ndarray, blocks: int) -> dict:
    """One pass over a layer's shards: per block, the sum of unit vectors ``S``, of their squares ``Q``, the
    count, the sum of raw vectors and of their outer products (float64)."""
    d = tv.hidden
    S = np.zeros((blocks, d))
    Q = np.zeros((blocks, d))
    N = np.zeros(blocks)
    X = np.zeros((blocks, d))
    XX = np.zeros((blocks, d, d))
    for first, block in tv.layer_blocks(layer):
        ids = block_ids[first:first + len(block)]
        for lo in range(0, len(block), 65_536):
            x = np.asarray(block[lo:lo + 65_536], dtype=np.float32)
            b = ids[lo:lo + len(x)]
            u = normalise(x)
            for g in np.unique(b):  # rows are in text order: a block is one or two runs here
                sel = slice(np.searchsorted(b, g), np.searchsorted(b, g, side="right"))
                S[g] += u[sel].sum(0, dtype=np.float64)
                Q[g] += (u[sel].astype(np.float64) ** 2).sum(0)
                N[g] += sel.stop - sel.start
                X[g] += x[sel].sum(0, dtype=np.float64)
                XX[g] += (x[sel].T @ x[sel]).astype(np.float64)
    return {"S": S, "Q": Q, "N": N, "X": X, "XX": XX}


def _anisotropy(S, Q, N, w=None):
    """``(total, per-dimension)`` all-pairs mean cosine of the (weighted) blocks."""
    w = np.ones(len(N)) if w is None else w
    s = w @ S
    same = (w ** 2) @ Q  # a token paired with itself or one of its copies: left out
    pairs = (w @ N) ** 2 - (w ** 2) @ N
    per_dim = (s ** 2 - same) / pairs
    return float(per_dim.sum()), per_dim


def _covariance(X, XX, N, w=None):
    w = np.ones(len(N)) if w is None else w
    n = w @ N
    mean = (w @ X) / n
    return (np.tensordot(w, XX, 1) - n * np.outer(mean, mean)) / max(n - 1, 1)


def _positions(keys: np.ndarray) -> list[np.ndarray]:
    """The positions of each distinct key, keys in sorted order."""
    return list(pd.Series(np.arange(len(keys))).groupby(keys).indices.values())


def word_types(tokens: pd.DataFrame, min_count: int = 5, max_types: int = 1000, max_occurrences: int = 20,
               seed: int = 0) -> list[np.ndarray]:
    """Rows of the sampled word types' occurrences (first subword of each word; the token where no word)."""
    first = tokens[tokens["first_subword"] | (tokens["word_index"] < 0)]
    key = first["word"].where(first["word"] != "", first["token"]).str.casefold()
    rows = first["row"].to_numpy()
    groups = [rows[pos] for pos in _positions(key.to_numpy()) if len(pos) >= min_count]
    rng = np.random.default_rng(seed)
    if len(groups) > max_types:
        groups = [groups[i] for i in np.sort(rng.choice(len(groups), max_types, replace=False))]
    return [np.sort(rng.choice(g, max_occurrences, replace=False)) if len(g) > max_occurrences else g
            for g in groups]


def sample_texts(tokens: pd.DataFrame, max_texts: int = 1000, seed: int = 0) -> list[np.ndarray]:
    """Rows of up to ``max_texts`` sampled texts with at least two tokens (each text's rows)."""
    rows = tokens["row"].to_numpy()
    groups = [rows[pos] for pos in _positions(tokens["text_id"].to_numpy()) if len(pos) >= 2]
    rng = np.random.default_rng(seed)
    if len(groups) > max_texts:
        groups = [groups[i] for i in np.sort(rng.choice(len(groups), max_texts, replace=False))]
    return groups


def _group_means(tv: TokenVectors, layer: int, groups: list[np.ndarray], fn) -> np.ndarray:
    if not groups:
        return np.zeros(0)
    rows = np.concatenate(groups)
    vecs = tv.rows_at(layer, rows)
    out, start = [], 0
    for g in groups:
        out.append(fn(vecs[start:start + len(g)]))
        start += len(g)
    return np.asarray(out)


def _intra(x: np.ndarray) -> float:
    mean = x.mean(0, keepdims=True)
    return float((normalise(x) @ normalise(mean).T).mean())


def geometry(tv: TokenVectors, layers: list[int] | None = None, blocks: int = 20, boots: int = 200,
             min_count: int = 5, max_types: int = 1000, max_occurrences: int = 20, max_texts: int = 1000,
             rogue: int = 10, seed: int = 0, progress=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(per-layer table, rogue-dimension table)`` for ``layers`` (default: every extracted layer)."""
    layers = layers or tv.layers
    tokens = tv.tokens(["row", "text_id", "token", "word", "word_index", "first_subword"])
    n_texts = int(tokens["text_id"].max()) + 1
    blocks = max(2, min(blocks, n_texts))
    block_ids = block_of_rows(tokens["text_id"].to_numpy(), n_texts, blocks)
    types = word_types(tokens, min_count, max_types, max_occurrences, seed)
    texts = sample_texts(tokens, max_texts, seed)
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(blocks, np.full(blocks, 1 / blocks), size=boots).astype(np.float64)
    type_boot = rng.integers(0, max(1, len(types)), size=(boots, len(types)))
    text_boot = rng.integers(0, max(1, len(texts)), size=(boots, len(texts)))
    rows, rogues = [], []
    for done, layer in enumerate(layers):
        acc = stream_layer(tv, layer, block_ids, blocks)
        aniso, per_dim = _anisotropy(acc["S"], acc["Q"], acc["N"])
        boot = [_anisotropy(acc["S"], acc["Q"], acc["N"], w) for w in weights]
        boot_total = np.array([b[0] for b in boot])
        boot_dims = np.array([b[1] for b in boot])
        with threadpool_limits(1, "blas"):  # small eigh's: OpenBLAS's threads spin-wait under a busy core (seconds)
            var = _variance(_covariance(acc["X"], acc["XX"], acc["N"]))
            var_ci = variance_intervals(acc, var)
        self_sim = _group_means(tv, layer, types, pair_cosine)
        intra = _group_means(tv, layer, texts, _intra)
        row = {"layer": layer, "tokens": tv.rows, "anisotropy": aniso}
        row["anisotropy_low"], row["anisotropy_high"] = _interval(boot_total)
        if len(self_sim):
            row["self_similarity"] = float(self_sim.mean())
            row["self_similarity_low"], row["self_similarity_high"] = _interval(self_sim[type_boot].mean(1))
            row["self_similarity_adjusted"] = row["self_similarity"] - aniso
        else:
            row.update(self_similarity=np.nan, self_similarity_low=np.nan, self_similarity_high=np.nan,
                       self_similarity_adjusted=np.nan)
        row["word_types"] = len(types)
        if len(intra):
            row["intra_similarity"] = float(intra.mean())
            row["intra_similarity_low"], row["intra_similarity_high"] = _interval(intra[text_boot].mean(1))
            row["intra_similarity_adjusted"] = row["intra_similarity"] - aniso
        else:
            row.update(intra_similarity=np.nan, intra_similarity_low=np.nan, intra_similarity_high=np.nan,
                       intra_similarity_adjusted=np.nan)
        row["texts_sampled"] = len(texts)
        for name, value in var.items():
            row[name] = value
            row[f"{name}_low"], row[f"{name}_high"] = var_ci[name]
        order = np.argsort(-per_dim)[:rogue]
        share = per_dim / aniso if aniso != 0 else np.full_like(per_dim, np.nan)
        row["rogue_dims"] = json.dumps([int(k) for k in order[:3]])
        row["rogue_top3_share"] = float(share[order[:3]].sum())
        rows.append(row)
        for rank, k in enumerate(order, 1):
            low, high = _interval(boot_dims[:, k])
            rogues.append({"layer": layer, "rank": rank, "dim": int(k), "contribution": float(per_dim[k]),
                           "contribution_low": low, "contribution_high": high, "share": float(share[k])})
        if progress:
            progress("geometry", done + 1, len(layers))
    return pd.DataFrame(rows), pd.DataFrame(rogues)
