"""A layer's token map (analysis.tokens.maps): the streamed exact PCA equals numpy's PCA of the whole matrix
(up to the documented sign rule), with its explained variance, and is cached."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.tokens.maps import pca_map
from tests.test_tokens_search import planted


def test_streamed_pca_equals_numpy_pca_of_all_rows(tmp_path):
    tv = planted(tmp_path / "v", n_texts=40, per_text=20, hidden=12)
    x = np.concatenate([np.asarray(b, np.float64) for _, b in tv.layer_blocks(1)])
    centred = x - x.mean(0)
    values, vectors = np.linalg.eigh(np.cov(centred, rowvar=False))
    order = np.argsort(values)[::-1][:3]
    axes = vectors[:, order]
    axes *= np.sign(axes[np.abs(axes).argmax(0), np.arange(3)])
    coords, meta = pca_map(tv, 1, components=3)
    np.testing.assert_allclose(coords, centred @ axes, atol=1e-4)
    assert meta["explained_variance_ratio"] == pytest.approx((values[order] / values.sum()).tolist(), rel=1e-6)
    again, _ = pca_map(tv, 1, components=3)
    assert isinstance(again, np.memmap)
    np.testing.assert_array_equal(again, coords)
    assert coords.shape == (tv.rows, 3) and coords.dtype == np.float32
