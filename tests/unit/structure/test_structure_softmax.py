"""The label probes' multinomial logistic regression (analysis.structure.softmax) against scikit-learn's
LogisticRegression: the same objective, so at convergence the same model, within float32 tolerance."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from analysis.structure.softmax import fit_softmax


def _problem(n=300, d=12, k=4, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=n)
    centres = rng.normal(size=(k, d))
    x = (rng.normal(size=(n, d)) * rng.uniform(0.5, 4, size=d) + centres[y] + 3).astype(np.float32)
    x[:, 0] = 2.5  # a constant column: scikit-learn's StandardScaler leaves it at scale 1
    return x, np.array(list("abcdefgh"))[y].astype(object)


def _objective(xs, codes, coef, intercept, C=1.0):
    """scikit-learn's objective in float64, written out: mean cross-entropy + ||W||^2 / (2 C n)."""
    z = xs @ coef.astype(np.float64) + intercept.astype(np.float64)
    top = z.max(1, keepdims=True)
    lse = np.log(np.exp(z - top).sum(1)) + top[:, 0]
    return (lse - z[np.arange(len(z)), codes]).mean() + (coef.astype(np.float64) ** 2).sum() / (2 * C * len(z))


def test_converged_model_equals_scikit_learns():
    """Both minimise the same strictly convex objective: the minima agree to float32's resolution of it (1e-7
    relative), which leaves the flattest directions (the intercepts) free by about 1e-3: probabilities within
    2e-3, identical predictions."""
    x, y = _problem()
    ours = fit_softmax(x, y, max_iter=10_000, tol=1e-7)
    plain = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=10_000, tol=1e-10)).fit(x, y)
    assert list(ours.classes_) == list(plain.classes_)
    xs, codes = plain[0].transform(x), np.searchsorted(plain.classes_, y)
    best = _objective(xs, codes, plain[-1].coef_.T, plain[-1].intercept_)
    assert _objective(xs, codes, ours.coef, ours.intercept) == pytest.approx(best, rel=1e-6)
    assert np.abs(ours.predict_proba(x) - plain.predict_proba(x)).max() < 2e-3
    assert (ours.predict(x) == plain.predict(x)).all()


def test_default_stopping_rule_is_scikit_learns():
    """max_iter 100, gtol 1e-4 on the mean loss: a problem that converges early stops where scikit-learn's does."""
    x, y = _problem(n=200, d=6, k=3, seed=1)
    ours = fit_softmax(x, y)
    plain = make_pipeline(StandardScaler(), LogisticRegression()).fit(x, y)
    assert ours.n_iter < 100 and abs(ours.n_iter - plain[-1].n_iter_[0]) <= 3
    assert np.abs(ours.predict_proba(x) - plain.predict_proba(x)).max() < 1e-3


def test_a_warm_start_at_the_optimum_stays_there():
    x, y = _problem(seed=2)
    first = fit_softmax(x, y, max_iter=10_000, tol=1e-5)
    again = fit_softmax(x, y, max_iter=10_000, tol=1e-5, init=first)
    assert again.n_iter < first.n_iter / 2  # it starts where the first ended (float32's flat floor: a few steps)
    assert np.abs(again.predict_proba(x) - first.predict_proba(x)).max() < 1e-3


def test_a_warm_start_from_other_rows_reaches_the_same_optimum():
    """The MDL blocks warm-start from the previous block's model (other rows, so other standardisation): the
    optimum is unique, so the result is the one a cold start reaches."""
    x, y = _problem(n=400, seed=3)
    small = fit_softmax(x[:100], y[:100], classes=np.unique(y))
    cold = fit_softmax(x, y, max_iter=10_000, tol=1e-7)
    warm = fit_softmax(x, y, max_iter=10_000, tol=1e-7, init=small)
    assert np.abs(warm.predict_proba(x) - cold.predict_proba(x)).max() < 2e-3


def test_given_classes_give_a_column_for_labels_not_in_the_rows():
    x, y = _problem(k=3, seed=4)
    model = fit_softmax(x, y, classes=np.array(list("abcd"), dtype=object))
    p = model.predict_proba(x)
    assert p.shape == (len(x), 4) and np.allclose(p.sum(1), 1, atol=1e-5)
    assert p[:, 3].max() < 0.05 and (model.predict(x) != "d").all()


def test_one_class_predicts_it():
    x, _ = _problem(n=20)
    model = fit_softmax(x, np.array(["a"] * 20, dtype=object))
    assert (model.predict(x) == "a").all() and np.allclose(model.predict_proba(x), 1)


def test_labels_outside_the_given_classes_are_refused():
    x, y = _problem(k=3)
    with pytest.raises(ValueError, match="not among"):
        fit_softmax(x, y, classes=np.array(["a", "b"], dtype=object))
