"""Nearest tokens per layer by cosine (issue 29 item 2): faiss indexes over L2-normalised float32 vectors,
cached beside the vectors, and a brute-force search that streams the float16 shards (the baseline and the
reference for recall).

Index kinds (``KINDS``): ``flat`` (exact: the normalised rows as a memory-mapped ``.npy``, scanned by
``faiss.knn``), ``hnsw`` (``IndexHNSWFlat``, inner product) and ``ivf`` (``IndexIVFFlat``, inner product, trained
on ``s = min(n, 65,536)`` sampled rows: ``nlist = min(floor(4 sqrt(n)), s // 39)`` cells, ``nprobe = ceil(nlist /
16)``; so ``n // 39`` cells below 24,336 rows and 1,680 above 176,400).
``auto``, the default, is ``flat`` up to :data:`EXACT_ROWS` rows and ``ivf`` above, as measured in
``docs/tokens.md``. An index is an entry of the store derived from its vectors (:class:`analysis.core.store.Derived`):
its file written to a temporary file and renamed (``index/layerNN.flat.npy``, ``index/layerNN.KIND.faiss``), then
its manifest ``.json`` (parameters, build time, size, recall@10 against exact); cut or damaged, it is built again.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core.inputs import InputError
from analysis.core.staging import open_npy, save_npy
from analysis.tokens.vectors import TokenVectors

KINDS = ("flat", "hnsw", "ivf")
DEFAULT_KIND = "auto"  # flat up to EXACT_ROWS rows, ivf above (measured: docs/tokens.md)
EXACT_ROWS = 1_000_000
SINGLE_THREAD_QUERIES = 8
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 80, 64
IVF_TRAIN_ROWS = 65_536


def normalise(block: np.ndarray) -> np.ndarray:
    """float32 rows of unit L2 norm (a zero row stays zero)."""
    x = np.asarray(block, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1)


def layer_matrix(tv: TokenVectors, layer: int) -> np.ndarray:
    """``(rows, hidden)`` float32, normalised: one layer in memory (4 bytes x rows x hidden)."""
    out = np.empty((tv.rows, tv.hidden), np.float32)
    for first, block in tv.layer_blocks(layer):
        out[first:first + len(block)] = normalise(block)
    return out


def layer_moments(tv: TokenVectors, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, standard deviation)`` per dimension of hidden state ``layer`` (float64 sums over the shards),
    cached in ``index/layerNN.moments.npy``, an entry of the store (a cut or damaged file is computed again)."""
    entry = tv.derived("index", f"layer{layer:02d}.moments.npy")
    if entry.read((2, tv.hidden)) is not None:
        both = np.load(entry.path)
        return both[0], both[1]
    total = np.zeros(tv.hidden)
    squares = np.zeros(tv.hidden)
    for _first, block in tv.layer_blocks(layer):
        for lo in range(0, len(block), 65_536):
            x = np.asarray(block[lo:lo + 65_536], dtype=np.float64)
            total += x.sum(0)
            squares += (x * x).sum(0)
    mean = total / tv.rows
    std = np.sqrt(np.maximum(squares / tv.rows - mean ** 2, 0))
    entry.write(lambda p: save_npy(p, np.stack([mean, std])), {"layer": layer, "rows": tv.rows, "what": "mean and "
                "standard deviation per dimension (float64 sums over every row)"})
    return mean, std


def standardiser(tv: TokenVectors, layer: int):
    """Timkey & van Schijndel's (2021) standardisation of hidden state ``layer``: each dimension z-scored over the
    corpus, so that no rogue dimension dominates the cosine."""
    mean, std = layer_moments(tv, layer)
    scale = np.where(std > 0, std, 1).astype(np.float32)
    centre = mean.astype(np.float32)
    return lambda x: (np.asarray(x, dtype=np.float32) - centre) / scale


def brute_force(tv: TokenVectors, layer: int, queries: np.ndarray, k: int, chunk: int = 65_536,
                transform=None) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine search in plain numpy, streaming the mapped shards ``chunk`` rows at a time: ``(scores,
    rows)``, each ``(len(queries), k)``, best first (ties by row). ``queries`` are normalised here; ``transform``
    (e.g. :func:`standardiser`) is applied to the queries and the rows first."""
    transform = transform or (lambda x: x)
    q = normalise(transform(np.atleast_2d(queries)))
    k = min(k, tv.rows)
    best_s = np.full((len(q), 0), -np.inf, np.float32)
    best_i = np.zeros((len(q), 0), np.int64)
    for first, block in tv.layer_blocks(layer):
        for lo in range(0, len(block), chunk):
            x = normalise(transform(block[lo:lo + chunk]))
            scores = q @ x.T
            idx = np.broadcast_to(np.arange(first + lo, first + lo + len(x)), scores.shape)
            best_s = np.concatenate([best_s, scores], axis=1)
            best_i = np.concatenate([best_i, idx], axis=1)
            if best_s.shape[1] > k:
                keep = np.argpartition(-best_s, k - 1, axis=1)[:, :k]
                best_s = np.take_along_axis(best_s, keep, 1)
                best_i = np.take_along_axis(best_i, keep, 1)
    order = np.lexsort((best_i, -best_s), axis=1) if best_s.size else np.zeros_like(best_i)
    return np.take_along_axis(best_s, order, 1), np.take_along_axis(best_i, order, 1)


def resolve_kind(kind: str, rows: int) -> str:
    """``auto``: exact search (``flat``) up to :data:`EXACT_ROWS` rows (at 0.94M x 256 one query took 47 ms on
    one thread of a busy machine: inside 100 ms), ``ivf`` above (2.7-4.2 ms a query at 1M rows, recall@10
    0.992-0.995 with the query's own row excluded: docs/tokens.md); any other kind as given."""
    if kind == "auto":
        return "flat" if rows <= EXACT_ROWS else "ivf"
    if kind not in KINDS:
        raise InputError(f"unknown index '{kind}'; choose auto or one of {', '.join(KINDS)}")
    return kind


def index_entry(tv: TokenVectors, layer: int, kind: str):
    """The ``kind`` index of hidden state ``layer``: an entry of the store derived from the vectors
    (:class:`analysis.core.store.Derived`, ``index/layerNN.KIND.npy|faiss`` and its manifest)."""
    kind = resolve_kind(kind, tv.rows)
    return tv.derived("index", f"layer{layer:02d}.{kind}.{'npy' if kind == 'flat' else 'faiss'}")



def _faiss():
    try:
        import faiss
    except ImportError:  # pragma: no cover - a requirement
        raise InputError("nearest-neighbour indexes need faiss-cpu (pip install faiss-cpu)") from None
    return faiss


class MappedFlat:
    """The exact index as a memory-mapped ``.npy`` of the normalised float32 rows, searched by ``faiss.knn``
    (faiss's exhaustive inner-product scan, as ``IndexFlatIP.search``): built a shard at a time into the file and
    opened without reading it, so no layer is ever copied into an index object (an ``IndexFlatIP`` built by
    ``add`` peaked at 2.2 GB at 0.94M x 256 while its storage doubled)."""

    def __init__(self, path: Path):
        self.xb = np.load(path, mmap_mode="r")
        self.ntotal = len(self.xb)

    def search(self, q: np.ndarray, k: int):
        faiss = _faiss()
        return faiss.knn(np.ascontiguousarray(q, dtype=np.float32), self.xb, k, metric=faiss.METRIC_INNER_PRODUCT)


def _flat_fill(tv: TokenVectors, layer: int, progress=None):
    """The flat index file's fill: its blocks reserved before it is mapped (:func:`analysis.core.staging.open_npy`:
    a full disk is one line, not a SIGBUS)."""
    def fill(tmp: Path) -> None:
        out = open_npy(tmp, np.float32, (tv.rows, tv.hidden))
        for first, block in tv.layer_blocks(layer):
            for lo in range(0, len(block), 65_536):
                part = normalise(block[lo:lo + 65_536])
                out[first + lo:first + lo + len(part)] = part
                if progress:
                    progress("index", first + lo + len(part), tv.rows)
            out.flush()
        del out
    return fill


def _new_index(kind: str, d: int, n: int, sample: np.ndarray | None):
    faiss = _faiss()
    if kind == "flat":
        return faiss.IndexFlatIP(d), {}
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
        return index, {"M": HNSW_M, "efConstruction": HNSW_EF_CONSTRUCTION, "efSearch": HNSW_EF_SEARCH}
    if kind == "ivf":
        nlist = max(1, min(int(4 * math.sqrt(n)), len(sample) // 39))  # faiss wants >= 39 training points a cell
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(sample)
        nprobe = max(1, min(nlist, int(math.ceil(nlist / 16))))
        index.nprobe = nprobe
        return index, {"nlist": nlist, "nprobe": nprobe, "train_rows": len(sample)}
    raise InputError(f"unknown index '{kind}'; choose one of {', '.join(KINDS)}")


def build_index(tv: TokenVectors, layer: int, kind: str = DEFAULT_KIND, threads: int | None = None,
                seed: int = 0, force: bool = False, progress=None) -> dict:
    """Build (or find) the ``kind`` index of hidden state ``layer``: vectors added shard by shard, written
    atomically. Returns its description (also ``.json`` beside the index). ``progress("index", rows added,
    rows)`` is called after every block of up to 65,536 rows; an exception it raises (a job's cancel) stops the
    build with no index file written."""
    faiss = _faiss()
    if threads:
        faiss.omp_set_num_threads(threads)
    kind = resolve_kind(kind, tv.rows)
    entry = index_entry(tv, layer, kind)
    cached = None if force else entry.read()
    if cached is not None:
        return {**cached, "cached": True}
    tv.layer_slot(layer)
    t0 = time.perf_counter()
    sample = None
    if kind == "ivf":
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(tv.rows, size=min(tv.rows, IVF_TRAIN_ROWS), replace=False))
        sample = normalise(tv.rows_at(layer, rows))
    if kind == "flat":
        params = {"storage": "normalised float32 .npy, memory-mapped, searched by faiss.knn"}
        fill = _flat_fill(tv, layer, progress)
    else:
        index, params = _new_index(kind, tv.hidden, tv.rows, sample)
        for first, block in tv.layer_blocks(layer):
            for lo in range(0, len(block), 65_536):
                index.add(normalise(block[lo:lo + 65_536]))
                if progress:
                    progress("index", first + lo + min(65_536, len(block) - lo), tv.rows)

        def fill(p: Path) -> None:
            faiss.write_index(index, str(p))
    meta = entry.write(fill, lambda: {"layer": layer, "kind": kind, "rows": tv.rows, "hidden": tv.hidden,
                                      "metric": "cosine (inner product of L2-normalised float32)", "params": params,
                                      "build_seconds": round(time.perf_counter() - t0, 3)})
    return {**meta, "cached": False}


def load_index(tv: TokenVectors, layer: int, kind: str = DEFAULT_KIND):
    """The cached index (built now when absent, cut or damaged)."""
    kind = resolve_kind(kind, tv.rows)
    entry = index_entry(tv, layer, kind)
    path = entry.path
    meta = entry.read() or build_index(tv, layer, kind, force=True)  # its manifest, read once
    if kind == "flat":
        return MappedFlat(path)
    faiss = _faiss()
    try:
        index = faiss.read_index(str(path))
    except RuntimeError:
        raise InputError(f"{path}: a damaged index file; run `tokens index --rebuild` (or delete it)") from None
    params = meta.get("params", {})
    if kind == "hnsw":
        index.hnsw.efSearch = params.get("efSearch", HNSW_EF_SEARCH)
    elif kind == "ivf":
        index.nprobe = params.get("nprobe", 1)
    return index


@contextlib.contextmanager
def faiss_threads(n: int):
    """faiss's OpenMP threads set to ``n`` inside, restored after."""
    faiss = _faiss()
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def search(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, rows)`` of the ``k`` nearest rows of each query. A few queries run on one thread: measured at
    0.94M x 256, one flat query took 47 ms on one thread and 215 ms on two cores another process was using
    (OpenMP's threads wait for the busy core)."""
    q = normalise(np.atleast_2d(queries))
    with faiss_threads(1) if len(q) <= SINGLE_THREAD_QUERIES else contextlib.nullcontext():
        scores, rows = index.search(q, k)
    return scores, rows.astype(np.int64)


def recall_at(approx: np.ndarray, exact: np.ndarray, approx_scores: np.ndarray | None = None,
              exact_scores: np.ndarray | None = None, tol: float = 1e-5) -> float:
    """Mean share of each query's exact ``k`` neighbours that the approximate search found. With the scores,
    tie-aware: a found row counts when its cosine reaches the exact ``k``-th cosine (within ``tol``), so that of
    several rows with the same vector (layer 0: the same token at the same position) any one is right."""
    k = exact.shape[1]
    if approx_scores is not None and exact_scores is not None:
        kth = exact_scores[:, -1:] - tol
        return float(np.mean(np.minimum(((approx_scores >= kth) & (approx >= 0)).sum(1), k) / k))
    return float(np.mean([len(set(a.tolist()) & set(e.tolist())) / k for a, e in zip(approx, exact, strict=True)]))


def without_query(scores: np.ndarray, rows: np.ndarray, query_rows: np.ndarray, k: int) -> tuple[np.ndarray,
                                                                                                 np.ndarray]:
    """The first ``k`` of each query's ``(scores, rows)`` (asked for ``k + 1``) other than the query's own row
    (``query_rows[i]`` for query ``i``): a query's neighbours never include itself. Where the row is not among
    them (an approximate index that missed it, or more than ``k`` rows tied with it), the last one is dropped."""
    keep = rows != np.asarray(query_rows)[:, None]
    keep[keep.all(1), -1] = False
    shape = (len(rows), rows.shape[1] - 1)
    return scores[keep].reshape(shape)[:, :k], rows[keep].reshape(shape)[:, :k]


def measure_recall(tv: TokenVectors, layer: int, kind: str, queries: int = 200, k: int = 10, seed: int = 0) -> dict:
    """recall@k of the ``kind`` index against the brute-force exact search, on ``queries`` random token rows: each
    query's ``k`` nearest *other* rows (:func:`without_query` on both sides; its own row, always at cosine 1, would
    count as found for free)."""
    kind = resolve_kind(kind, tv.rows)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(tv.rows, size=min(queries, tv.rows), replace=False))
    q = tv.rows_at(layer, rows)
    want = min(k + 1, tv.rows)
    exact_s, exact = without_query(*brute_force(tv, layer, q, want), rows, k)
    approx_s, approx = without_query(*search(load_index(tv, layer, kind), q, want), rows, k)
    value = recall_at(approx, exact, approx_s, exact_s)
    index_entry(tv, layer, kind).update(**{f"recall@{k}": value, "recall_queries": len(rows)})
    return {"layer": layer, "kind": kind, f"recall@{k}": value, "queries": len(rows)}


# --- queries -------------------------------------------------------------------------------------------------


INDEX_COLUMNS = ("layer", "kind", "rows", "build_seconds", "bytes", "recall@10", "cached")


def index_row(tv: TokenVectors, layer: int, kind: str = DEFAULT_KIND, threads: int | None = None, seed: int = 0,
              force: bool = False, recall_queries: int = 200, progress=None, before_recall=None) -> dict:
    """Build (or find) hidden state ``layer``'s index (:func:`build_index`) and, for an approximate one, measure its
    recall@10 against exact search on ``recall_queries`` queries (0: not measured); the row of ``index.csv`` that
    ``tokens index`` and a tokens job write: :data:`INDEX_COLUMNS` and ``params`` (JSON). A flat index is exact:
    recall 1. ``before_recall()`` runs between the two (a job's cancel check)."""
    info = build_index(tv, layer, kind, threads, seed, force=force, progress=progress)
    if info["kind"] == "flat":
        info["recall@10"] = 1.0
    elif recall_queries:
        if before_recall is not None:
            before_recall()
        info.update(measure_recall(tv, layer, info["kind"], recall_queries, 10, seed))
    return {k: info.get(k) for k in INDEX_COLUMNS} | {"params": json.dumps(info.get("params", {}))}

def find_rows(tokens: pd.DataFrame, text_id: int | None = None, position: int | None = None,
              word: str | None = None, row: int | None = None) -> np.ndarray:
    """Token rows chosen by ``row``, by ``text_id`` (+ ``position``), or by ``word`` (case-folded: the rows of that
    word, or where no word is spelled so, the tokens spelled so). A query that matches nothing is one line naming
    it: the text's positions, or the nearest spellings the extraction has (:func:`nearest_spellings`)."""
    if row is not None:
        if not 0 <= row < len(tokens):
            raise InputError(f"row {row} does not exist: rows 0..{len(tokens) - 1}")
        return np.array([row])
    sel = np.ones(len(tokens), bool)
    if text_id is not None:
        sel &= tokens["text_id"].to_numpy() == text_id
        if not sel.any():
            ids = tokens["text_id"]
            raise InputError(f"no text {text_id}: text ids {ids.min()}..{ids.max()}" if len(ids) else
                             "the extraction holds no token")
    if position is not None:
        at = sel & (tokens["position"].to_numpy() == position)
        if not at.any():
            held = tokens["position"].to_numpy()[sel]
            raise InputError((f"text {text_id} has" if text_id is not None else "no text has") +
                             f" no token at position {position}" +
                             (f" (positions {held.min()}..{held.max()})" if len(held) else ""))
        sel = at
    if word is not None:  # the word itself first; a token spelled so (a piece of a longer word) only otherwise
        w = word.casefold()
        words = sel & (tokens["word"].str.casefold() == w).to_numpy()
        sel = words if words.any() else sel & (tokens["token"].str.casefold() == w).to_numpy()
        if not sel.any():
            if text_id is not None:
                raise InputError(f"text {text_id} has no word or token '{word}'")
            close = nearest_spellings(tokens, word)
            raise InputError(f"no word or token of the extraction is spelled '{word}' (case-folded); the nearest "
                             f"spellings present: {', '.join(close)}" if close else f"'{word}' matches nothing: "
                             "no word or token of the extraction is spelled close to it")
    return np.flatnonzero(sel)


def nearest_spellings(tokens: pd.DataFrame, word: str, n: int = 5) -> list[str]:
    """Up to ``n`` case-folded words or tokens of ``tokens`` spelled closest to ``word`` (difflib's ratio, at least
    0.6), best first."""
    import difflib

    present = pd.unique(pd.concat([tokens["word"], tokens["token"]]).str.casefold())
    return difflib.get_close_matches(word.casefold(), [p for p in present if p], n=n, cutoff=0.6)


def neighbours(tv: TokenVectors, row: int, layer: int, k: int = 10, kind: str | None = DEFAULT_KIND,
               tokens: pd.DataFrame | None = None, texts: pd.DataFrame | None = None, index=None,
               standardize: bool = False) -> pd.DataFrame:
    """The ``k`` tokens nearest to token ``row`` at hidden state ``layer`` (itself left out), best first: rank,
    row, cosine and the token's metadata, its text and the text with the token marked ``[[...]]``. ``kind``
    None: the brute-force search; ``standardize``: the cosine of z-scored vectors (:func:`standardiser`, by brute
    force)."""
    tokens = tv.tokens() if tokens is None else tokens
    texts = tv.texts() if texts is None else texts
    q = tv.rows_at(layer, np.array([row]))
    want = min(k + 1, tv.rows)
    if kind is None or standardize:
        scores, rows = brute_force(tv, layer, q, want, transform=standardiser(tv, layer) if standardize else None)
    else:
        scores, rows = search(index if index is not None else load_index(tv, layer, kind), q, want)
    scores, rows = without_query(scores, rows, np.array([row]), k)
    keep = rows[0] >= 0
    scores, rows = scores[0][keep], rows[0][keep]
    if not len(rows):
        raise InputError(f"row {row} has no neighbours: " + (
            f"the extraction holds {tv.rows} token, so there is no other token to be near" if tv.rows < 2 else
            f"the {resolve_kind(kind, tv.rows)} index returned no other row at hidden state {layer} (an approximate "
            "index searches only part of the rows); ask for exact search (--exact, or the flat index)"))
    out = tokens.iloc[rows].reset_index(drop=True)
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    out.insert(1, "layer", layer)
    out.insert(2, "cosine", scores.astype(np.float64))
    out["text"] = texts.set_index("text_id")["text"].reindex(out["text_id"]).to_numpy()
    out["marked"] = marked(out, texts)
    return out


def marked(tokens: pd.DataFrame, texts: pd.DataFrame, width: int | None = None) -> list[str]:
    """Each token's text with the token marked ``[[...]]`` (by its character span; a token without one leaves the
    text as it is), cut to ``width`` characters around the token when given."""
    text = texts.set_index("text_id")["text"].reindex(tokens["text_id"]).to_numpy()
    out = []
    for t, s, e in zip(text, tokens["start"], tokens["end"], strict=True):
        m = t if s < 0 else f"{t[:s]}[[{t[s:e]}]]{t[e:]}"
        if width and len(m) > width:
            at = max(0, m.find("[[") - width // 2)
            m = ("…" if at else "") + m[at:at + width] + ("…" if at + width < len(m) else "")
        out.append(m)
    return out


def across_layers(tv: TokenVectors, row: int, k: int = 10, kind: str | None = DEFAULT_KIND,
                  layers: list[int] | None = None, standardize: bool = False) -> pd.DataFrame:
    """:func:`neighbours` of the same token at every extracted layer (or ``layers``), stacked (column ``layer``):
    exBERT's side-by-side view. One layer's index is in memory at a time."""
    tokens, texts = tv.tokens(), tv.texts()
    return pd.concat([neighbours(tv, row, layer, k, kind, tokens, texts, standardize=standardize)
                      for layer in (layers or tv.layers)], ignore_index=True)


URL = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|www\.)\S+$", re.IGNORECASE)
E_MAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$", re.IGNORECASE)


def word_kind(words: pd.Series) -> pd.Series:
    """Words as the summary counts them: a URL as ``<url>``, an e-mail address as ``<e-mail>`` (a web treebank's
    URLs are one UD word each; the pieces of one URL would otherwise list that URL as a common word)."""
    return words.mask(words.str.match(URL), "<url>").mask(words.str.match(E_MAIL), "<e-mail>")


def summary(query: pd.Series, found: pd.DataFrame, top: int = 10) -> pd.DataFrame:
    """Per layer: how many neighbours, the share with the query's word type (case-folded) and token, their
    most common words (URLs and e-mail addresses counted as such: :func:`word_kind`), mean position and, with
    CoNLL-U, UPOS and DEPREL histograms and the share with the query's UPOS. ``query`` is the query token's
    metadata row."""
    out = []
    for layer, group in found.groupby("layer", sort=False):
        words = group["word"].where(group["word"] != "", group["token"]).str.casefold()
        qword = (query["word"] or query["token"]).casefold()
        row = {"layer": layer, "neighbours": len(group), "same_word": float((words == qword).mean()),
               "same_token": float((group["token"] == query["token"]).mean()),
               "mean_cosine": float(group["cosine"].mean()), "mean_position": float(group["position"].mean()),
               "same_text": float((group["text_id"] == query["text_id"]).mean()),
               "words": json.dumps(dict(Counter(word_kind(words)).most_common(top)), ensure_ascii=False)}
        for col in ("upos", "deprel"):
            if col in group:
                row[f"same_{col}"] = float((group[col] == query[col]).mean())
                row[col] = json.dumps(dict(Counter(group[col]).most_common()), ensure_ascii=False)
        out.append(row)
    return pd.DataFrame(out)
