"""A layer's token map by exact PCA over every token (issue 29 item 3, the computation only; the page and its
renderers are not built yet): the covariance streamed from the mapped float16 shards in float64, its exact
eigendecomposition (``numpy.linalg.eigh``, never randomized: docs/architecture.md rule 10), then every row
projected shard by shard. Coordinates are cached beside the vectors as ``maps/layerNN.pca.npy`` (``(rows,
components)`` float32, row ``r`` of ``tokens.parquet``) with ``maps/layerNN.pca.json`` (explained variance
ratio per axis, the mean, the sign rule)."""

from __future__ import annotations

import json

import numpy as np

from analysis.tokens.vectors import TokenVectors, _write_atomic

CHUNK = 65_536


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
    folder = tv.directory / "maps"
    path = folder / f"layer{layer:02d}.pca{components}.npy"
    meta_path = path.with_suffix(".json")
    if path.is_file() and meta_path.is_file() and not force:
        return np.load(path, mmap_mode="r"), json.loads(meta_path.read_text())
    folder.mkdir(exist_ok=True)
    mean, axes, ratio = pca_axes(tv, layer, components)

    def fill(tmp) -> None:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(tv.rows, components))
        for first, block in tv.layer_blocks(layer):
            for lo in range(0, len(block), CHUNK):
                x = np.asarray(block[lo:lo + CHUNK], dtype=np.float64)
                out[first + lo:first + lo + len(x)] = (x - mean) @ axes
        out.flush()
        del out

    _write_atomic(path, fill)
    meta = {"layer": layer, "method": "pca (exact: float64 covariance over every token, eigh)",
            "components": components, "explained_variance_ratio": ratio.tolist(), "rows": tv.rows,
            "sign": "each axis's largest-magnitude loading is positive", "file": path.name}
    _write_atomic(meta_path, lambda p: p.write_text(json.dumps(meta, indent=1)))
    return np.load(path, mmap_mode="r"), meta
