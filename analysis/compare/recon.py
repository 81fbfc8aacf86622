"""Reconstruction accuracy per layer for two checkpoints on the same tokens, and its change (issue 28, 2.; Kao et al.
2020 Fig. 2: a pre-trained model against its fine-tuned version, every layer read by the pre-trained MLM head).

Each model is read by the reconstruction probe (:func:`analysis.probe.reconstruction.probe`, unmasked, special tokens
not counted): its own MLM head, or one lent by ``ModelSpec.head_from`` (``--head-from``; a ``job:N`` is read by the head
of the model it was fine-tuned from). Same tokenizer and texts, so both models are scored on the same tokens and
the two predictions of a token pair up. Per layer:

- each model's **token accuracy** (correct / counted tokens) with its 95% **Wilson** interval
  (:func:`analysis.core.scores.wilson_interval`; over tokens, which treats a sentence's tokens as independent);
- the **change** B - A with a 95% **paired percentile bootstrap over sentences** (the same resampled sentences for
  both models; a sentence's tokens move together, so this interval does not assume independent tokens);
- the **exact McNemar test** on the tokens one model reconstructs and the other does not
  (:func:`analysis.compare.movers.mcnemar`).
"""

from __future__ import annotations

import numpy as np

from analysis.compare.movers import mcnemar
from analysis.core.scores import bootstrap_counts, wilson_interval

RESAMPLES = 2000  # as the probe's own sentence bootstrap (analysis.probe.reconstruction.BOOTSTRAP_RESAMPLES)
COLUMNS = ["recon_tokens", "recon_accuracy_a", "recon_ci_low_a", "recon_ci_high_a", "recon_accuracy_b",
           "recon_ci_low_b", "recon_ci_high_b", "recon_change", "recon_change_ci_low", "recon_change_ci_high",
           "recon_mcnemar_a_only", "recon_mcnemar_b_only", "recon_mcnemar_p"]


def token_correct(tokens) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From a probe's per-token table (``text_id, layer, position, correct``; text by text, each text's layers,
    each layer's positions): ``(keys, correct, text_ids)`` with ``keys`` ``(tokens, 2)`` the (text, position) of
    every counted token in reading order, ``correct`` ``(layers, tokens)`` bool and ``text_ids`` ``(tokens,)``."""
    frame = tokens[["text_id", "layer", "position", "correct"]].sort_values(["layer", "text_id", "position"],
                                                                             kind="stable")
    layers = int(frame["layer"].max()) + 1 if len(frame) else 0
    first = frame[frame["layer"] == 0]
    keys = first[["text_id", "position"]].to_numpy()
    correct = frame["correct"].to_numpy(bool).reshape(layers, len(keys)) if layers else np.zeros((0, 0), bool)
    return keys, correct, keys[:, 0] if len(keys) else np.zeros(0, np.int64)


def paired_change_interval(counted: np.ndarray, right_a: np.ndarray, right_b: np.ndarray,
                           resamples: int = RESAMPLES, seed: int = 0,
                           chunk_cells: int = 20_000_000) -> tuple[np.ndarray, np.ndarray]:
    """95% percentile-bootstrap interval of the change in micro accuracy ``(sum right_b - sum right_a) / sum counted``
    per column: resample the ``n`` sentences (rows of ``counted`` ``(n,)``, ``right_a``/``right_b`` ``(n, k)``
    correct tokens per sentence and layer) with replacement, the same draws for both models, ``resamples`` times
    (seeded; the draws are those of one ``rng.integers(0, n, (resamples, n))``, made in chunks)."""
    n, k = right_a.shape
    if n < 2:
        return np.full(k, np.nan), np.full(k, np.nan)
    diff = (np.asarray(right_b, np.float64) - np.asarray(right_a, np.float64))
    changes = np.empty((resamples, k))
    for start, counts in bootstrap_counts(n, resamples, seed, chunk_cells):
        total = counts @ np.asarray(counted, np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            changes[start:start + len(counts)] = (counts @ diff) / total[:, None]
    low, high = np.nanpercentile(changes, [2.5, 97.5], axis=0)
    return low, high


def reconstruction_rows(tokens_a, tokens_b, n_texts: int, seed: int = 0, resamples: int = RESAMPLES,
                        pairs: list[tuple[int, int]] | None = None) -> list[dict]:
    """Per pair of layers ``(l_A, l_B)`` of ``pairs`` (default ``(l, l)``, ``l = 0 .. min(L_A, L_B)``): the
    :data:`COLUMNS` of two probes' per-token tables of the same texts (``n_texts`` of them), ``layer`` being A's.
    Raises ``ValueError`` when the two did not count the same tokens (a different length limit)."""
    keys_a, right_a, text_a = token_correct(tokens_a)
    keys_b, right_b, _ = token_correct(tokens_b)
    if keys_a.shape != keys_b.shape or not np.array_equal(keys_a, keys_b):
        raise ValueError("the two models did not read the same tokens (different length limits?): no paired "
                         "reconstruction comparison")
    pairs = pairs if pairs is not None else [(i, i) for i in range(min(len(right_a), len(right_b)))]
    right_a, right_b = right_a[[i for i, _ in pairs]], right_b[[j for _, j in pairs]]  # (pairs, tokens) each
    layers = len(pairs)
    counted = np.bincount(text_a, minlength=n_texts)

    def per_text(right):  # (texts, layers): correct tokens per text
        return np.stack([np.bincount(text_a, weights=right[layer], minlength=n_texts) for layer in range(layers)],
                        axis=1) if layers else np.zeros((n_texts, 0))

    low, high = paired_change_interval(counted, per_text(right_a), per_text(right_b), resamples, seed)
    out = []
    n = len(keys_a)
    for layer in range(layers):
        ra, rb = right_a[layer], right_b[layer]
        ca, cb = int(ra.sum()), int(rb.sum())
        low_a, high_a = wilson_interval(ca, n)
        low_b, high_b = wilson_interval(cb, n)
        test = mcnemar(ra, rb)
        out.append({"layer": pairs[layer][0], "recon_tokens": n,
                    "recon_accuracy_a": ca / n if n else np.nan, "recon_ci_low_a": low_a, "recon_ci_high_a": high_a,
                    "recon_accuracy_b": cb / n if n else np.nan, "recon_ci_low_b": low_b, "recon_ci_high_b": high_b,
                    "recon_change": (cb - ca) / n if n else np.nan, "recon_change_ci_low": float(low[layer]),
                    "recon_change_ci_high": float(high[layer]), "recon_mcnemar_a_only": test["a_only"],
                    "recon_mcnemar_b_only": test["b_only"], "recon_mcnemar_p": test["p_value"]})
    return out
