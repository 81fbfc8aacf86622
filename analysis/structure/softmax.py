"""The label probes' linear model: multinomial logistic regression on standardised features.

This is scikit-learn's ``make_pipeline(StandardScaler(), LogisticRegression())`` with its defaults (``C = 1``,
lbfgs), the probe Hewitt & Liang 2019 §3 and Tenney et al. 2019 use, computed faster:

- **Objective** (scikit-learn 1.9's, ``LinearModelLoss`` with ``l2_reg_strength = 1 / (C n)``): over the ``K``
  classes' weights ``W`` ``(d, K)`` and intercepts ``b`` (not penalised), on standardised rows ``x_i``::

      mean_i [ logsumexp(x_i W + b) - (x_i W + b)_{y_i} ]  +  ||W||^2 / (2 C n)

  It is strictly convex, so its minimum is one model whichever optimiser or start reaches it.
- **Optimiser**: the same as scikit-learn's: scipy's L-BFGS-B from zero, at most ``max_iter = 100`` iterations,
  ``gtol = tol = 1e-4``, ``ftol = 64 eps``, ``maxls = 50``.
- **Standardisation** as ``StandardScaler``: the training rows' mean and population standard deviation
  (a column of zero variance keeps scale 1).

The difference is arithmetic, argued: scikit-learn evaluates the loss and gradient in float64 on one thread
(``n_threads = 1`` in its lbfgs path); here they are two float32 matrix products per evaluation (torch, on the
threads it is given: one per fit in a structure run, whose fits run side by side,
:func:`analysis.structure.run.parallel_fits`), with the loss summed in float64 so that L-BFGS-B's line search
sees a smooth function. Tests check the converged model against scikit-learn's
(``tests/unit/structure/test_structure_softmax.py``:
the objective equal to 1e-6 relative, probabilities within 2e-3, predictions identical; float32 resolves the
objective to about 1e-7, which leaves its flattest directions, the intercepts, free by about 1e-3; measured on
the test's planted problems with seeds 0-5: 1.2e-5 to 3.0e-4) and the stopping rule (the same iteration count
within 3 on a problem that converges early; equal on six such problems measured).

``classes`` may name labels absent from the rows (the MDL blocks, whose probe has an output for each of the
task's ``K`` labels, as in Voita & Titov 2020): their intercepts fall as far as the iterations take them, so
such a label gets a small, finite probability. ``init`` warm-starts from another fit of the same classes, carried
over through the raw (unstandardised) features so that it is the same function; the optimum does not depend on
the start, only the number of iterations does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.optimize
import torch

MAX_ITER = 100  # scikit-learn's LogisticRegression defaults
TOL = 1e-4


@dataclasses.dataclass(frozen=True)
class SoftmaxRegression:
    """A fitted probe: ``coef`` ``(d, K)`` and ``intercept`` ``(K,)`` in standardised units, the training rows'
    ``mean`` and ``scale``, the labels ``classes_`` (sorted), the L-BFGS iterations ``n_iter`` and the loss and
    gradient evaluations ``n_eval`` (two matrix products each: what a fit costs)."""

    classes_: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    n_iter: int
    n_eval: int = 0

    def decision_function(self, x: np.ndarray) -> torch.Tensor:
        xs = _standardise(x, self.mean, self.scale)
        return torch.addmm(torch.from_numpy(self.intercept), xs, torch.from_numpy(self.coef))

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        return torch.softmax(self.decision_function(x), 1).numpy()

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.classes_[self.decision_function(x).argmax(1).numpy()]

    def raw(self) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` on the raw features: ``x W + b`` equals the standardised model's scores."""
        w = self.coef.astype(np.float64) / self.scale[:, None]
        return w, self.intercept.astype(np.float64) - self.mean @ w


def _standardise(x: np.ndarray, mean: np.ndarray, scale: np.ndarray) -> torch.Tensor:
    xs = torch.from_numpy(np.asarray(x, dtype=np.float32)).clone()
    xs -= torch.from_numpy(mean.astype(np.float32))
    xs /= torch.from_numpy(scale.astype(np.float32))
    return xs


def fit_softmax(x: np.ndarray, y: np.ndarray, classes: np.ndarray | None = None, C: float = 1.0,
                max_iter: int = MAX_ITER, tol: float = TOL, init: SoftmaxRegression | None = None
                ) -> SoftmaxRegression:
    """Fit the probe to rows ``x`` ``(n, d)`` and labels ``y`` ``(n,)`` (module docstring)."""
    labels = np.asarray(y)
    classes = np.unique(labels) if classes is None else np.sort(np.asarray(classes))
    codes = np.searchsorted(classes, labels).clip(max=len(classes) - 1)
    if (classes[codes] != labels).any():
        raise ValueError(f"labels {sorted(set(labels[classes[codes] != labels].tolist()))[:5]} are not among the "
                         "given classes")
    x = np.asarray(x, dtype=np.float32)
    n, d = x.shape
    k = len(classes)
    mean = x.mean(0, dtype=np.float64)
    scale = x.std(0, dtype=np.float64)
    scale[scale < 10 * np.finfo(np.float64).eps] = 1.0  # as StandardScaler
    if k == 1:
        return SoftmaxRegression(classes, np.zeros((d, 1), np.float32), np.zeros(1, np.float32), mean, scale, 0)
    xs = _standardise(x, mean, scale)
    target = torch.from_numpy(codes.astype(np.int64))
    rows = torch.arange(n)
    l2 = 1.0 / (C * n)

    def loss_grad(w: np.ndarray) -> tuple[float, np.ndarray]:
        wt = torch.from_numpy(w.astype(np.float32))
        coef, intercept = wt[:d * k].view(d, k), wt[d * k:]
        z = torch.addmm(intercept, xs, coef)
        lse = torch.logsumexp(z, 1)
        loss = (lse - z[rows, target]).sum(dtype=torch.float64).item() / n
        loss += 0.5 * l2 * float(np.dot(w[:d * k], w[:d * k]))
        p = torch.exp(z - lse[:, None])  # softmax; minus the one-hot target: d loss / d z, times n
        p[rows, target] -= 1.0
        grad = np.empty_like(w)
        grad[:d * k] = (xs.T @ p).numpy().ravel() / n + l2 * w[:d * k]
        grad[d * k:] = p.sum(0, dtype=torch.float64).numpy() / n
        return loss, grad

    w0 = np.zeros(d * k + k)
    if init is not None:
        if list(init.classes_) != list(classes):
            raise ValueError("a warm start needs a model of the same classes")
        w_raw, b_raw = init.raw()
        w0[:d * k] = (w_raw * scale[:, None]).ravel()
        w0[d * k:] = b_raw + mean @ w_raw
    result = scipy.optimize.minimize(loss_grad, w0, jac=True, method="L-BFGS-B",
                                     options={"maxiter": max_iter, "maxls": 50, "gtol": tol,
                                              "ftol": 64 * np.finfo(float).eps})
    w = result.x.astype(np.float32)
    return SoftmaxRegression(classes, w[:d * k].reshape(d, k).copy(), w[d * k:].copy(), mean, scale,
                             int(result.nit), int(result.nfev))
