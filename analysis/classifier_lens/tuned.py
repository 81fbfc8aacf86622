"""The tuned classifier lens: one affine translator per layer ``l < L``, ``T_l(h) = h + W_l h + b_l`` (``W_l``,
``b_l`` zero at the start: the raw lens), applied to every position of ``h_l`` before the classifier's own head, and
trained to minimise ``KL(p_L || p_l)`` to the model's final distribution, as the tuned lens of Belrose et al. (2023,
eq. 2-4) is trained for the unembedding. The encoder and the head stay frozen.

The rows are split once (seeded) into 80% to train on and 20% held out; the held-out KL and agreement, raw and
tuned, are what :func:`tuned_table` reports. Fewer than :data:`MIN_ROWS` rows are refused: the translators have
``hidden^2`` weights a layer, and a held-out set of a handful of rows says nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from analysis.classifier_lens.lens import checked_states, kl_to_final, layer_probabilities, predictions
from analysis.core.activations import Encoded, bucket_indices, make_batch
from analysis.core.inputs import InputError

MIN_ROWS = 100
HELD_OUT = 0.2


def split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train, held_out)`` row positions: a seeded permutation, :data:`HELD_OUT` of the rows held out."""
    if n < MIN_ROWS:
        raise InputError(f"the tuned classifier lens needs at least {MIN_ROWS} rows ({int(HELD_OUT * 100)}% are held "
                         f"out to measure it); this data has {n}: run the raw lens, or give more rows")
    order = np.random.default_rng(seed).permutation(n)
    cut = int(round(n * (1 - HELD_OUT)))
    return np.sort(order[:cut]), np.sort(order[cut:])


class Translators(torch.nn.Module):
    """``T_l(h) = h + W_l h + b_l`` for ``l = 0 .. L - 1`` (the last layer is read as it is)."""

    def __init__(self, num_layers: int, hidden: int):
        super().__init__()
        self.linear = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(num_layers))
        for layer in self.linear:
            torch.nn.init.zeros_(layer.weight)
            torch.nn.init.zeros_(layer.bias)

    def forward(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        x = h.float()
        return (x + self.linear[layer](x)).to(h.dtype)


class Translated:
    """``readout`` with each layer ``l < L`` moved by its translator before the head: a readout itself, so the raw
    lens's loop (:func:`analysis.classifier_lens.lens.layer_probabilities`) reads the tuned lens too."""

    def __init__(self, readout, translators: Translators):
        self.readout, self.translators = readout, translators
        self.encoder, self.num_layers = readout.encoder, readout.num_layers

    def states(self, inputs: dict):
        return self.readout.states(inputs)

    def logits(self, states, mask, layer: int) -> torch.Tensor:
        if layer < self.num_layers:
            states = list(states)
            states[layer] = self.translators(states[layer], layer)
        return self.readout.logits(states, mask, layer)


def _subset(encoded: Encoded, rows: np.ndarray) -> Encoded:
    """The rows ``rows`` of ``encoded``, in that order."""
    return Encoded([encoded.input_ids[i] for i in rows],
                   None if encoded.token_type_ids is None else [encoded.token_type_ids[i] for i in rows],
                   encoded.max_length, 0)


def train(readout, encoded: Encoded, rows: np.ndarray, pad_id: int, device: str, epochs: int = 10, lr: float = 1e-3,
          batch_size: int = 32, seed: int = 0, progress: Callable[[str, int, int], None] = lambda *a: None,
          should_stop: Callable[[], bool] = lambda: False) -> Translators:
    """Translators trained on the rows ``rows`` of ``encoded`` (module docstring): Adam, ``epochs`` passes."""
    torch.manual_seed(seed)
    hidden = readout.encoder.config.hidden_size
    translators = Translators(readout.num_layers, hidden).to(device)
    optimizer = torch.optim.Adam(translators.parameters(), lr=lr)
    tuned = Translated(readout, translators)
    subset = _subset(encoded, rows)
    batches = list(bucket_indices(subset, batch_size))
    rng = np.random.default_rng(seed)
    total = epochs * len(batches)
    for epoch in range(epochs):
        for step, b in enumerate(rng.permutation(len(batches))):
            if should_stop():
                return translators
            batch = make_batch(subset, batches[b], pad_id, device)
            with torch.no_grad():
                states = checked_states(readout, batch)
            logits = [tuned.logits(states, batch.attention_mask, layer).float()
                      for layer in range(readout.num_layers + 1)]
            final = logits[-1].log_softmax(-1)
            loss = sum(torch.nn.functional.kl_div(x.log_softmax(-1), final, log_target=True, reduction="batchmean")
                       for x in logits[:-1]) / max(1, len(logits) - 1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            progress("training the tuned classifier lens", epoch * len(batches) + step + 1, total)
    return translators.eval()


def tuned_probabilities(readout, translators: Translators, encoded: Encoded, rows: np.ndarray, pad_id: int,
                        device: str, batch_size: int = 32) -> np.ndarray:
    """``(len(rows), L + 1, classes)``: the rows' class probabilities read through the translators."""
    return layer_probabilities(Translated(readout, translators), _subset(encoded, rows), pad_id, device, batch_size)


def tuned_table(raw: np.ndarray, tuned: np.ndarray, labels: np.ndarray | None) -> pd.DataFrame:
    """``tuned.csv``: per layer, on the held-out rows, the KL to the final distribution and the agreement with the
    final prediction, raw and tuned (and the accuracy of each, with labels)."""
    rows = []
    kl_raw, kl_tuned = kl_to_final(raw), kl_to_final(tuned)
    said_raw, said_tuned = predictions(raw), predictions(tuned)
    for layer in range(raw.shape[1]):
        row = {"layer": layer, "held_out_kl_raw": float(kl_raw[:, layer].mean()),
               "held_out_kl_tuned": float(kl_tuned[:, layer].mean()),
               "held_out_agreement_raw": float((said_raw[:, layer] == said_raw[:, -1]).mean()),
               "held_out_agreement_tuned": float((said_tuned[:, layer] == said_tuned[:, -1]).mean())}
        if labels is not None:
            row["held_out_accuracy_raw"] = float((said_raw[:, layer] == labels).mean())
            row["held_out_accuracy_tuned"] = float((said_tuned[:, layer] == labels).mean())
        rows.append({**row, "n_held_out": len(raw)})
    return pd.DataFrame(rows)
