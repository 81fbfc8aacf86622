"""A head view of one sentence (issue 36 item 4): every attention layer's and head's token-to-token attention, as
bertviz's head and model views show it, and the same sentence read by two models side by side with their
difference (base vs fine-tuned, a model vs its random-weights twin).

The maps come from the eager attention path (:func:`analysis.heads.model.attentions`): ``attention[l, h, i, j]``
is how much token ``i`` attends to token ``j`` in head ``h`` of attention layer ``l + 1`` (each row sums to 1).
One sentence's maps are ``layers x heads x n^2`` floats (bert-base at the 512-token limit: 144 MB in float32).
Two models are compared token for token, so they must tokenise the sentence identically (the same tokenizer):
otherwise one :class:`InputError` names the first token where they part.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from analysis.core.activations import max_input_length
from analysis.core.inputs import InputError
from analysis.heads.model import attentions, check_eager, head_shape
from models.loading import LoadedModel


@dataclasses.dataclass
class HeadView:
    """One sentence through one model: ``tokens`` (the tokenizer's pieces, special tokens included), their
    ``ids``, and ``attention`` ``(layers, heads, n, n)`` float32 (row ``i``: what token ``i`` attends to)."""

    model: str
    text: str
    tokens: list[str]
    ids: list[int]
    attention: np.ndarray

    def __post_init__(self):
        n = len(self.tokens)
        if self.attention.ndim != 4 or self.attention.shape[2:] != (n, n) or len(self.ids) != n:
            raise ValueError(f"attention of shape {self.attention.shape} for {n} tokens")

    @property
    def layers(self) -> int:
        return int(self.attention.shape[0])

    @property
    def heads(self) -> int:
        return int(self.attention.shape[1])

    def head(self, layer: int, head: int) -> np.ndarray:
        """``(n, n)`` map of head ``head`` (0-based) of attention layer ``layer`` (1-based), range-checked."""
        if not 1 <= layer <= self.layers:
            raise InputError(f"layer {layer} is out of range: the model has attention layers 1 to {self.layers}")
        if not 0 <= head < self.heads:
            raise InputError(f"head {head} is out of range: each layer has heads 0 to {self.heads - 1}")
        return self.attention[layer - 1, head]

    def info(self) -> dict:
        return {"model": self.model, "text": self.text, "tokens": self.tokens, "ids": self.ids,
                "layers": self.layers, "heads": self.heads, "shape": list(self.attention.shape),
                "layer_index": "1-based attention layer (block), 0-based head; row = attending token"}


@dataclasses.dataclass
class ViewComparison:
    """The same sentence through two models with the same tokenizer: ``a``, ``b`` and ``difference`` = b - a
    ``(layers, heads, n, n)``."""

    a: HeadView
    b: HeadView

    @property
    def difference(self) -> np.ndarray:
        return self.b.attention - self.a.attention


def tokenise(loaded: LoadedModel, text: str) -> tuple[list[int], list[str]]:
    """``(ids, tokens)`` of ``text`` with the model's special tokens; an empty text or one over the model's limit
    (special tokens included) is an :class:`InputError`: a head view is never cut."""
    if not text or not text.strip():
        raise InputError("no sentence given: type one sentence to view")
    tokenizer = loaded.tokenizer
    ids = tokenizer(text.strip(), add_special_tokens=True, truncation=False)["input_ids"]
    limit = max_input_length(loaded)
    if len(ids) > limit:
        raise InputError(f"the sentence has {len(ids)} tokens (special tokens included), over the model's limit of "
                         f"{limit}: shorten it")
    return list(ids), tokenizer.convert_ids_to_tokens(ids)


def head_view(loaded: LoadedModel, text: str) -> HeadView:
    """Every layer's and head's attention for ``text`` (``loaded`` on the eager path: ``load_eager``)."""
    name = f"'{loaded.spec.name}'"
    check_eager(loaded.model, name)
    ids, tokens = tokenise(loaded, text)
    inputs = {"input_ids": torch.tensor([ids], device=loaded.spec.device),
              "attention_mask": torch.ones((1, len(ids)), dtype=torch.long, device=loaded.spec.device)}
    if "token_type_ids" in loaded.tokenizer.model_input_names:
        inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
    with torch.inference_mode():
        maps = attentions(loaded.model, inputs, name)
    attention = torch.stack([a[0].float().cpu() for a in maps]).numpy()
    if attention.shape[:2] != head_shape(loaded.model):
        raise RuntimeError(f"the model returned attention of shape {attention.shape[:2]} for "
                           f"{head_shape(loaded.model)}")
    return HeadView(loaded.spec.name, text.strip(), tokens, ids, attention)


def same_tokens(a: tuple[str, list[int], list[str]], b: tuple[str, list[int], list[str]]) -> None:
    """An :class:`InputError` naming the first token where two models' tokenisations (``(model, ids, tokens)``)
    of one sentence differ."""
    (name_a, ids_a, tok_a), (name_b, ids_b, tok_b) = a, b
    if ids_a == ids_b:
        return
    shorter = min(len(ids_a), len(ids_b))
    k = next((i for i in range(shorter) if ids_a[i] != ids_b[i]), shorter)
    def token(tokens, ids):  # the id too: two vocabularies may spell one token alike under different ids
        return f"'{tokens[k]}' (id {ids[k]})" if k < len(ids) else "past the end"

    raise InputError(f"the two models tokenise the sentence differently (they need the same tokenizer for a side-by-"
                     f"side view): token {k} is {token(tok_a, ids_a)} for {name_a} and {token(tok_b, ids_b)} for "
                     f"{name_b}")


def compare_views(a: LoadedModel, b: LoadedModel, text: str) -> ViewComparison:
    """``text`` through ``a`` and ``b`` (both eager), checked first to tokenise alike and to have the same layers
    and heads (else one :class:`InputError`)."""
    ids_a, tok_a = tokenise(a, text)
    ids_b, tok_b = tokenise(b, text)
    same_tokens((a.spec.name, ids_a, tok_a), (b.spec.name, ids_b, tok_b))
    shape_a, shape_b = head_shape(a.model), head_shape(b.model)
    if shape_a != shape_b:
        raise InputError(f"{a.spec.name} has {shape_a[0]} layers x {shape_a[1]} heads and {b.spec.name} "
                         f"{shape_b[0]} x {shape_b[1]}: their heads cannot be compared one to one")
    return ViewComparison(head_view(a, text), head_view(b, text))


def head_rows(view: HeadView, layer: int, head: int | None = None) -> list[dict]:
    """One layer's (or one head's) attention in long form for a CSV: ``layer, head, from_position, from_token,
    to_position, to_token, weight``; ``layer``/``head`` range-checked against the model."""
    heads = range(view.heads) if head is None else [head]
    rows = []
    for h in heads:
        weights = view.head(layer, h)
        for i, source in enumerate(view.tokens):
            for j, target in enumerate(view.tokens):
                rows.append({"layer": layer, "head": h, "from_position": i, "from_token": source,
                             "to_position": j, "to_token": target, "weight": float(weights[i, j])})
    return rows


__all__ = ["HeadView", "ViewComparison", "compare_views", "head_rows", "head_view", "same_tokens",
           "tokenise"]
