"""Classifier heads over an encoder's hidden states, by the names the CLI takes (see :func:`build_head`).

Every head is a ``torch.nn.Module`` whose ``forward(states, mask)`` takes ``states``, the ``L + 1`` tensors
``(batch, seq, hidden)`` of Hugging Face ``hidden_states`` (a tuple, or a tensor stacked on a first axis;
0 = embedding output, i = output of layer i), and the attention mask ``(batch, seq)``, and returns
:class:`HeadOutput`. Heads read only the states they use (nothing stacks all of them). Which states each head reads:

| head | states |
|---|---|
| ``cls`` | [CLS] of L (the canonical baseline) |
| ``pooler`` | the model's pooler on L (BERT, ALBERT, RoBERTa; not DistilBERT or ELECTRA) |
| ``layer-K`` | [CLS] of K (0..L; Sun et al. Tab. 3) |
| ``first4-*`` / ``last4-*`` | [CLS] of 1..4 / L-3..L, concatenated, averaged or max-pooled over layers |
| ``all-concat`` | [CLS] of 1..L concatenated |
| ``lstm`` | LSTM over [CLS] of 1..L in order; the last output (Song et al. 2020, LSTM-Pooling) |
| ``attention`` | ``o = W_h^T softmax(q h_CLS^T) h_CLS`` over [CLS] of 1..L (Song et al., Attention-Pooling) |
| ``scalar-mix`` | ``gamma * sum_i softmax(w)_i h_CLS^i`` over 0..L (ELMo; global weights) |
| ``gru-share-C`` / ``gru-cat-C`` / ``gru-share-C-linear`` | token sequences of 1..L in C consecutive groups (GRUBERT) |

Embedding state 0 is used only by ``layer-0`` and ``scalar-mix``.
"""

from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn

POOLINGS = ("concat", "mean", "max")
GRU_GROUPS = (1, 2, 3, 4, 6)


@dataclasses.dataclass
class HeadOutput:
    logits: torch.Tensor  # (batch, labels)
    layer_weights: torch.Tensor | None = None  # (batch, pooled layers), rows sum to 1
    layers: list[int] | None = None  # the hidden-state index of each layer_weights column


def head_names(num_layers: int = 12) -> list[str]:
    """Every head name valid for an encoder with ``num_layers`` layers."""
    names = ["cls", "pooler", *(f"layer-{k}" for k in range(num_layers + 1)),
             *(f"{w}4-{p}" for w in ("first", "last") for p in POOLINGS), "all-concat", "lstm", "attention",
             "scalar-mix"]
    for c in GRU_GROUPS:
        if num_layers % c == 0:
            names += [f"gru-share-{c}", f"gru-cat-{c}", f"gru-share-{c}-linear"]
    return names


def group_features(states: torch.Tensor, layers: list[int]) -> torch.Tensor:
    """``(batch, seq, len(layers) * hidden)``: each token's states of ``layers`` side by side, layer-major
    (features ``j * hidden:(j + 1) * hidden`` are layer ``layers[j]``), concatenated on the feature axis (a
    ``reshape`` of a stacked ``(layers, batch, seq, hidden)`` tensor would interleave layers, tokens and
    examples)."""
    return torch.cat([states[i] for i in layers], dim=-1)


def _cls(states: torch.Tensor, layers: list[int]) -> torch.Tensor:
    """``(batch, len(layers), hidden)``: the first token of each chosen state."""
    return torch.stack([states[i][:, 0] for i in layers], dim=1)


class LinearClassifier(nn.Module):
    """Dropout then a linear layer: the classifier every non-GRU head ends with."""

    def __init__(self, width: int, num_labels: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(width, num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(x))


class LayerPoolHead(nn.Module):
    """[CLS] of the given layers, combined by ``concat``, ``mean`` or ``max`` over layers (not tokens)."""

    def __init__(self, layers: list[int], how: str, hidden: int, num_labels: int, dropout: float):
        super().__init__()
        self.layers, self.how = layers, how
        self.classifier = LinearClassifier(hidden * len(layers) if how == "concat" else hidden, num_labels, dropout)

    def forward(self, states, mask) -> HeadOutput:
        x = _cls(states, self.layers)
        pooled = {"concat": lambda: x.flatten(1), "mean": lambda: x.mean(1), "max": lambda: x.amax(1)}[self.how]()
        return HeadOutput(self.classifier(pooled))


class PoolerHead(nn.Module):
    """The encoder's own pooler (dense + tanh on [CLS] of L), then the classifier."""

    def __init__(self, pooler: nn.Module, hidden: int, num_labels: int, dropout: float):
        super().__init__()
        self.pooler = pooler  # shared with the encoder: its parameters are the encoder's
        self.classifier = LinearClassifier(hidden, num_labels, dropout)

    def forward(self, states, mask) -> HeadOutput:
        return HeadOutput(self.classifier(self.pooler(states[-1])))


class LSTMHead(nn.Module):
    """Song et al. LSTM-Pooling: an LSTM over [CLS] of layers 1..L in order; its last output is ``o``."""

    def __init__(self, num_layers: int, hidden: int, num_labels: int, dropout: float, lstm_hidden: int | None = None):
        super().__init__()
        self.layers = list(range(1, num_layers + 1))
        self.lstm = nn.LSTM(hidden, lstm_hidden or hidden, batch_first=True)
        self.classifier = LinearClassifier(lstm_hidden or hidden, num_labels, dropout)

    def forward(self, states, mask) -> HeadOutput:
        out, _ = self.lstm(_cls(states, self.layers))
        return HeadOutput(self.classifier(out[:, -1]))


class AttentionHead(nn.Module):
    """Song et al. Attention-Pooling over [CLS] of layers 1..L: ``o = W_h^T softmax(q h_CLS^T) h_CLS``.

    ``q`` is a learned ``(1, hidden)`` query, ``h_CLS`` the ``(L, hidden)`` stack of one example's [CLS]
    vectors, ``W_h`` a learned ``(hidden, hidden)`` map. The softmax weights are returned per example."""

    def __init__(self, num_layers: int, hidden: int, num_labels: int, dropout: float):
        super().__init__()
        self.layers = list(range(1, num_layers + 1))
        self.q = nn.Parameter(torch.empty(1, hidden).normal_(0, 0.02))
        self.w_h = nn.Linear(hidden, hidden, bias=False)
        self.classifier = LinearClassifier(hidden, num_labels, dropout)

    def forward(self, states, mask) -> HeadOutput:
        h = _cls(states, self.layers)  # (batch, L, hidden)
        weights = torch.softmax((h @ self.q.T).squeeze(-1), dim=-1)  # (batch, L)
        o = self.w_h((weights.unsqueeze(1) @ h).squeeze(1))
        return HeadOutput(self.classifier(o), weights, self.layers)


class ScalarMixHead(nn.Module):
    """ELMo scalar mix of [CLS] over states 0..L: ``gamma * sum_i softmax(w)_i h_i`` (weights shared by all
    examples), then the classifier."""

    def __init__(self, num_layers: int, hidden: int, num_labels: int, dropout: float):
        super().__init__()
        self.layers = list(range(num_layers + 1))
        self.w = nn.Parameter(torch.zeros(num_layers + 1))
        self.gamma = nn.Parameter(torch.ones(()))
        self.classifier = LinearClassifier(hidden, num_labels, dropout)

    def forward(self, states, mask) -> HeadOutput:
        weights = torch.softmax(self.w, dim=0)
        mixed = self.gamma * torch.einsum("l,bld->bd", weights, _cls(states, self.layers))
        return HeadOutput(self.classifier(mixed), weights.expand(states[0].shape[0], -1), self.layers)


class GRUHead(nn.Module):
    """GRUBERT (the paper's §2.2): layers 1..L in ``groups`` consecutive groups; each group's token sequences
    concatenated on the feature axis (``(batch, seq, size * hidden)``) go through an embedding bi-GRU(100)
    (one shared by all groups for ``share``, one per group for ``cat``; a linear layer to 200 for ``linear``);
    the group outputs, concatenated per token, go through a downstream bi-GRU(100) whose final forward and
    backward states (200) feed ReLU, Linear(200->100), ReLU, dropout 0.5, Linear(100->labels).
    Padding is skipped by packing sequences to their lengths."""

    def __init__(self, num_layers: int, hidden: int, num_labels: int, groups: int, share: bool,
                 linear: bool = False, units: int = 100, dropout: float = 0.5):
        super().__init__()
        if num_layers % groups:
            raise ValueError(f"{groups} groups do not divide {num_layers} layers")
        size = num_layers // groups
        self.groups = [list(range(1 + g * size, 1 + (g + 1) * size)) for g in range(groups)]
        width = size * hidden

        def embedder() -> nn.Module:
            if linear:
                return nn.Linear(width, 2 * units)
            return nn.GRU(width, units, batch_first=True, bidirectional=True)

        self.embedders = nn.ModuleList([embedder()] if share else [embedder() for _ in range(groups)])
        self.linear = linear
        self.downstream = nn.GRU(2 * units * groups, units, batch_first=True, bidirectional=True)
        self.classifier = nn.Sequential(nn.ReLU(), nn.Linear(2 * units, units), nn.ReLU(), nn.Dropout(dropout),
                                        nn.Linear(units, num_labels))
        for module in self.classifier:
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)  # Glorot, as the paper
                nn.init.zeros_(module.bias)

    def _run_gru(self, gru: nn.GRU, x: torch.Tensor, lengths: torch.Tensor):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, h_n = gru(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0], h_n

    def forward(self, states, mask) -> HeadOutput:
        lengths = mask.sum(1)
        outputs = []
        for g, layers in enumerate(self.groups):
            x = group_features(states, layers)
            embed = self.embedders[0 if len(self.embedders) == 1 else g]
            outputs.append(embed(x) if self.linear else self._run_gru(embed, x, lengths)[0])
        _, h_n = self._run_gru(self.downstream, torch.cat(outputs, dim=-1), lengths)
        return HeadOutput(self.classifier(torch.cat([h_n[0], h_n[1]], dim=-1)))


def build_head(name: str, num_layers: int, hidden: int, num_labels: int, dropout: float = 0.1,
               pooler: nn.Module | None = None) -> nn.Module:
    """The head called ``name`` (see :func:`head_names`) for an encoder of ``num_layers`` x ``hidden``."""
    last = num_layers
    if name == "cls":
        return LayerPoolHead([last], "concat", hidden, num_labels, dropout)
    if name == "pooler":
        if pooler is None:
            raise ValueError("this model has no pooler (DistilBERT and ELECTRA do not); use the cls head")
        return PoolerHead(pooler, hidden, num_labels, dropout)
    if m := re.fullmatch(r"layer-(\d+)", name):
        k = int(m.group(1))
        if k > num_layers:
            raise ValueError(f"layer {k} does not exist: this model has hidden states 0..{num_layers}")
        return LayerPoolHead([k], "concat", hidden, num_labels, dropout)
    if m := re.fullmatch(r"(first|last)4-(concat|mean|max)", name):
        if num_layers < 4:
            raise ValueError(f"{name} needs at least 4 layers; this model has {num_layers}")
        layers = list(range(1, 5)) if m.group(1) == "first" else list(range(last - 3, last + 1))
        return LayerPoolHead(layers, m.group(2), hidden, num_labels, dropout)
    if name == "all-concat":
        return LayerPoolHead(list(range(1, last + 1)), "concat", hidden, num_labels, dropout)
    if name == "lstm":
        return LSTMHead(num_layers, hidden, num_labels, dropout)
    if name == "attention":
        return AttentionHead(num_layers, hidden, num_labels, dropout)
    if name == "scalar-mix":
        return ScalarMixHead(num_layers, hidden, num_labels, dropout)
    if m := re.fullmatch(r"gru-(share|cat)-(\d+)(-linear)?", name):
        groups = int(m.group(2))
        if groups not in GRU_GROUPS or num_layers % groups:
            raise ValueError(f"{name}: the number of groups must be one of 1, 2, 3, 4, 6 and divide the "
                             f"{num_layers} layers")
        if m.group(3) and m.group(1) != "share":
            raise ValueError("the linear variant exists for gru-share-C only (GRUBERT Tab. 3)")
        return GRUHead(num_layers, hidden, num_labels, groups, share=m.group(1) == "share", linear=bool(m.group(3)))
    raise ValueError(f"unknown head '{name}'; choose one of: {', '.join(head_names(num_layers)[:12])}, ...")


def trainable_parameters(module: nn.Module, exclude: nn.Module | None = None) -> int:
    """Parameters of ``module`` that require gradients, not counting those of ``exclude`` (e.g. a pooler
    shared with the encoder)."""
    skip = {id(p) for p in exclude.parameters()} if exclude is not None else set()
    return sum(p.numel() for p in module.parameters() if p.requires_grad and id(p) not in skip)


def near_uniform(weights, tolerance: float = 0.01) -> bool:
    """Whether every row of layer ``weights`` ``(n, L)`` is within ``tolerance`` (relative) of the uniform
    weight 1/L: a pooling head that learned no preference."""
    import numpy as np

    w = np.asarray(weights, dtype=float)
    return bool(w.size) and bool(np.abs(w * w.shape[1] - 1).max() <= tolerance)
