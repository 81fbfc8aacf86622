"""Individual units of each layer (Dalvi et al. 2019, AAAI, "What Is One Grain of Sand in the Desert?"):

1. **Probe** (§3.1): for each hidden state ``l``, a logistic-regression probe on the sentence vectors of a labelled
   set's training rows (standardised; scikit-learn's elastic net, ``saga``; the paper's probe is a linear
   classifier with elastic-net regularisation, Eq. 1-2).
2. **Rank** (§3.3, "Linguistic Correlation Analysis", simplified): a unit's score is the largest absolute weight it
   has for any class, ``max_c |w_{c,j}|``, on standardised features (so weights compare across units); units
   are ranked by it. The paper instead walks the classes, taking each class's top units until a share of that
   class's weight mass is covered; ranking by the largest class weight is that walk's first step for every class
   at once (``docs/neurons.md`` argues the choice).
3. **Ablate** (§4.1, ablation): the top ``k`` units of state ``l`` are zeroed **in the model**, at that state's
   module output (:func:`analysis.core.interventions.intervene`), and the held-out rows are encoded again. Two
   accuracies are measured: the state-``l`` probe's on the ablated state-``l`` vectors (the paper's: the
   classifier without retraining), and the last state's probe on the last state (what the ablation does
   downstream). Against: no ablation, the bottom ``k`` units, and ``k`` random units (``random_seeds`` draws).

Every accuracy comes with its 95% Wilson interval and the majority-class baseline of the training rows.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd
import torch

from analysis.core.inputs import InputError, TextInputs
from analysis.core.interventions import intervene, state_modules
from analysis.core.layers import parse_layers
from analysis.core.scores import WILSON, majority_class, wilson_interval
from analysis.core.vectors import Progress, extract
from analysis.neurons.options import NeuronsConfig
from models.loading import LoadedModel

ABLATION_COLUMNS = ["layer", "ablated", "seed", "k", "accuracy", "ci_low", "ci_high", "final_accuracy",
                    "final_ci_low", "final_ci_high", "majority"]


@dataclasses.dataclass
class NeuronsResult:
    """``ranking``: layer, rank (1 = most important), unit, score; ``ablation``: :data:`ABLATION_COLUMNS`;
    ``info``: what ran."""

    ranking: pd.DataFrame
    ablation: pd.DataFrame
    info: dict


def split(labels: tuple[str, ...], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test row indices, stratified by class (every class needs 2 rows)."""
    from sklearn.model_selection import train_test_split

    counts = pd.Series(labels).value_counts()
    if len(counts) < 2:
        raise InputError("the labels hold a single class: a probe needs at least two")
    if counts.min() < 2:
        raise InputError(f"class '{counts.idxmin()}' has one row: every class needs at least two (one to train, "
                         "one to test)")
    rows = np.arange(len(labels))
    try:
        return train_test_split(rows, test_size=fraction, random_state=seed, stratify=list(labels))
    except ValueError as exc:  # too few rows for the share asked
        raise InputError(f"cannot hold out {fraction:.0%} of {len(labels)} rows by class: {exc}") from None


MAX_ITER = 3000  # the saga probe's iterations


def fit_probe(x: np.ndarray, y: np.ndarray, config: NeuronsConfig):
    """The standardised elastic-net probe (step 1) and each unit's score (step 2)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(
        solver="saga", l1_ratio=config.l1_ratio, C=config.C, max_iter=MAX_ITER, tol=1e-5,
        random_state=config.seed))
    with warnings.catch_warnings():  # recorded in run.json and said on the page, not a warning on stderr
        warnings.simplefilter("ignore", ConvergenceWarning)
        probe.fit(x, y)
    return probe, np.abs(probe[-1].coef_).max(axis=0)


def converged(probe) -> bool:
    """Whether the probe's solver stopped at its tolerance before ``max_iter`` (its ranking, else, depends on where
    it stopped)."""
    return bool(np.max(probe[-1].n_iter_) < MAX_ITER)


def unit_sets(scores: np.ndarray, k: int, seeds: int, seed: int) -> list[tuple[str, int | None, np.ndarray]]:
    """The units each ablation zeroes: (``top``, ``bottom``, ``random`` per seed), ``k`` each."""
    order = np.argsort(-scores, kind="stable")
    k = min(k, len(scores))
    sets = [("top", None, order[:k]), ("bottom", None, order[-k:])]
    for s in range(seeds):
        sets.append(("random", s, np.sort(np.random.default_rng([seed, s]).choice(len(scores), k, replace=False))))
    return sets


def zeroed(loaded: LoadedModel, inputs: TextInputs, state: int, units: np.ndarray, config: NeuronsConfig
           ) -> np.ndarray:
    """The sentence vectors of every state with ``units`` zeroed at state ``state``'s output."""
    chosen = torch.as_tensor(units, dtype=torch.long)

    def zero(layer, value):
        if layer != state:
            return None
        value = value.clone()
        value[..., chosen.to(value.device)] = 0
        return value

    with intervene(loaded.model, state_modules(loaded.model), zero):
        return extract(loaded, inputs, config.pooling, config.max_length, config.batch_size)


def neurons(loaded: LoadedModel, inputs: TextInputs, config: NeuronsConfig | None = None,
            progress: Progress | None = None) -> NeuronsResult:
    """Probe, rank and ablate (module docstring)."""
    config = config or NeuronsConfig()
    if inputs.labels is None:
        raise InputError("no label column: the neurons are ranked by a probe of the labels; choose the label column")
    start = time.perf_counter()
    n_states = loaded.num_layers + 1
    layers = parse_layers(config.layers, n_states)
    train, test = split(inputs.labels, config.test_fraction, config.seed)
    y = np.asarray(inputs.labels)
    vectors = extract(loaded, inputs, config.pooling, config.max_length, config.batch_size, progress)
    majority = majority_class(y[train])
    base_rate = float(np.mean(y[test] == majority))
    final = n_states - 1
    probes, unit_scores, ranking, undefined = {}, {}, [], {}
    for state in sorted({*layers, final}):
        probes[state], scores = fit_probe(vectors[state][train], y[train], config)
        unit_scores[state] = scores
        if state in layers and not scores.any():
            undefined[state] = ("every unit scores 0 (the probe's weights are all zero: the state is one vector for "
                                "every row, e.g. [CLS] at the embeddings): no top units to rank or ablate")
        elif state in layers:
            order = np.argsort(-scores, kind="stable")
            ranking.append(pd.DataFrame({"layer": state, "rank": np.arange(1, len(order) + 1), "unit": order,
                                         "score": scores[order]}))
    held_out = inputs.subset(test.tolist())
    rows = []

    def row(state, ablated, seed, k, states):
        right = int((probes[state].predict(states[state]) == y[test]).sum())
        right_final = int((probes[final].predict(states[final]) == y[test]).sum())
        low, high = wilson_interval(right, len(test))
        final_low, final_high = wilson_interval(right_final, len(test))
        rows.append([state, ablated, seed, k, right / len(test), low, high, right_final / len(test), final_low,
                     final_high, base_rate])

    plain = vectors[:, test]
    per_state = 2 + config.random_seeds  # top, bottom and the random draws
    for done, state in enumerate(layers):
        row(state, "none", None, 0, plain)
        if state in undefined:
            continue
        for number, (ablated, seed, units) in enumerate(unit_sets(unit_scores[state], config.k, config.random_seeds,
                                                                  config.seed)):
            if progress is not None:
                progress("ablating", done * per_state + number, len(layers) * per_state)
            row(state, ablated, seed, len(units), zeroed(loaded, held_out, state, units, config))
    ablation = pd.DataFrame(rows, columns=ABLATION_COLUMNS)
    ablation["seed"] = ablation["seed"].astype("Int64")
    info = {"rows": len(inputs), "train_rows": len(train), "test_rows": len(test), "layers": layers,
            "majority_class": str(majority), "interval": WILSON, "options": config.to_dict(),
            "probe": "standardised features, scikit-learn LogisticRegression(solver='saga', elastic net)",
            "score": "max over classes of |weight| (Dalvi et al. 2019 §3.3, simplified: docs/neurons.md)",
            "undefined": {str(k): v for k, v in undefined.items()},
            "not_converged": [state for state in sorted(probes) if not converged(probes[state])],
            "convergence": f"the saga probe stops at tol 1e-5 or after {MAX_ITER} iterations; a state listed in "
                           "not_converged stopped at the limit, and its ranking depends on where it stopped",
            "seconds": round(time.perf_counter() - start, 3)}
    columns = ["layer", "rank", "unit", "score"]
    return NeuronsResult(pd.concat(ranking, ignore_index=True) if ranking else pd.DataFrame(columns=columns),
                         ablation, info)
