"""The classifier lens's tables: every example's class probabilities at every layer (:func:`layer_probabilities`)
and what they say per layer and per example (:func:`layer_table`, :func:`example_table`).

Per layer ``l`` (0 = the embeddings, ``L`` = the last layer, the model's own prediction):

- ``accuracy``: the share of examples whose prediction at ``l`` is their label, with its 95% Wilson interval
  (:func:`analysis.core.scores.wilson_interval`), beside ``majority_baseline``: always predicting the most
  frequent label **of these rows** (an optimistic baseline: it knows the evaluated rows' label counts);
- ``agreement``: the share whose prediction at ``l`` is the final prediction (Wilson interval too);
- ``kl_to_final``: the mean over examples of ``KL(p_L || p_l)`` in nats, as the tuned lens measures it
  (Belrose et al. 2023, eq. 3);
- ``top_class_share``: the share of rows predicted as the layer's most predicted class. Near 1, the layer guesses
  one class for every row, and its agreement with the final prediction is that class's share, not knowledge;
- an example's ``decision_layer``: the first layer from which its prediction equals the final one and stays equal
  (``L`` when only the last layer has it). Predictions are the argmax, ties to the first class. A row "decided"
  at a layer that predicts one class for every row (``top_class_share`` near 1) is decided by that guess.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from analysis.core.activations import Encoded, bucket_indices, check_finite, make_batch
from analysis.core.inputs import InputError, class_ids
from analysis.core.scores import wilson_interval


def label_ids(labels, names: list[str]) -> np.ndarray:
    """Each row's class index (:func:`analysis.core.inputs.class_ids`)."""
    return np.asarray(class_ids(labels, names), dtype=np.int64)


@torch.no_grad()
def layer_probabilities(readout, encoded: Encoded, pad_id: int, device: str, batch_size: int = 32,
                        progress: Callable[[str, int, int], None] = lambda *a: None) -> np.ndarray:
    """``(n, L + 1, classes)`` float64: each example's softmax over the classes at each layer, the head's logits
    taken in float32 whatever the model's dtype. The states and the logits pass the core's one finiteness check
    (:func:`analysis.core.activations.check_finite`): NaN never becomes a confident class (softmax of NaN, then
    argmax)."""
    n, layers = len(encoded), readout.num_layers + 1
    classes = getattr(readout, "num_classes", None)
    if classes and n * layers * classes * 8 > MAX_PROBABILITY_BYTES:  # bounded before any batch runs (item 15)
        raise InputError(f"{n:,} rows x {layers} layers x {classes:,} classes of probabilities is "
                         f"{n * layers * classes * 8 / 1e9:,.1f} GB, over the classifier lens's "
                         f"{MAX_PROBABILITY_BYTES / 1e9:.0f} GB: read fewer rows (--max-rows, or a smaller file)")
    out: np.ndarray | None = None
    done = 0
    for idx in bucket_indices(encoded, batch_size):
        batch = make_batch(encoded, idx, pad_id, device)
        states = checked_states(readout, batch)
        logits = [readout.logits(states, batch.attention_mask, layer).float() for layer in range(layers)]
        check_finite(logits, [f"the classifier's logits at layer {layer}" for layer in range(layers)], None)
        probs = torch.stack([x.softmax(-1) for x in logits], dim=1)
        if out is None:
            out = np.empty((n, layers, probs.shape[-1]))
        out[idx] = probs.cpu().numpy()
        done += len(idx)
        progress("reading every layer through the classifier", done, n)
    return out if out is not None else np.empty((0, layers, 0))


MAX_PROBABILITY_BYTES = 2_000_000_000  # every row's probabilities at every layer, held in memory (float64)
MAX_CLASS_COLUMNS = 50  # above: examples.csv keeps the label's and the prediction's probability, not every class's


def checked_states(readout, batch) -> tuple[torch.Tensor, ...]:
    """``readout``'s hidden states of ``batch``, refused in one line where one is not finite at a real token."""
    states = readout.states(batch.model_inputs())
    check_finite(states, [f"hidden state {i}" for i in range(len(states))], batch.attention_mask.bool()[..., None])
    return states


def predictions(probs: np.ndarray) -> np.ndarray:
    """``(n, L + 1)``: the class each layer predicts (ties: the first)."""
    return probs.argmax(-1)


def kl_to_final(probs: np.ndarray) -> np.ndarray:
    """``(n, L + 1)``: ``KL(p_L || p_l)`` in nats (0 where ``p_L`` is 0; infinite where ``p_l`` is 0 but not
    ``p_L``: a float32 softmax underflow, not met in practice)."""
    final = probs[:, -1:, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(final > 0, final * (np.log(final) - np.log(probs)), 0.0)
    return terms.sum(-1)


def decision_layers(probs: np.ndarray) -> np.ndarray:
    """``(n,)``: each example's first layer from which its prediction is the final one at every later layer."""
    predicted = predictions(probs)
    same = predicted == predicted[:, -1:]
    # the last layer that differs, + 1 (0 when none differs)
    differs = ~same
    last_diff = np.where(differs.any(1), same.shape[1] - 1 - np.argmax(differs[:, ::-1], axis=1), -1)
    return last_diff + 1


def _rate(hits: np.ndarray) -> tuple[float, float, float]:
    k, n = int(hits.sum()), int(hits.size)
    low, high = wilson_interval(k, n)
    return (k / n if n else float("nan")), low, high


def layer_table(probs: np.ndarray, labels: np.ndarray | None, names: list[str]) -> pd.DataFrame:
    """``layers.csv``: one row per layer (module docstring). Without labels the accuracy columns are blank."""
    predicted = predictions(probs)
    kl = kl_to_final(probs)
    rows = []
    majority = np.bincount(labels, minlength=len(names)).max() / len(labels) if labels is not None and len(labels) \
        else float("nan")
    for layer in range(probs.shape[1]):
        row = {"layer": layer}
        if labels is not None:
            acc, low, high = _rate(predicted[:, layer] == labels)
            row.update(accuracy=acc, accuracy_low=low, accuracy_high=high, majority_baseline=majority)
        agree, a_low, a_high = _rate(predicted[:, layer] == predicted[:, -1])
        share = np.bincount(predicted[:, layer], minlength=probs.shape[2]).max() / len(probs) if len(probs) \
            else float("nan")
        row.update(agreement=agree, agreement_low=a_low, agreement_high=a_high, kl_to_final=float(kl[:, layer].mean()),
                   top_class_share=share, n=len(probs))
        rows.append(row)
    return pd.DataFrame(rows)


def example_table(probs: np.ndarray, row_ids, texts, labels: np.ndarray | None, names: list[str]) -> pd.DataFrame:
    """``examples.csv``: per example its row (in the data file), text, label, final prediction, decision layer and
    the probability of every class at every layer (columns ``p_l<layer>_<class>``); above
    :data:`MAX_CLASS_COLUMNS` classes, the probability of its label and of its final prediction at every layer
    (``p_l<layer>_label``, ``p_l<layer>_prediction``)."""
    predicted = predictions(probs)
    frame = pd.DataFrame({"row": list(row_ids), "text": list(texts)})
    if labels is not None:
        frame["label"] = [names[i] for i in labels]
    frame["prediction"] = [names[i] for i in predicted[:, -1]]
    frame["decision_layer"] = decision_layers(probs)
    if len(names) > MAX_CLASS_COLUMNS:  # one column per class and layer would be n x (L + 1) x classes cells
        rows = np.arange(len(probs))
        columns = {f"p_l{layer}_{which}": probs[rows, layer, index] for layer in range(probs.shape[1])
                   for which, index in ((("label", labels),) if labels is not None else ()) +
                   (("prediction", predicted[:, -1]),)}
    else:
        columns = {f"p_l{layer}_{name}": probs[:, layer, c] for layer in range(probs.shape[1])
                   for c, name in enumerate(names)}
    return pd.concat([frame, pd.DataFrame(columns)], axis=1)
