"""Head statistics over a corpus, Clark et al. 2019 ("What Does BERT Look At?") §3, and heads clustered by
behaviour (§6, Fig. 6).

For every attention layer and head, each statistic is first averaged over the attending tokens of one sentence
(every real token attends, [CLS]/[SEP] included, as in §3; padding never), giving one value per sentence:

- ``entropy``: ``-sum_j a_ij log a_ij`` (nats), against ``uniform_entropy`` ``log n`` (the entropy of uniform
  attention over the same sentence's ``n`` tokens; §3.3, Fig. 4);
- ``cls``, ``sep``: the share of attention to the family's own start and separator tokens (``[CLS]``/``[SEP]``,
  ``<s>``/``</s>``: the tokenizer's ``cls_token_id`` and ``sep_token_id``; §3.2, Fig. 2);
- ``punct``: the share to punctuation tokens (a token whose text, its ``##``/``Ġ``/``▁`` marks aside, is all
  Unicode punctuation; Clark count periods and commas only);
- ``self``, ``previous``, ``next``: ``a_ii``, ``a_i,i-1``, ``a_i,i+1`` (§3.1, Fig. 1): ``previous`` averages over
  the tokens that have one (not the first), ``next`` over those that have one (not the last), so a head that
  always attends to the previous token scores exactly 1;
- ``distance``: the mean attention distance ``sum_j a_ij |i - j|`` in tokens.

**Estimate and interval.** The estimate is the mean of the sentence means; its interval is Student's t interval
over sentences (``mean +- t_{0.975, N-1} s / sqrt(N)``): tokens of one sentence are not independent, sentences
are (the cluster, here the sentence, is the unit of resampling; e.g. Cameron & Miller 2015, "A Practitioner's
Guide to Cluster-Robust Inference", §II). A test plants per-sentence values with a known mean and checks the
interval's coverage at its stated 95%.

**Memory.** Nothing of size ``sentences x layers x heads x n^2`` is kept: each batch's attention is reduced to
per-sentence means at once, and only the running sums ``sum m`` and ``sum m^2`` per ``(layer, head, statistic)``
(float64) stay: ``O(layers x heads x statistics)``.

**Clusters** (§6): the Jensen-Shannon distance (``sqrt`` of the base-2 divergence: a metric in [0, 1], scipy's
``jensenshannon``) between every pair of heads' attention distributions of the same token, averaged over a
seeded sample of at most ``cluster_tokens`` attending tokens (all of them in a small corpus), then a 2-D MDS of
that dissimilarity (scikit-learn's metric MDS, precomputed, seeded). Clark sum the divergence over their data;
the sample bounds the ``tokens x heads^2 x n`` cost (bert-base: 144 heads, 10,296 pairs per token).
"""

from __future__ import annotations

import math
import threading
import unicodedata
import weakref

import numpy as np
import pandas as pd
import torch
from scipy.stats import t as student_t

from analysis.core.transfer import to_host

STATISTICS = ("entropy", "uniform_entropy", "cls", "sep", "punct", "self", "previous", "next", "distance")
LEVEL = 0.95

_PUNCT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def is_punctuation(text: str) -> bool:
    text = text.strip().removeprefix("##").lstrip("Ġ▁").strip()
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def punctuation_ids(tokenizer) -> np.ndarray:
    """``(vocabulary,)`` bool: which token ids are punctuation (:func:`is_punctuation` of the token's text, read
    through the tokenizer's own decoder, so byte-level BPE's ``Ġ,`` is a comma); special tokens never. Made once
    per tokenizer."""
    with _LOCK:
        found = _PUNCT.get(tokenizer)
        if found is None:
            size = len(tokenizer)
            tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
            special = set(tokenizer.all_special_ids)
            found = np.zeros(size, bool)
            for i, token in enumerate(tokens):
                if token is not None and i not in special and any(not c.isalnum() for c in token):
                    found[i] = is_punctuation(tokenizer.convert_tokens_to_string([token]))
            _PUNCT[tokenizer] = found
        return found


def t_interval(total: np.ndarray, squares: np.ndarray, n: np.ndarray, level: float = LEVEL
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, low, high)`` of ``n`` observations from their sum and sum of squares: Student's t interval (NaN
    bounds for fewer than 2 observations)."""
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / n
        var = np.maximum(squares - n * mean * mean, 0.0) / (n - 1)
        half = student_t.ppf(0.5 + level / 2, np.maximum(n - 1, 1)) * np.sqrt(var / n)
    half = np.where(n >= 2, half, np.nan)
    return mean, mean - half, mean + half


class TokenStatistics:
    """Running sums of the per-sentence means of :data:`STATISTICS` per ``(layer, head)``."""

    STATE = ("total", "squares", "count")  # what changes as batches are added

    def __init__(self, layers: int, heads: int):
        self.layers, self.heads = layers, heads
        shape = (layers, heads, len(STATISTICS))
        self.total, self.squares = np.zeros(shape), np.zeros(shape)
        self.count = np.zeros((layers, len(STATISTICS)))

    def add(self, layer: int, attn: torch.Tensor, lengths: torch.Tensor, flags: torch.Tensor) -> None:
        """One layer of one batch: ``attn`` ``(batch, heads, width, width)`` (0-based ``layer``), ``lengths``
        ``(batch,)`` tokens per sentence, ``flags`` ``(batch, width, 3)`` float: is [CLS], is [SEP], is
        punctuation."""
        a = attn.float()
        lengths, flags = lengths.to(a.device), flags.to(a.device)
        width = a.shape[-1]
        pos = torch.arange(width, device=a.device)
        valid = pos[None, :] < lengths[:, None]  # (batch, width): real tokens
        shares = a @ flags[:, None].to(a.dtype)  # (batch, heads, width, 3)
        values = torch.empty((*a.shape[:3], len(STATISTICS)), dtype=a.dtype, device=a.device)
        values[..., 0] = -torch.special.xlogy(a, a).sum(-1)
        values[..., 1] = torch.log(lengths.to(a.dtype))[:, None, None]
        values[..., 2:5] = shares
        values[..., 5] = a.diagonal(dim1=-2, dim2=-1)
        values[..., 6] = 0
        values[..., 6][..., 1:] = a.diagonal(offset=-1, dim1=-2, dim2=-1)
        values[..., 7] = 0
        values[..., 7][..., :-1] = a.diagonal(offset=1, dim1=-2, dim2=-1)
        gap = (pos[:, None] - pos[None, :]).abs().to(a.dtype)
        values[..., 8] = (a * gap).sum(-1)
        rows = valid[..., None].expand(-1, -1, len(STATISTICS)).clone()  # (batch, width, statistics)
        rows[:, 0, 6] = False
        rows[..., 7] &= (pos[None, :] + 1 < lengths[:, None])
        weight = rows.to(a.dtype)
        counts = weight.sum(1)  # (batch, statistics)
        sums = torch.einsum("bhns,bns->bhs", values, weight)
        means = (sums / counts.clamp(min=1)[:, None, :]).double()  # (batch, heads, statistics)
        has = counts > 0  # (batch, statistics)
        means = torch.where(has[:, None, :], means, 0.0)
        # reduced over the batch where the maps are (the GPU): three small arrays reach the host, in one copy
        total, squares, count = to_host([means.sum(0), (means * means).sum(0), has.sum(0)])
        self.total[layer] += total
        self.squares[layer] += squares
        self.count[layer] += count

    def table(self) -> pd.DataFrame:
        """heads.csv: ``layer`` (1-based), ``head`` (0-based), ``sentences``, then per statistic its estimate,
        ``<statistic>_low`` and ``<statistic>_high`` (the 95% t interval over sentences)."""
        n = np.broadcast_to(self.count[:, None, :], self.total.shape)
        mean, low, high = t_interval(self.total, self.squares, n)
        layer, head = np.meshgrid(np.arange(1, self.layers + 1), np.arange(self.heads), indexing="ij")
        columns = {"layer": layer.ravel(), "head": head.ravel(), "sentences": n[..., 0].ravel().astype(int)}
        for k, name in enumerate(STATISTICS):
            columns[name] = mean[..., k].ravel()
            columns[f"{name}_low"] = low[..., k].ravel()
            columns[f"{name}_high"] = high[..., k].ravel()
        return pd.DataFrame(columns)


def js_distances(p: torch.Tensor, chunk_elements: int = 1 << 19) -> torch.Tensor:
    """``(K, K)`` sum over the ``t`` rows of ``p`` ``(t, K, n)`` (K distributions over n outcomes per row) of
    the Jensen-Shannon distance between every two of them: ``sqrt(JS / ln 2)``, ``JS = H(m) - (H(p) + H(q)) / 2``,
    ``m = (p + q) / 2``. Each unordered pair once, worked on ``chunk_elements`` of the ``(t, pairs, n)`` sums at a
    time (small enough to stay in cache: the work is elementwise)."""
    t, k, n = p.shape
    p = p.float()
    first, second = torch.triu_indices(k, k, 1)
    h = -torch.special.xlogy(p, p).sum(-1)  # (t, K)
    pairs = torch.zeros(len(first), dtype=torch.float64)
    step = max(1, chunk_elements // max(1, len(first) * n))
    for start in range(0, t, step):
        q = p[start:start + step]
        twice = q[:, first] + q[:, second]  # 2m
        # H(m) = -sum m log m = -(1/2) sum 2m log 2m + ln 2 (each m sums to 1)
        hm = -0.5 * (twice * twice.clamp_min(1e-30).log()).sum(-1) + math.log(2) * 0.5 * twice.sum(-1)
        js = (hm - 0.5 * (h[start:start + step, first] + h[start:start + step, second])).clamp(min=0)
        pairs += torch.sqrt(js / math.log(2)).sum(0).double()
    out = torch.zeros((k, k), dtype=torch.float64)
    out[first, second] = pairs
    out[second, first] = pairs
    return out


class HeadClusters:
    """Running sum of :func:`js_distances` over the sampled tokens."""

    STATE = ("total", "tokens")  # what changes as batches are added

    def __init__(self, layers: int, heads: int):
        self.layers, self.heads = layers, heads
        self.total = torch.zeros((layers * heads,) * 2, dtype=torch.float64)
        self.tokens = 0

    def add(self, rows: torch.Tensor) -> None:
        """``rows`` ``(tokens, layers * heads, width)``: each sampled token's attention row in every head."""
        if len(rows):
            self.total += js_distances(rows)
            self.tokens += len(rows)

    def distances(self) -> np.ndarray:
        """``(layers * heads, layers * heads)`` mean JS distance (layer-major: index ``layer * heads + head``)."""
        out = (self.total / max(self.tokens, 1)).numpy()
        return (out + out.T) / 2

    def table(self, seed: int = 0) -> pd.DataFrame:
        """clusters.csv: ``layer`` (1-based), ``head`` (0-based), ``x``, ``y`` (the heads' 2-D MDS map)."""
        from sklearn.manifold import MDS

        d = self.distances()
        xy = MDS(n_components=2, metric="precomputed", init="classical_mds", n_init=1,
                 random_state=seed).fit_transform(d)
        layer, head = np.divmod(np.arange(len(d)), self.heads)
        return pd.DataFrame({"layer": layer + 1, "head": head, "x": xy[:, 0], "y": xy[:, 1]})


def sample_tokens(lengths: list[int], limit: int, seed: int = 0) -> set[tuple[int, int]]:
    """At most ``limit`` ``(sentence, position)`` pairs drawn without replacement, seeded (every token when the
    corpus has no more)."""
    total = int(sum(lengths))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    picks = np.arange(total) if total <= limit else np.random.default_rng(seed).choice(total, limit, replace=False)
    sentence = np.searchsorted(offsets, picks, side="right") - 1
    return {(int(s), int(p - offsets[s])) for s, p in zip(sentence, picks, strict=True)}
