"""Centred kernel alignment between layers: one definition for the atlas, duplication and comparison.

Linear CKA (Kornblith et al. 2019, "Similarity of neural network representations revisited", eq. 3 with the linear
kernel): ``CKA(X, Y) = ||Y'X||_F^2 / (||X'X||_F ||Y'Y||_F)`` on column-centred ``X`` ``(n, d1)``, ``Y`` ``(n, d2)``;
1 for representations equal up to an orthogonal transform and isotropic scaling.

Debiased CKA (Nguyen, Raghu & Kornblith 2021, "Do wide and deep networks learn the same things?", §3, with the
unbiased HSIC estimator of Song et al. 2012, eq. 5): the plain estimator is biased upwards for small ``n`` (two
unrelated random matrices with ``d`` near ``n`` score far above 0); the unbiased HSIC fixes it. Computed here in
feature space for the linear kernel, without the ``n x n`` Gram matrices (the identities are in
:func:`_unbiased_hsic`).
"""

from __future__ import annotations

import numpy as np
import torch

from analysis.core.jackknife import jackknife
from analysis.core.scores import Z95


def linear_cka(reps: np.ndarray, other: np.ndarray | None = None, *, constant: list[int] | None = None) -> np.ndarray:
    """``(S, S2)`` linear CKA between every layer of ``reps`` ``(S, n, d)`` and every layer of ``other``
    ``(S2, n, d2)`` (default: ``reps`` itself): ``||Y'X||_F^2 / (||X'X||_F ||Y'Y||_F)`` on column-centred X, Y.
    Uses ``n x n`` Gram matrices when there are fewer rows than dimensions, cross-covariances otherwise (the
    same number either way). Undefined (NaN) for a layer whose vectors are all the same (``constant``: those
    layers of ``reps`` when ``other`` is None, found by :func:`constant_layers` when not given)."""
    def centred(a: np.ndarray) -> torch.Tensor:
        x = _tensor(a)
        return x - x.mean(1, keepdim=True)

    x = centred(reps)
    y = x if other is None else centred(other)
    n = x.shape[1]
    if n <= min(x.shape[2], y.shape[2]):
        gx = torch.einsum("lnd,lmd->lnm", x, x).reshape(len(x), n * n).double()
        gy = gx if other is None else torch.einsum("lnd,lmd->lnm", y, y).reshape(len(y), n * n).double()
        dots = gx @ gy.T  # <K_i, L_j>_F = ||Y_j' X_i||_F^2
        self_x, self_y = gx.square().sum(1).sqrt(), gy.square().sum(1).sqrt()
    else:
        def cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return (a.T @ b).double().square().sum()

        dots = torch.stack([torch.stack([cross(xi, yj) for yj in y]) for xi in x])
        self_x = torch.stack([cross(xi, xi) for xi in x]).sqrt()
        self_y = self_x if other is None else torch.stack([cross(yj, yj) for yj in y]).sqrt()
    cka = (dots / (self_x[:, None] * self_y[None, :]).clamp(min=1e-300)).numpy()
    rows = constant_layers(reps) if constant is None else constant
    cols = rows if other is None else constant_layers(other)
    cka[rows, :] = np.nan
    cka[:, cols] = np.nan
    return cka


def _tensor(a) -> torch.Tensor:
    """``a`` as a float32 tensor without a copy where it can (a read-only memory map is copied: torch wants
    writable memory)."""
    x = np.ascontiguousarray(a, dtype=np.float32)
    return torch.from_numpy(x if x.flags.writeable else x.copy())


def constant_layers(reps, rtol: float = 1e-5) -> list[int]:
    """Layers whose vectors are the same for every row (up to float noise), e.g. [CLS] at the embeddings:
    its state there is the [CLS] embedding plus position 0, whatever the text. One layer at a time (``reps`` may be
    memory-mapped)."""
    return [i for i in range(len(reps)) if constant_layer(reps[i], rtol)]


def constant_layer(x, rtol: float = 1e-5) -> bool:
    """Whether the rows of one layer ``x`` ``(n, d)`` are all the same (:func:`constant_layers`)."""
    x = np.asarray(x)
    return bool(np.abs(x - x[:1]).max(initial=0) <= rtol * max(float(np.abs(x).max(initial=0)), 1e-30))


def cross_cka(a, b) -> np.ndarray:
    """:func:`linear_cka` of every layer of ``a`` ``(S, n, d)`` against every layer of ``b`` ``(S2, n, d2)``, reading
    two layers at a time (``a`` and ``b`` may be memory-mapped): the same formulas and float32 products, so the same
    numbers, in memory bounded by two layers' vectors (plus ``n x n`` Grams per layer when ``n <= d``)."""
    def centred(layer) -> torch.Tensor:
        x = _tensor(layer)
        return x - x.mean(0, keepdim=True)

    n = a[0].shape[0]
    if n <= min(a[0].shape[1], b[0].shape[1]):  # Grams are small: each layer's once
        gx = torch.stack([(x := centred(a[i])) @ x.T for i in range(len(a))]).reshape(len(a), n * n).double()
        gy = torch.stack([(y := centred(b[j])) @ y.T for j in range(len(b))]).reshape(len(b), n * n).double()
        dots = gx @ gy.T
        self_x, self_y = gx.square().sum(1).sqrt(), gy.square().sum(1).sqrt()
    else:
        def cross(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
            return (p.T @ q).double().square().sum()

        self_y = torch.stack([cross(y, y) for y in (centred(b[j]) for j in range(len(b)))]).sqrt()
        dots, self_x = torch.zeros(len(a), len(b), dtype=torch.float64), torch.zeros(len(a), dtype=torch.float64)
        for i in range(len(a)):
            x = centred(a[i])
            self_x[i] = cross(x, x).sqrt()
            for j in range(len(b)):
                dots[i, j] = cross(x, centred(b[j]))
    cka = (dots / (self_x[:, None] * self_y[None, :]).clamp(min=1e-300)).numpy()
    cka[constant_layers(a), :] = np.nan
    cka[:, constant_layers(b)] = np.nan
    return cka


def _unbiased_hsic(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Song et al. 2012 eq. 5 for ``K = XX'``, ``L = YY'`` (float64), with ``K~``/``L~`` their diagonals zeroed:
    ``[tr(K~L~) + 1'K~1 1'L~1 / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3))``, using
    ``tr(K~L~) = ||X'Y||_F^2 - sum_i |x_i|^2 |y_i|^2``, ``1'K~1 = |sum_i x_i|^2 - sum_i |x_i|^2`` and
    ``K~1 = X (X'1) - (|x_i|^2)_i``."""
    n = x.shape[0]
    kx, ky = x.square().sum(1), y.square().sum(1)
    trace = (x.T @ y).square().sum() - (kx * ky).sum()
    ones_k, ones_l = x.sum(0).square().sum() - kx.sum(), y.sum(0).square().sum() - ky.sum()
    k1, l1 = x @ x.sum(0) - kx, y @ y.sum(0) - ky
    return (trace + ones_k * ones_l / ((n - 1) * (n - 2)) - 2 / (n - 2) * (k1 @ l1)) / (n * (n - 3))


def debiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Debiased linear CKA of ``x`` ``(n, d1)`` and ``y`` ``(n, d2)`` (module docstring); needs ``n >= 4``. NaN
    when either side is constant. Can be slightly negative for unrelated representations (it is unbiased)."""
    if len(x) < 4:
        raise ValueError("debiased CKA needs at least 4 rows")
    a = torch.from_numpy(np.asarray(x, dtype=np.float64))
    b = torch.from_numpy(np.asarray(y, dtype=np.float64))
    a, b = a - a.mean(0), b - b.mean(0)  # centring does not change the unbiased HSIC; it helps the rounding
    xy, xx, yy = _unbiased_hsic(a, b), _unbiased_hsic(a, a), _unbiased_hsic(b, b)
    if xx <= 0 or yy <= 0:
        return float("nan")
    return float(xy / (xx * yy).sqrt())


def paired_cka(a: np.ndarray, b: np.ndarray, layers: list[int], seed: int = 0, max_rows: int = 1000,
               debiased: bool = False, layers_b: list[int] | None = None) -> list[dict]:
    """Per layer ``l`` of ``layers``: the CKA of ``a[l]`` ``(n, d)`` and ``b[l]`` (the same rows; ``b[layers_b[k]]``
    for the ``k``-th layer when given: models of different depth) with a 95%
    delete-one **jackknife** interval (Efron & Stein 1981; Efron 1982 ch. 3): ``cka +- 1.96 se``, ``se^2 = (m-1)/m
    sum_i (cka_(i) - mean)^2`` over the ``m`` estimates that leave one row out, clipped to CKA's range ([0, 1];
    [-1, 1] debiased). Not a bootstrap: resampling rows with replacement duplicates rows, and a duplicated row
    agrees with itself, so resampled CKA sits above the estimate when rows are few for the width (77 rows x 64
    dimensions: an interval entirely above its own estimate) and debiased CKA's U-statistic counts a row's copies as
    distinct pairs. The value is on all rows and the interval is centred on it; its standard error is estimated on
    ``min(n, max_rows)`` of the rows (a seeded sample above that, as the leave-one-out estimates cost ``m^2`` each):
    above ``max_rows`` rows it is the standard error of a ``max_rows``-row estimate, larger than the full data's, so
    the interval is wider than the full data's (conservative). Plain CKA is biased upward when rows
    are few compared with the width; the interval measures its spread, not that bias (debiased CKA has none).
    Returns ``[{"layer", "cka", "ci_low", "ci_high", "bootstrap_rows"}]`` (``bootstrap_rows``: the rows the
    interval used; the column keeps its first name, a contract of ``layer_summary.csv``).

    ``a`` and ``b`` may be sequences of layers read on demand (memory-mapped): one layer of each is read at a time.
    The ``m`` leave-one-out estimates are :func:`_gram_cka` of the Gram matrices without that row, computed all at
    once as multiplicities ``1 - I`` (:func:`_resampled_cka`)."""
    rng = np.random.default_rng(seed)
    n = a[layers[0]].shape[0] if layers else 0
    sub = np.sort(rng.choice(n, max_rows, replace=False)) if n > max_rows else np.arange(n)
    m = len(sub)
    lowest = -1.0 if debiased else 0.0
    out = []
    for layer, layer_b in zip(layers, layers if layers_b is None else layers_b, strict=True):
        x, y = np.asarray(a[layer]), np.asarray(b[layer_b])
        value = debiased_cka(x, y) if debiased else float(linear_cka(x[None], y[None])[0, 0])
        low = high = np.nan
        if np.isfinite(value) and m > (4 if debiased else 2):
            # centred first (by the sample's mean; each leave-one-out set is centred again exactly by
            # _resampled_cka): uncentred Grams of vectors sharing a large mean cancel their terms (mean^2/variance
            # ~1e5 at MiniLM's early layers gave an interval 7x too wide; issue 53 item 4)
            gx, gy = np.asarray(x[sub], np.float64), np.asarray(y[sub], np.float64)
            gx, gy = gx - gx.mean(0), gy - gy.mean(0)
            leave_one_out = _resampled_cka(gx @ gx.T, gy @ gy.T, 1.0 - np.eye(m), debiased)
            if np.isfinite(leave_one_out).all():
                se = jackknife(value, leave_one_out)[0]  # delete-one: (m-1)/m sum (cka_(i) - mean)^2
                low, high = max(value - Z95 * se, lowest), min(value + Z95 * se, 1.0)
        out.append({"layer": layer, "cka": value, "ci_low": float(low), "ci_high": float(high),
                    "bootstrap_rows": m})
    return out


def _resampled_cka(kx: np.ndarray, ky: np.ndarray, counts: np.ndarray, debiased: bool) -> np.ndarray:
    """:func:`_gram_cka` of ``K[idx][:, idx]`` and ``L[idx][:, idx]`` for every resample, given as ``counts``
    ``(resamples, n)``, each row's multiplicity ``w`` (``m = sum w`` rows). With ``a = K w``, ``b = L w``:

    - plain: the centred Grams' inner product is ``w'(K o L)w - 2/m sum_i w_i a_i b_i + (w'a)(w'b)/m^2``;
    - debiased (diagonals zeroed; a row drawn twice keeps its off-diagonal copies): ``tr(K~L~) = w'(K o L)w -
      w.diag(K o L)``, ``1'K~1 = w'a - w.diag K`` and ``1'K~L~1 = sum_i w_i (a_i - K_ii)(b_i - L_ii)``.

    A few ``(resamples, n) x (n, n)`` products in all, instead of ``3 x resamples`` centred ``m x m`` matrices."""
    w = counts
    m = w.sum(1)
    wk, wl = w @ kx, w @ ky  # (resamples, n): a', b' per resample

    def hsic(p, wp, q, wq, hadamard):
        quad = ((w @ hadamard) * w).sum(1)  # w'(P o Q)w
        if debiased:
            dp, dq = np.diag(p), np.diag(q)
            trace = quad - w @ np.diag(hadamard)
            ones_p, ones_q = (wp * w).sum(1) - w @ dp, (wq * w).sum(1) - w @ dq
            cross = (w * (wp - dp) * (wq - dq)).sum(1)
            return (trace + ones_p * ones_q / ((m - 1) * (m - 2)) - 2 / (m - 2) * cross) / (m * (m - 3))
        return quad - 2 / m * (w * wp * wq).sum(1) + (wp * w).sum(1) * (wq * w).sum(1) / m ** 2

    xy = hsic(kx, wk, ky, wl, kx * ky)
    xx = hsic(kx, wk, kx, wk, kx * kx)
    yy = hsic(ky, wl, ky, wl, ky * ky)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((xx > 0) & (yy > 0), xy / np.sqrt(np.clip(xx, 1e-300, None) * np.clip(yy, 1e-300, None)),
                        np.nan)


def _gram_cka(kx: np.ndarray, ky: np.ndarray, debiased: bool) -> float:
    """CKA from Gram matrices ``(n, n)`` (the same definitions as above, in their Gram form; numpy, one thread:
    on a busy machine torch's threads made these small operations 10x slower)."""
    n = len(kx)
    if debiased:
        def hsic(p, q):
            p, q = p.copy(), q.copy()
            np.fill_diagonal(p, 0)
            np.fill_diagonal(q, 0)
            return ((p * q).sum() + p.sum() * q.sum() / ((n - 1) * (n - 2)) - 2 / (n - 2) * (p.sum(0) @ q.sum(0))) \
                / (n * (n - 3))
        xx, yy, xy = hsic(kx, kx), hsic(ky, ky), hsic(kx, ky)
    else:
        def centre(p):  # H p H with H = I - 11'/n, in O(n^2)
            m = p.mean(0)
            return p - m[None, :] - m[:, None] + m.mean()  # a Gram is symmetric: row means = column means

        cx, cy = centre(kx), centre(ky)
        xx, yy, xy = (cx * cx).sum(), (cy * cy).sum(), (cx * cy).sum()
    if xx <= 0 or yy <= 0:
        return float("nan")
    return float(xy / np.sqrt(xx * yy))
