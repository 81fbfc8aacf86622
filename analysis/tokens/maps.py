"""A layer's token map (issue 29 item 3, the computation; the renderers live elsewhere), by one of two methods:

- :func:`pca_map`, exact PCA over every token: the covariance streamed from the mapped float16 shards in
  float64, its exact eigendecomposition (``numpy.linalg.eigh``, never randomized: docs/architecture.md rule 10),
  then every row projected shard by shard; cached as ``maps/layerNN.pcaK.npy`` with its ``.json`` (explained
  variance ratio per axis, the sign rule): an entry of the store derived from the vectors
  (:class:`analysis.core.store.Derived`: written whole, its manifest last, made again when cut or damaged).
- :func:`umap_map`, UMAP (umap-learn, cosine) fitted on a seeded random sample of the rows, every other row
  placed by the fitted model's ``transform``, a chunk at a time (bounded memory); cached as
  ``maps/layerNN.umap-sS-seedR-kK.npy`` with its ``.json`` (sample size, seed, parameters, umap version, times)
  and ``...sample.npy`` (the fitted rows, a companion of the entry).

Coordinates are ``(rows, 2)`` float32 (``(rows, K)`` for PCA), row ``r`` of ``tokens.parquet``, returned
memory-mapped from the cache. :func:`layer_map` dispatches on the method name (what the page calls)."""

from __future__ import annotations

import time
import warnings

import numpy as np

from analysis.core.inputs import InputError
from analysis.core.staging import open_npy, save_npy
from analysis.tokens.vectors import TokenVectors

CHUNK = 65_536
METHODS = ("pca", "umap")
# UMAP's sample. The fit is the expensive, serial part (a fixed seed makes umap-learn single-threaded): on this
# project's 2-core machine ~1-2 min for 20,000 x 768 (docs/benchmarks.md), while the transform of the other
# rows is linear in their number. In 20,000 random tokens a word type that makes 1 token in 2,000 appears about
# 10 times, and each transformed token is placed among its 15 nearest sampled neighbours, so the sample fixes the
# map's layout and the rest fills it in. Over 10,000 rows umap-learn's default fit is 200 epochs, which is what
# UMAP_EPOCHS states explicitly (below).
UMAP_SAMPLE = 20_000
UMAP_NEIGHBOURS = 15
# umap-learn's transform depends on the batch it is given: it runs 100 or 30 epochs depending on whether the call
# holds <= 10,000 rows (n_epochs // 3 when n_epochs is given: fixed here), and it scales every edge's sampling
# rate by the largest edge weight in the call and drops edges under that largest / epochs. So the other rows are
# transformed in two passes (transform_rest): their neighbour graphs chunk by chunk (the search, which depends
# on the row only), then the layout chunk by chunk with the largest weight over all of them: every row placed
# exactly as one reducer.transform call of all the other rows places it, in bounded memory (tested).
UMAP_EPOCHS = 200
UMAP_CHUNK = 16_384
UMAP_REPORT_SECONDS = 0.5  # the fit's epoch reports at most this often (each one is a chance to Stop)
FIT_GRAPH, FIT_EPOCH = "UMAP fit: neighbour graph", "UMAP fit: epoch"
NEIGHBOURS, LAYOUT = "UMAP transform: neighbours of row", "UMAP transform: layout of row"


class _EpochReport:
    """A file for umap-learn's epoch bar (tqdm, ``bar_format="{n}/{total}"``): each write becomes
    ``progress(FIT_EPOCH, epoch, epochs)``. An exception the callback raises (a Stop) leaves umap-learn's epoch loop
    there, as tqdm writes from inside it."""

    def __init__(self, progress):
        self.progress = progress

    def write(self, text: str) -> None:
        done, _, total = text.strip().partition("/")
        if done.isdigit() and total.isdigit():
            self.progress(FIT_EPOCH, int(done), int(total))

    def flush(self) -> None:
        pass


def _release_tqdm_lock() -> None:
    """Release tqdm's global write lock where this thread still holds it. tqdm's ``refresh`` acquires the lock,
    displays (our :class:`_EpochReport` writes, and may raise a Stop) and releases it without ``try/finally``
    (tqdm 4.70): after a raised Stop the lock stayed held by this thread, and every later tqdm bar of the process in
    another thread (another session's UMAP, a download) waited on it forever. Every tqdm lock object shares the
    class-level ``th_lock`` and ``mp_lock``, released together by ``release``."""
    from tqdm import tqdm

    lock = tqdm.get_lock()
    owned = getattr(getattr(type(lock), "th_lock", None), "_is_owned", None)
    while owned is not None and owned():
        lock.release()


def progress_text(stage: str, done: int, total: int) -> str:
    """One line for a progress bar of :func:`umap_map`'s ``progress(stage, done, total)``."""
    if stage == FIT_GRAPH:
        return f"{stage} of the {total:,} sampled tokens (then {UMAP_EPOCHS} epochs)"
    return f"{stage} {done:,} of {total:,}"


def pca_axes(tv: TokenVectors, layer: int, components: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, axes (hidden, components), explained variance ratio (components,))`` of hidden state ``layer``
    over all rows. Each axis's sign makes its largest-magnitude loading positive (the same map every run)."""
    d = tv.hidden
    total = np.zeros(d)
    gram = np.zeros((d, d))
    for _first, block in tv.layer_blocks(layer):
        for lo in range(0, len(block), CHUNK):
            x = np.asarray(block[lo:lo + CHUNK], dtype=np.float64)
            total += x.sum(0)
            gram += x.T @ x
    n = tv.rows
    mean = total / n
    cov = (gram - n * np.outer(mean, mean)) / max(n - 1, 1)
    values, vectors = np.linalg.eigh(cov)
    order = np.argsort(values)[::-1][:components]
    axes = vectors[:, order]
    flip = np.sign(axes[np.abs(axes).argmax(0), np.arange(axes.shape[1])])
    axes = axes * np.where(flip == 0, 1, flip)
    ratio = np.clip(values[order], 0, None) / max(np.clip(values, 0, None).sum(), 1e-300)
    return mean, axes, ratio


def pca_map(tv: TokenVectors, layer: int, components: int = 2, force: bool = False) -> tuple[np.ndarray, dict]:
    """Every row's coordinates on the top ``components`` principal axes of hidden state ``layer`` (memory-mapped
    from the cache when computed before) and their description."""
    tv.layer_slot(layer)
    entry = tv.derived("maps", f"layer{layer:02d}.pca{components}.npy")  # an entry of the store
    cached = None if force else entry.read((tv.rows, components))
    if cached is not None:
        return np.load(entry.path, mmap_mode="r"), cached
    mean, axes, ratio = pca_axes(tv, layer, components)

    def fill(tmp) -> None:
        out = open_npy(tmp, np.float32, (tv.rows, components))
        for first, block in tv.layer_blocks(layer):
            for lo in range(0, len(block), CHUNK):
                x = np.asarray(block[lo:lo + CHUNK], dtype=np.float64)
                out[first + lo:first + lo + len(x)] = (x - mean) @ axes
        out.flush()
        del out

    meta = entry.write(fill, {"layer": layer, "method": "pca (exact: float64 covariance over every token, eigh)",
                              "components": components, "explained_variance_ratio": ratio.tolist(), "rows": tv.rows,
                              "sign": "each axis's largest-magnitude loading is positive"})
    return np.load(entry.path, mmap_mode="r"), meta


def make_reducer(sample: int, seed: int, n_neighbors: int, progress=None):
    """The umap-learn model :func:`umap_map` fits: 2-D, cosine, seeded (deterministic and serial), the epochs
    fixed (see ``UMAP_EPOCHS``); ``n_neighbors`` capped below the sample size. ``progress``: its epoch loop's
    bar reported as ``progress(FIT_EPOCH, epoch, epochs)`` (:class:`_EpochReport`; the bar changes no number)."""
    import umap

    bar = None if progress is None else {"disable": False, "file": _EpochReport(progress), "bar_format": "{n}/{total}",
                                         "mininterval": UMAP_REPORT_SECONDS, "leave": False}
    return umap.UMAP(n_components=2, n_neighbors=min(n_neighbors, sample - 1), metric="cosine",
                     n_epochs=UMAP_EPOCHS, random_state=seed, tqdm_kwds=bar)


def umap_sample_rows(rows: int, sample: int, seed: int) -> np.ndarray:
    """The fitted rows: ``sample`` distinct rows of ``rows`` drawn with ``numpy.random.default_rng(seed)``,
    sorted (all rows when the sample is at least as large)."""
    if sample >= rows:
        return np.arange(rows)
    return np.sort(np.random.default_rng(seed).choice(rows, sample, replace=False))


def umap_entry(tv: TokenVectors, layer: int, sample: int = UMAP_SAMPLE, seed: int = 0,
               n_neighbors: int = UMAP_NEIGHBOURS) -> tuple:
    """(:func:`umap_map`'s entry of the store: the coordinates ``.npy`` and its manifest, the fitted rows' ``.npy``,
    a companion of the entry)."""
    entry = tv.derived("maps", f"layer{layer:02d}.umap-s{min(sample, tv.rows)}-seed{seed}-k{n_neighbors}.npy")
    return entry, entry.path.with_suffix(".sample.npy")


def cached_umap(tv: TokenVectors, layer: int, sample: int = UMAP_SAMPLE, seed: int = 0,
                n_neighbors: int = UMAP_NEIGHBOURS) -> dict | None:
    """The description of :func:`umap_map`'s whole cached map of these arguments (None: it would be computed)."""
    entry, rows_path = umap_entry(tv, layer, sample, seed, n_neighbors)
    return entry.read((tv.rows, 2), {rows_path: (min(sample, tv.rows),)})


def umap_map(tv: TokenVectors, layer: int, sample: int = UMAP_SAMPLE, seed: int = 0,
             n_neighbors: int = UMAP_NEIGHBOURS, force: bool = False,
             chunk: int = UMAP_CHUNK, progress=None) -> tuple[np.ndarray, dict]:
    """Every row's UMAP coordinates at hidden state ``layer``, ``(rows, 2)`` float32: umap-learn fitted on
    ``sample`` rows (:func:`umap_sample_rows`; their coordinates are the fit's own embedding), every other row
    placed by the fitted model's ``transform``, shard by shard and ``chunk`` rows at a time, exactly as one
    ``transform`` call of all of them places them (:func:`transform_rest`; memory: the sample, the fitted model,
    one chunk and 15 edges of 12 bytes per transformed row). Cached beside the vectors; memory-mapped from the
    cache when computed before (``force`` computes again). The description says which rows were fitted
    (``sample_file``). ``progress(stage, done, total)``: :data:`FIT_GRAPH` once (the sample's neighbour graph and
    initial layout: not interruptible), then :data:`FIT_EPOCH` (the fit's epochs), :data:`NEIGHBOURS` and
    :data:`LAYOUT` (the transformed rows; :func:`progress_text` words them); an exception it raises (a Stop) ends
    the run there with no file written."""
    tv.layer_slot(layer)
    if sample < 3:
        raise InputError(f"a UMAP sample of {sample} rows is too small; give at least 3")
    if n_neighbors < 2:
        raise InputError(f"UMAP needs n_neighbors >= 2, not {n_neighbors}")
    if tv.rows < 3:
        raise InputError(f"{tv.rows} token(s) are too few for a UMAP map")
    sample = min(sample, tv.rows)
    entry, rows_path = umap_entry(tv, layer, sample, seed, n_neighbors)
    cached = None if force else cached_umap(tv, layer, sample, seed, n_neighbors)
    if cached is not None:
        return np.load(entry.path, mmap_mode="r"), cached
    import umap

    rows = umap_sample_rows(tv.rows, sample, seed)
    reducer = make_reducer(sample, seed, n_neighbors, progress)
    if progress:
        progress(FIT_GRAPH, 0, int(sample))
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "n_jobs overridden by random_state" and numba chatter
        try:
            fitted = reducer.fit_transform(tv.rows_at(layer, rows))
        except BaseException:  # a Stop raised from the epoch bar (Streamlit's rerun is a BaseException)
            _release_tqdm_lock()
            raise
    fit_seconds = time.perf_counter() - start
    in_sample = np.zeros(tv.rows, bool)
    in_sample[rows] = True
    transform_seconds = 0.0
    timings: dict = {}

    def chunks():
        for first, block in tv.layer_blocks(layer):
            rest = np.flatnonzero(~in_sample[first:first + len(block)])
            for lo in range(0, len(rest), chunk):
                local = rest[lo:lo + chunk]
                yield first + local, np.asarray(block[local], dtype=np.float32)

    def fill(tmp) -> None:
        nonlocal transform_seconds
        out = open_npy(tmp, np.float32, (tv.rows, 2))
        out[rows] = fitted
        began = time.perf_counter()
        for where, coords in transform_rest(reducer, chunks(), timings, progress, tv.rows - len(rows)):
            out[where] = coords
        transform_seconds = time.perf_counter() - began
        out.flush()
        del out

    def described() -> dict:
        return {"layer": layer, "method": "umap (fitted on a random sample, the other rows transformed)",
                "rows": tv.rows, "sample": int(sample), "seed": seed, "sample_rule":
                "numpy.random.default_rng(seed).choice(rows, sample, replace=False), sorted",
                "sample_file": rows_path.name, "n_neighbors": reducer.n_neighbors, "metric": "cosine",
                "n_epochs": UMAP_EPOCHS, "transform_epochs": UMAP_EPOCHS // 3, "min_dist": reducer.min_dist,
                "transform_chunk": chunk, "umap_version": umap.__version__,
                "fit_seconds": round(fit_seconds, 3), "transform_seconds": round(transform_seconds, 3),
                "transform_graph_seconds": round(timings.get("graph_seconds", 0.0), 3),
                "transform_layout_seconds": round(timings.get("layout_seconds", 0.0), 3),
                "transformed_rows": int(tv.rows - sample)}

    # the fitted rows after the map (a Stop in the transform leaves nothing), then the manifest
    meta = entry.write(fill, described, {rows_path: lambda p: save_npy(p, rows)})
    return np.load(entry.path, mmap_mode="r"), meta


def transform_rest(reducer, chunks, timings: dict | None = None, progress=None, rows: int = 0):
    """``(rows, coordinates)`` per chunk of ``chunks`` (an iterable of ``(rows, (n, d) float32)``, read once):
    the fitted ``reducer``'s placement of every row exactly as one ``reducer.transform`` of all the chunks'
    rows at once, computed a chunk at a time. Pass 1 builds each chunk's neighbour graph (umap-learn's
    ``transform_mode="graph"``; row by row, so chunking does not change it) and keeps its edges (15 a row, 12
    bytes each) and the largest weight; pass 2 is the rest of ``UMAP.transform`` (umap-learn 0.5) per chunk with
    that largest weight: initial positions from the graph, edges under largest / epochs dropped, sampling rates
    relative to the largest, ``optimize_layout_euclidean`` (each row moves alone against the fitted embedding,
    its random stream seeded from its own start). ``timings`` (a dict) receives ``graph_seconds`` and
    ``layout_seconds``; ``progress(stage, rows done, rows)`` after each chunk of each pass (:data:`NEIGHBOURS`,
    :data:`LAYOUT`), ``rows`` being the chunks' total."""
    from sklearn.utils import check_random_state
    from umap.layouts import optimize_layout_euclidean
    from umap.umap_ import INT32_MAX, INT32_MIN, init_graph_transform

    if reducer.output_metric != "euclidean" or reducer.densmap or reducer.n_epochs is None:
        raise ValueError("transform_rest supports a euclidean output, no densMAP and a fixed n_epochs")
    graphs, largest = [], np.float32(0)
    timings = {} if timings is None else timings
    began = time.perf_counter()
    mode = reducer.transform_mode
    reducer.transform_mode = "graph"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for where, x in chunks:
                g = reducer.transform(x).tocoo()
                graphs.append((where, g.shape[0], g.row.astype(np.int32), g.col.astype(np.int32),
                               g.data.astype(np.float32)))
                if g.nnz:
                    largest = max(largest, g.data.max())
                if progress:
                    progress(NEIGHBOURS, sum(g[1] for g in graphs), rows)
    finally:
        reducer.transform_mode = mode
    timings["graph_seconds"], timings["layout_seconds"] = time.perf_counter() - began, 0.0
    n_epochs = int(reducer.n_epochs // 3.0)
    tail = reducer.embedding_.astype(np.float32, copy=True)
    import scipy.sparse

    placed = 0
    for where, n, row, col, data in graphs:
        began = time.perf_counter()
        graph = scipy.sparse.coo_matrix((data, (row, col)), shape=(n, tail.shape[0]))
        csr = graph.tocsr()
        csr.eliminate_zeros()
        embedding = init_graph_transform(csr, reducer.embedding_)
        graph.data[graph.data < (largest / float(n_epochs))] = 0.0  # float32, as umap's
        graph.eliminate_zeros()
        epochs_per_sample = -1.0 * np.ones(graph.data.shape[0], dtype=np.float64)  # umap's make_epochs_per_sample
        n_samples = n_epochs * (graph.data / largest)
        epochs_per_sample[n_samples > 0] = float(n_epochs) / np.float64(n_samples[n_samples > 0])
        rng_state = check_random_state(reducer.transform_seed).randint(INT32_MIN, INT32_MAX, 3).astype(np.int64)
        embedding = optimize_layout_euclidean(
            embedding, tail.copy(), graph.row, graph.col, n_epochs, graph.shape[1], epochs_per_sample,
            reducer._a, reducer._b, rng_state, reducer.repulsion_strength, reducer._initial_alpha / 4.0,
            reducer.negative_sample_rate, reducer.random_state is None, verbose=False, tqdm_kwds={"disable": True})
        timings["layout_seconds"] += time.perf_counter() - began
        placed += n
        if progress:
            progress(LAYOUT, placed, rows)
        yield where, embedding


def layer_map(tv: TokenVectors, layer: int, method: str = "pca", **kw) -> tuple[np.ndarray, dict]:
    """A layer's 2-D token map by ``method`` (``pca``: :func:`pca_map`; ``umap``: :func:`umap_map`), with the
    method's keyword arguments; ``(rows, 2)`` float32 coordinates (memory-mapped) and their description."""
    if method == "pca":
        return pca_map(tv, layer, **{"components": 2, **kw})
    if method == "umap":
        return umap_map(tv, layer, **kw)
    raise InputError(f"unknown map method '{method}'; choose one of {', '.join(METHODS)}")
