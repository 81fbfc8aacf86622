"""2-D coordinates of vectors: exact PCA (float64, never randomized; on the GPU when there is one), UMAP or
t-SNE, with PCA axes sign-aligned from one layer to the next (Song et al. 2020 §3.3.1 / Fig. 2)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from analysis.core.cka import constant_layers
from analysis.core.inputs import InputError
from analysis.core.options import METHODS

METHOD_NAMES = {"pca": "PCA", "umap": "UMAP", "tsne": "t-SNE"}


def project(x: np.ndarray, method: str = "pca", seed: int = 0, device: str = "cpu", variance: bool = False):
    """``(n, 2)`` coordinates of ``x`` ``(n, d)``; with ``variance`` also the share of the variance on each
    axis (PCA's, :func:`exact_pca`; None for UMAP and t-SNE, whose axes explain no variance)."""
    n = x.shape[0]
    if n < 3:
        raise InputError(f"{n} row(s) are too few to project; give at least 3")
    if method == "pca":
        return exact_pca(x, device=device, variance=variance)
    if variance:
        return project(x, method, seed, device), None
    if method == "umap":
        import umap

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "n_jobs overridden by random_state" and numba chatter
            return umap.UMAP(n_components=2, n_neighbors=min(15, n - 1), random_state=seed).fit_transform(x)
    if method == "tsne":
        from sklearn.manifold import TSNE

        return TSNE(n_components=2, perplexity=min(30.0, (n - 1) / 3), init="pca", random_state=seed).fit_transform(x)
    raise InputError(f"unknown method '{method}'; choose one of {', '.join(METHODS)}")


def exact_pca(x: np.ndarray, components: int = 2, device: str = "cpu", variance: bool = False):
    """``(n, components)`` exact principal-component scores of ``x`` ``(n, d)``, in float64 whatever the size:
    the eigendecomposition of the ``d x d`` covariance when ``n >= d`` (one pass over the rows; on a GPU there
    when ``device`` is CUDA), a full SVD of the centred matrix otherwise. Never randomized: on a flat spectrum a
    randomized solver's axes drift by tens of degrees. Each axis's sign makes its largest score positive.

    With ``variance``: ``(scores, ratio)``, ``ratio`` the share of the total variance on each axis (its
    eigenvalue, or squared singular value, over their sum: scikit-learn's ``explained_variance_ratio_``)."""
    if device.startswith("cuda"):
        t = torch.as_tensor(x, device=device, dtype=torch.float64)
        t = t - t.mean(0)
        if t.shape[0] >= t.shape[1]:
            values, vectors = torch.linalg.eigh(t.T @ t)  # ascending eigenvalues
            scores, top = t @ vectors[:, -components:].flip(1), values[-components:].flip(0)
        else:
            u, s, _ = torch.linalg.svd(t, full_matrices=False)
            scores, top = u[:, :components] * s[:components], s[:components].square()
        scores, ratio = scores.cpu().numpy(), (top / t.square().sum()).cpu().numpy()
    else:
        centred = np.asarray(x, dtype=np.float64)
        centred = centred - centred.mean(0)
        if centred.shape[0] >= centred.shape[1]:
            values, vectors = np.linalg.eigh(centred.T @ centred)
            scores, top = centred @ vectors[:, ::-1][:, :components], values[::-1][:components]
        else:
            u, s, _ = np.linalg.svd(centred, full_matrices=False)
            scores, top = u[:, :components] * s[:components], s[:components] ** 2
        ratio = top / np.square(centred).sum()
    rows = np.abs(scores).argmax(0)
    scores = scores * np.sign(scores[rows, np.arange(scores.shape[1])])
    return (scores, ratio) if variance else scores


def align_signs(coords: list[np.ndarray]) -> list[np.ndarray]:
    """Flip each axis of each layer's PCA coordinates so it points the same way as the previous layer's
    (positive inner product). Only signs change."""
    out = [coords[0]] if coords else []
    for c in coords[1:]:
        signs = np.where((c * out[-1]).sum(0) < 0, -1.0, 1.0)
        out.append(c * signs)
    return out


def project_layers(reps: np.ndarray, layers: list[int], method: str = "pca", seed: int = 0, device: str = "cpu",
                   constant: list[int] | None = None, progress=None, variance: bool = False):
    """``(n, 2)`` coordinates of each of ``layers`` of ``reps`` ``(S, n, d)``: a constant layer (every row the
    same vector) at the origin rather than as projected rounding noise; PCA axes sign-aligned layer to layer.
    ``progress(done, total)`` is called with 0 before the first layer (the projection is a stage of its own)
    and after each. With ``variance``: ``(coords, ratios)``, ``ratios`` per layer the share of the variance
    on each PCA axis (:func:`exact_pca`), None for a constant layer or another method."""
    constant = constant_layers(reps) if constant is None else constant
    coords, ratios = [], []
    if progress:
        progress(0, len(layers))
    for n, layer in enumerate(layers):
        if layer in constant:
            coords.append(np.zeros((reps.shape[1], 2)))
            ratios.append(None)
        else:
            c, ratio = project(reps[layer], method, seed, device, variance=True)
            coords.append(c)
            ratios.append(None if ratio is None else tuple(float(r) for r in ratio))
        if progress:
            progress(n + 1, len(layers))
    coords = align_signs(coords) if method == "pca" else coords
    return (coords, ratios) if variance else coords
