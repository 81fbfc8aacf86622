"""Label probes on word vectors: UPOS of each word and the dependency relation of each arc, with control tasks.

- **UPOS**: one example per word, its vector at the layer.
- **Dependency relation** (an edge probe, Tenney et al. 2019 §2): one example per arc, the dependent's and the
  head's vectors concatenated ``[h_dep; h_head]``, labelled with the full UD DEPREL (subtypes kept). Root arcs
  are **excluded**: the root has no head word to concatenate and its label is always ``root`` (HEAD 0 alone
  decides it), so it would only add free accuracy.
- **Probe**: multinomial logistic regression on standardised features (scikit-learn's ``LogisticRegression``
  objective and lbfgs stopping rule, L2, ``C = 1``, at most 100 iterations: its defaults; computed in float32 by
  :mod:`analysis.structure.softmax`, one thread per fit, a layer's fits side by side:
  :func:`analysis.structure.run.parallel_fits`), or with
  ``mlp`` a one-hidden-layer MLP (ReLU, Adam, early stopping on 10% of the training rows), as Hewitt & Liang
  2019 §3.
- **Control task** (Hewitt & Liang 2019 §2, Eq. 1-2): each word *type* (FORM, case kept) gets a label drawn from
  the task's empirical label distribution on the training file, once, seeded; every occurrence of the type has
  that label, in both files. Theirs is for part of speech (their dependency control task is about heads, not
  labels); the DEPREL control here is this project's extension of it: the dependent's type gets a relation label
  the same way. The same probe family is trained and
  scored on the control labels; **selectivity** = task score - control score (their Eq. 3, on accuracy; also
  given for macro-F1).
- **Scores** on the test file: accuracy with its 95% Wilson interval; macro-F1 (the mean F1 over the classes that
  occur in the gold labels or the predictions, scikit-learn's default) with a 95% percentile bootstrap interval
  over test *sentences* (1,000 resamples; words of one sentence are not independent); the majority baseline is
  the training file's most frequent label scored on the test file (:mod:`analysis.core.scores`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter

import numpy as np

from analysis.core.scores import class_baseline, majority_class, wilson_interval
from analysis.core.treebank import Sentence
from analysis.structure.softmax import fit_softmax

PROBES = ("linear", "mlp")
LABEL_TASKS = ("upos", "deprel")
BOOTSTRAP = 1000


@dataclasses.dataclass(frozen=True)
class LabelData:
    """One file's examples for a label task: which words (rows of a layer's word vectors) make each example,
    the label, the word type (for control tasks) and the sentence (for the bootstrap)."""

    rows: np.ndarray  # (n,) or (n, 2): word rows; two for an arc (dependent, head)
    labels: np.ndarray  # (n,) str
    types: np.ndarray  # (n,) str: the (dependent) word's form
    sentence: np.ndarray  # (n,) index of the sentence among the kept ones

    def features(self, layer: np.ndarray) -> np.ndarray:
        """``(n, hidden)`` or ``(n, 2 * hidden)``: the examples' vectors from ``layer`` ``(words, hidden)``."""
        x = np.asarray(layer[self.rows.reshape(-1)], dtype=np.float32)
        return x.reshape(len(self.rows), -1)


def label_data(task: str, sentences: list[Sentence], offsets: np.ndarray) -> LabelData:
    """The examples of ``task`` (``upos`` or ``deprel``) in ``sentences`` (the kept ones, whose words start at
    ``offsets``)."""
    rows, labels, types, sent = [], [], [], []
    for s, sentence in enumerate(sentences):
        base = int(offsets[s])
        for i in range(len(sentence)):
            if task == "upos":
                rows.append([base + i])
                labels.append(sentence.upos[i])
            elif sentence.heads[i] != 0:  # deprel: root arcs excluded (module docstring)
                rows.append([base + i, base + sentence.heads[i] - 1])
                labels.append(sentence.deprels[i])
            else:
                continue
            types.append(sentence.words[i])
            sent.append(s)
    width = 1 if task == "upos" else 2
    return LabelData(np.asarray(rows, dtype=np.int64).reshape(-1, width), np.asarray(labels, dtype=object),
                     np.asarray(types, dtype=object), np.asarray(sent, dtype=np.int64))


def control_labels(train: LabelData, types: set, seed: int) -> dict:
    """Hewitt & Liang's control task: each type in ``types`` -> a label drawn from the training labels'
    empirical distribution, independently per type, with a generator seeded by ``seed`` (types in sorted order,
    so equal inputs give equal labels)."""
    counts = Counter(train.labels.tolist())
    names = sorted(counts)
    p = np.array([counts[n] for n in names], dtype=float)
    rng = np.random.default_rng(seed)
    ordered = sorted(types)
    drawn = rng.choice(len(names), size=len(ordered), p=p / p.sum())
    return {t: names[k] for t, k in zip(ordered, drawn, strict=True)}


def with_control(data: LabelData, control: dict) -> LabelData:
    return dataclasses.replace(data, labels=np.asarray([control[t] for t in data.types], dtype=object))


def make_mlp(seed: int, mlp_hidden: int = 256, early_stopping: bool = True):
    """A fresh scikit-learn MLP probe on standardised inputs. It stops early on a stratified 10% of its rows where
    every class has enough of them (``early_stopping``)."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), MLPClassifier(hidden_layer_sizes=(mlp_hidden,), max_iter=200,
                                                         early_stopping=early_stopping, random_state=seed))


def fit(probe: str, x: np.ndarray, y: np.ndarray, seed: int):
    """A fitted probe of the family ``probe`` (``linear`` or ``mlp``) with ``predict``, ``predict_proba`` and
    ``classes_``."""
    if probe not in PROBES:
        raise ValueError(f"unknown probe '{probe}'; choose one of {', '.join(PROBES)}")
    if probe == "linear":  # deterministic: no seed to use
        return fit_softmax(x, y)
    counts = Counter(y.tolist())
    if len(counts) == 1:  # one class: nothing to learn; predict it
        return _Constant(y[0])
    model = make_mlp(seed, early_stopping=len(y) >= 200 and min(counts.values()) >= 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning at max_iter: the scores say how good it is
        model.fit(x, y)
    return model


class _Constant:
    def __init__(self, label):
        self.label, self.classes_ = label, np.asarray([label], dtype=object)

    def predict(self, x):
        return np.full(len(x), self.label, dtype=object)

    def predict_proba(self, x):
        return np.ones((len(x), 1))


def macro_f1_bootstrap(y: np.ndarray, pred: np.ndarray, sentence: np.ndarray, n_boot: int = BOOTSTRAP,
                       seed: int = 0, weights: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """Macro-F1 of ``pred`` against ``y`` (over the classes present in either, as scikit-learn's default), and
    its value on ``n_boot`` resamples of the sentences (drawn with replacement, seeded): ``(value, (n_boot,))``.
    ``weights`` ``(n_boot, n_sentences)``: given resample counts instead of drawing them."""
    classes, codes = np.unique(np.concatenate([y, pred]).astype(str), return_inverse=True)
    t_code, p_code = codes[:len(y)], codes[len(y):]
    n_sent, c = int(sentence.max()) + 1, len(classes)
    true = np.zeros((n_sent, c))
    np.add.at(true, (sentence, t_code), 1)
    predicted = np.zeros((n_sent, c))
    np.add.at(predicted, (sentence, p_code), 1)
    hit = np.zeros((n_sent, c))
    ok = t_code == p_code
    np.add.at(hit, (sentence[ok], t_code[ok]), 1)

    def macro(w: np.ndarray) -> np.ndarray:
        tp, t, p = w @ hit, w @ true, w @ predicted
        present = (t + p) > 0
        f1 = np.divide(2 * tp, t + p, out=np.zeros_like(tp), where=present)
        return f1.sum(1) / np.maximum(present.sum(1), 1)

    value = float(macro(np.ones((1, n_sent)))[0])
    if weights is None:
        rng = np.random.default_rng(seed)
        weights = rng.multinomial(n_sent, np.full(n_sent, 1 / n_sent), size=n_boot).astype(float)
    return value, macro(weights)


def percentile_interval(samples: np.ndarray) -> tuple[float, float]:
    return float(np.percentile(samples, 2.5)), float(np.percentile(samples, 97.5))


@dataclasses.dataclass
class LabelScores:
    accuracy: float
    accuracy_ci: tuple[float, float]
    macro_f1: float
    macro_f1_ci: tuple[float, float]
    correct_per_sentence: np.ndarray  # (n_sentences,) for the summary's bootstrap
    examples_per_sentence: np.ndarray
    predictions: np.ndarray


def score(y: np.ndarray, pred: np.ndarray, sentence: np.ndarray, n_sentences: int, seed: int = 0) -> LabelScores:
    """Accuracy (95% Wilson interval) and macro-F1 (95% sentence-bootstrap interval) of ``pred``."""
    ok = np.asarray(y == pred, dtype=bool)
    correct = int(ok.sum())
    f1, samples = macro_f1_bootstrap(y, pred, sentence, seed=seed)
    return LabelScores(correct / len(y), wilson_interval(correct, len(y)), f1, percentile_interval(samples),
                       np.bincount(sentence[ok], minlength=n_sentences),
                       np.bincount(sentence, minlength=n_sentences), pred)


def baseline(train: LabelData, test: LabelData) -> dict:
    """The training file's majority label (:func:`analysis.core.scores.majority_class`) scored on the test file:
    accuracy, and macro-F1 over the classes of the test labels and the guess (the probes' definition)."""
    majority = majority_class(train.labels.tolist())
    return class_baseline(majority, test.labels.tolist(), sorted(set(test.labels.tolist()) | {majority}))


def run_layer(probe: str, train: LabelData, test: LabelData, train_x: np.ndarray, test_x: np.ndarray,
              n_test_sentences: int, seed: int) -> LabelScores:
    """Train the probe on ``train``'s examples, whose features at one layer are ``train_x`` (``train.features``
    of the layer), and score it on ``test``'s (``test_x``)."""
    model = fit(probe, train_x, train.labels, seed)
    pred = np.asarray(model.predict(test_x), dtype=object)
    return score(test.labels, pred, test.sentence, n_test_sentences, seed)
