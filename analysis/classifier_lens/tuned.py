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


def _layer_logits(readout, states, mask, translators: Translators | None) -> list[torch.Tensor]:
    out = []
    for layer in range(readout.num_layers + 1):
        if translators is not None and layer < readout.num_layers:
            moved = list(states)
            moved[layer] = translators(states[layer], layer)
            states_l = moved
        else:
            states_l = states
        out.append(readout.logits(states_l, mask, layer).float())
    return out


def train(readout, encoded: Encoded, rows: np.ndarray, pad_id: int, device: str, epochs: int = 10, lr: float = 1e-3,
          batch_size: int = 32, seed: int = 0, progress: Callable[[str, int, int], None] = lambda *a: None,
          should_stop: Callable[[], bool] = lambda: False) -> Translators:
    """Translators trained on the rows ``rows`` of ``encoded`` (module docstring): Adam, ``epochs`` passes."""
    torch.manual_seed(seed)
    hidden = readout.encoder.config.hidden_size
    translators = Translators(readout.num_layers, hidden).to(device)
    optimizer = torch.optim.Adam(translators.parameters(), lr=lr)
    subset = Encoded([encoded.input_ids[i] for i in rows],
                     None if encoded.token_type_ids is None else [encoded.token_type_ids[i] for i in rows],
                     encoded.max_length, 0)
    batches = list(bucket_indices(subset, batch_size))
    rng = np.random.default_rng(seed)
    total = epochs * len(batches)
    for epoch in range(epochs):
        for step, b in enumerate(rng.permutation(len(batches))):
            if should_stop():
                return translators
            batch = make_batch(subset, batches[b], pad_id, device)
            with torch.no_grad():
                states = readout.states(batch.model_inputs())
            logits = _layer_logits(readout, states, batch.attention_mask, translators)
            final = logits[-1].log_softmax(-1)
            loss = sum(torch.nn.functional.kl_div(x.log_softmax(-1), final, log_target=True, reduction="batchmean")
                       for x in logits[:-1]) / max(1, len(logits) - 1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            progress("training the tuned classifier lens", epoch * len(batches) + step + 1, total)
    return translators.eval()


@torch.no_grad()
def tuned_probabilities(readout, translators: Translators, encoded: Encoded, rows: np.ndarray, pad_id: int,
                        device: str, batch_size: int = 32) -> np.ndarray:
    """``(len(rows), L + 1, classes)``: the rows' class probabilities read through the translators."""
    subset = Encoded([encoded.input_ids[i] for i in rows],
                     None if encoded.token_type_ids is None else [encoded.token_type_ids[i] for i in rows],
                     encoded.max_length, 0)
    out = None
    for idx in bucket_indices(subset, batch_size):
        batch = make_batch(subset, idx, pad_id, device)
        states = readout.states(batch.model_inputs())
        probs = torch.stack([x.softmax(-1) for x in _layer_logits(readout, states, batch.attention_mask,
                                                                  translators)], dim=1)
        if out is None:
            out = np.empty((len(rows), probs.shape[1], probs.shape[2]))
        out[idx] = probs.cpu().numpy()
    return out


def tuned_table(raw: np.ndarray, tuned: np.ndarray, kl: Callable[[np.ndarray], np.ndarray],
                labels: np.ndarray | None) -> pd.DataFrame:
    """``tuned.csv``: per layer, on the held-out rows, the KL to the final distribution and the agreement with the
    final prediction, raw and tuned (and the accuracy of each, with labels)."""
    rows = []
    kl_raw, kl_tuned = kl(raw), kl(tuned)
    for layer in range(raw.shape[1]):
        row = {"layer": layer, "held_out_kl_raw": float(kl_raw[:, layer].mean()),
               "held_out_kl_tuned": float(kl_tuned[:, layer].mean()),
               "held_out_agreement_raw": float((raw[:, layer].argmax(-1) == raw[:, -1].argmax(-1)).mean()),
               "held_out_agreement_tuned": float((tuned[:, layer].argmax(-1) == tuned[:, -1].argmax(-1)).mean())}
        if labels is not None:
            row["held_out_accuracy_raw"] = float((raw[:, layer].argmax(-1) == labels).mean())
            row["held_out_accuracy_tuned"] = float((tuned[:, layer].argmax(-1) == labels).mean())
        rows.append({**row, "n_held_out": len(raw)})
    return pd.DataFrame(rows)
