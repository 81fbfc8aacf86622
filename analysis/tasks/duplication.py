"""What duplication changes (Kao et al. 2020, §3 / Fig. 3): every hidden state at the same token positions of the
original and the duplicated model, compared layer by layer with linear CKA; and the sweep over how many of the first
layers are duplicated."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from analysis.core.activations import counted_mask, encode, hidden_states, make_batch, max_input_length
from analysis.core.cka import linear_cka
from analysis.core.inputs import TextInputs
from analysis.core.vectors import run_plan
from analysis.duplication.plan import duplicate_first, preview
from models.loading import LoadedModel


@torch.inference_mode()
def token_states(loaded: LoadedModel, inputs: TextInputs, max_tokens: int = 4000, batch_size: int = 32) -> np.ndarray:
    """``(L + 1, n, hidden)``: every state at the first ``max_tokens`` counted (non-special) token positions of
    ``inputs``, in input order."""
    tok = loaded.tokenizer
    encoded = encode(tok, inputs, max_input_length(loaded))
    special = list(tok.all_special_ids)

    def run(idx: list[int]) -> np.ndarray:
        batch = make_batch(encoded, idx, tok.pad_token_id, loaded.spec.device)
        keep = counted_mask(batch, special, include_special=False)
        return torch.stack(hidden_states(loaded, batch))[:, keep].float().cpu().numpy()  # (L + 1, tokens, hidden)

    plan = [list(range(start, min(start + batch_size, len(encoded)))) for start in range(0, len(encoded), batch_size)]
    parts, n = [], 0
    for step in run_plan(plan, run):  # in input order, so the first max_tokens positions are the same every time
        parts.extend(step)
        n += sum(states.shape[1] for states in step)
        if n >= max_tokens:
            break
    return np.concatenate(parts, axis=1)[:, :max_tokens]


def compare(loaded: LoadedModel, plan: list[int], inputs: TextInputs,
            progress: Callable[[str, int, int], None] | None = None) -> dict:
    """The preview's analyses: per-layer probe of the original and the deeper model on ``inputs`` and the
    original x deeper linear CKA of their token states. Returns ``{"original", "deeper", "cka", "names"}``.
    ``progress(stage, done, total)`` follows each probe's texts."""
    from analysis.probe.reconstruction import probe

    def stage(name: str):
        return (lambda done, n: progress(name, done, n)) if progress else None

    deeper = preview(loaded, plan)
    original_result = probe(loaded, inputs, progress=stage("original"))
    deeper_result = probe(deeper, inputs, progress=stage("deeper"))
    cka = linear_cka(token_states(loaded, inputs), token_states(deeper, inputs))
    return {"original": original_result, "deeper": deeper_result, "cka": cka, "names": deeper.anatomy.layer_names()}


def sweep(loaded: LoadedModel, inputs: TextInputs, progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """The paper's sweep: final-layer reconstruction accuracy with the first k layers duplicated, k = 0..L
    (ALBERT: depth L + k). Columns ``duplicated,final_layer_accuracy``."""
    from analysis.probe.reconstruction import probe

    rows = []
    for k in range(loaded.num_layers + 1):
        plan = duplicate_first(loaded.num_layers, k)
        layers = probe(preview(loaded, plan), inputs).layers
        rows.append({"duplicated": k, "final_layer_accuracy": float(layers["accuracy"].iloc[-1])})
        if progress:
            progress(k + 1, loaded.num_layers + 1)
    return pd.DataFrame(rows)
