"""Where each BERT-family masked LM keeps its embeddings, its encoder layers and its MLM head.

Layer indexing follows Hugging Face's ``output_hidden_states``: 0 is the embedding output (after ALBERT's and
ELECTRA's embedding projection), i is the output of encoder layer i, so a model with L layers has L + 1 states.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

# model_type -> family. XLM-R and CamemBERT use RoBERTa's classes.
FAMILIES = {
    "bert": "bert",
    "albert": "albert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "camembert": "roberta",
    "distilbert": "distilbert",
    "electra": "electra",
}

# The head's submodules per family, in the order the model's own forward applies them.
HEAD_PARTS = {
    "bert": ("cls",),
    "albert": ("predictions",),
    "roberta": ("lm_head",),
    "distilbert": ("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector"),
    "electra": ("generator_predictions", "generator_lm_head"),
}


class UnsupportedArchitectureError(ValueError):
    """The checkpoint is not one of the masked-LM families LayerLens knows."""


def family_of(model_type: str) -> str:
    try:
        return FAMILIES[model_type]
    except KeyError:
        known = ", ".join(sorted(FAMILIES))
        raise UnsupportedArchitectureError(
            f"model type '{model_type}' is not supported; LayerLens reads these masked-LM families: {known}"
        ) from None


# A model made deeper by layer duplication records in its config which original layer each of its layers
# copies (0-based); its exports and fine-tuned descendants keep the record, so their layers keep their names.
DUPLICATION_KEY = "layerlens_duplication"


def layer_name(index: int, num_layers: int, plan: tuple[int, ...] | None = None, family: str = "") -> str:
    """Human name of hidden-state ``index`` (0 = embeddings, ``num_layers`` = last layer). With a duplication
    ``plan``: ``5 ← 3`` (new layer 5 is a copy of original layer 3; ``5 ← shared`` for ALBERT)."""
    if index == 0:
        return "embeddings"
    if plan is not None:
        return f"{index} ← shared" if family == "albert" else f"{index} ← {plan[index - 1] + 1}"
    if index == num_layers:
        return f"layer {index} (last)"
    return f"layer {index}"


def duplication_plan(config) -> tuple[int, ...] | None:
    """The plan recorded in ``config`` by layer duplication (None for an ordinary model)."""
    record = getattr(config, DUPLICATION_KEY, None) or {}
    plan = record.get("plan") if isinstance(record, dict) else None
    return tuple(plan) if plan is not None and len(plan) == config.num_hidden_layers else None


@dataclasses.dataclass(frozen=True)
class Anatomy:
    """Structural view of a masked LM; holds references into the model, never copies.

    ``layers[i - 1]`` maps hidden state ``i - 1`` to hidden state ``i``. For ALBERT the same shared module
    appears once per application. ``head`` maps hidden states ``(..., hidden)`` to logits ``(..., vocab)``.
    """

    family: str
    embeddings: nn.Module
    layers: tuple[nn.Module, ...]
    head: Callable[[torch.Tensor], torch.Tensor]
    hidden_size: int
    vocab_size: int
    plan: tuple[int, ...] | None = None  # which original layer each layer copies, for a duplicated model
    # head = decoder(head_transform(h)): the transform (dense, activation, LayerNorm) and the vocabulary
    # product (an nn.Linear), so the product can be computed on its own (analysis.core.precision)
    head_transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    decoder: nn.Linear | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_names(self) -> list[str]:
        return [layer_name(i, self.num_layers, self.plan, self.family) for i in range(self.num_layers + 1)]

    def rows(self) -> list[dict]:
        """One row per hidden state: the module that produces it and its parameter count.

        A module applied more than once (ALBERT's shared layer) names the first hidden state it produced.
        """
        rows, first_seen = [], {}
        modules = [self.embeddings, *self.layers]
        for i, (name, module) in enumerate(zip(self.layer_names(), modules, strict=True)):
            shared = first_seen.setdefault(id(module), i)
            rows.append({"hidden state": i, "name": name, "module": type(module).__name__,
                         "parameters": _n_params(module), "same module as": None if shared == i else shared})
        return rows

    def head_parameters(self) -> int:
        """Parameters of the MLM head, counting a decoder tied to the word embeddings."""
        return _n_params(self.head) if isinstance(self.head, nn.Module) else 0


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _encoder_layers(family: str, base: nn.Module, config) -> tuple[nn.Module, ...]:
    if family == "distilbert":
        return tuple(base.transformer.layer)
    if family == "albert":
        groups = base.encoder.albert_layer_groups
        per_group = config.num_hidden_layers // config.num_hidden_groups
        return tuple(groups[i // per_group] for i in range(config.num_hidden_layers))
    return tuple(base.encoder.layer)


def head_split(model: nn.Module, family: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], nn.Linear]:
    """The MLM head as ``decoder(transform(h))``, following each family's own forward (transformers 5):
    BERT ``cls.predictions.transform`` then ``.decoder``; ALBERT ``predictions`` dense, activation, LayerNorm,
    decoder; RoBERTa ``lm_head`` dense, GELU, layer_norm, decoder; DistilBERT vocab_transform, activation,
    vocab_layer_norm, vocab_projector; ELECTRA ``generator_predictions`` then ``generator_lm_head``. A test checks
    ``decoder(transform(h)) == head(h)`` for every family."""
    if family == "bert":
        p = model.cls.predictions
        return p.transform, p.decoder
    if family == "albert":
        p = model.predictions
        return (lambda h: p.LayerNorm(p.activation(p.dense(h)))), p.decoder
    if family == "roberta":
        from transformers.models.roberta.modeling_roberta import gelu

        p = model.lm_head
        return (lambda h: p.layer_norm(gelu(p.dense(h)))), p.decoder
    if family == "distilbert":
        m = model
        return (lambda h: m.vocab_layer_norm(m.activation(m.vocab_transform(h)))), m.vocab_projector
    return model.generator_predictions, model.generator_lm_head


def anatomy_of(model: nn.Module) -> Anatomy:
    """The anatomy of a ``*ForMaskedLM`` model from one of :data:`FAMILIES`."""
    config = model.config
    family = family_of(config.model_type)
    missing = [p for p in HEAD_PARTS[family] if not hasattr(model, p)]
    if missing:
        raise UnsupportedArchitectureError(
            f"{type(model).__name__} has no MLM head (missing {', '.join(missing)}); load it as a masked LM"
        )
    parts = [getattr(model, p) for p in HEAD_PARTS[family]]
    head = parts[0] if len(parts) == 1 else nn.Sequential(*parts)
    base = model.base_model
    return Anatomy(
        family=family,
        embeddings=base.embeddings,
        layers=_encoder_layers(family, base, config),
        head=head,
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        plan=duplication_plan(config),
        **dict(zip(("head_transform", "decoder"), head_split(model, family), strict=True)),
    )
