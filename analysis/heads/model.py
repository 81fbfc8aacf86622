"""What the attention-heads analysis needs from a model: its attention weights (the eager attention path) and a
gate on every head (Michel et al. 2019, §2.2: ``Att(x) = sum_h xi_h Att_h(x)``).

**Eager attention.** transformers' default attention kernel (SDPA) returns no attention weights, so this analysis
loads its own copy of a model with ``attn_implementation="eager"`` (:func:`load_eager`); the shared cached model
is never switched. A test checks that the eager copy's hidden states equal the default path's.

**Head gates.** A head's output is its slice of the attention output (the context layer, ``(batch, seq, heads *
head_dim)``) *before* the attention output projection; gating multiplies that slice by ``xi_h`` (masking a head:
``xi_h = 0``). The gate is a forward pre-hook on each family's output projection (module names from
transformers' modeling code, ``models/anatomy.py`` for the encoder layers):

- BERT, RoBERTa / XLM-R, ELECTRA: ``layer.attention.output.dense`` (``*SelfOutput.dense``);
- ALBERT: ``albert_layers[k].attention.dense`` of the shared layer group (one module applied at every layer:
  its hook counts the calls of each forward pass to know which layer it serves);
- DistilBERT: ``layer.attention.out_lin``.

The hooks are the core's one intervention mechanism (:func:`analysis.core.interventions.intervene`, which counts a
shared module's calls per forward pass), removed on exit; the model's own code is never copied.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from analysis.core.activations import check_finite
from analysis.core.inputs import InputError
from analysis.core.interventions import intervene
from models.anatomy import FAMILIES
from models.loading import LoadedModel, ModelSpec, load_model


def load_eager(spec: ModelSpec) -> LoadedModel:
    """``spec``'s model on the eager attention path (its own copy, never the shared cache's)."""
    return load_model(spec, attn_implementation="eager")


def head_shape(model: nn.Module) -> tuple[int, int]:
    """``(attention layers, heads per layer)``: ALBERT's ``inner_group_num`` attention blocks per layer count
    as layers of their own, in forward order."""
    config = model.config
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", None)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", None)
    if config.model_type == "albert":
        layers *= getattr(config, "inner_group_num", 1)
    return int(layers), int(heads)


def check_eager(model: nn.Module, name: str = "the model") -> None:
    """An :class:`InputError` when ``model`` does not run the eager attention path (no attention weights)."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != "eager":
        raise InputError(f"{name} runs the '{implementation}' attention path, which gives no attention weights; "
                         "load it for this analysis with attn_implementation='eager' (analysis.heads.load_eager)")


def attentions(model: nn.Module, inputs: dict, name: str = "the model") -> tuple[torch.Tensor, ...]:
    """Every attention layer's weights for one batch: ``(batch, heads, seq, seq)`` each, rows summing to 1 over
    the unpadded keys. ``model`` is a ``*ForMaskedLM`` (or any model whose ``base_model`` is the encoder)."""
    check_eager(model, name)
    out = model.base_model(**inputs, output_attentions=True, return_dict=True)
    found = out.attentions
    if not found or any(a is None for a in found):
        raise InputError(f"{name} returned no attention weights (its attention kernel does not expose them)")
    mask = inputs.get("attention_mask")
    check_finite(found, [f"attention layer {k}" for k in range(1, len(found) + 1)],
                 None if mask is None else mask.bool()[:, None, :, None])
    return found


def output_projections(model: nn.Module) -> list[nn.Module]:
    """The attention output projection applied at each attention layer, in forward order (ALBERT: the shared
    group's modules, repeated)."""
    config = model.config
    family = FAMILIES.get(config.model_type)
    base = model.base_model
    if family in ("bert", "roberta", "electra"):
        return [layer.attention.output.dense for layer in base.encoder.layer]
    if family == "distilbert":
        return [layer.attention.out_lin for layer in base.transformer.layer]
    if family == "albert":
        groups = base.encoder.albert_layer_groups
        per_group = config.num_hidden_layers // config.num_hidden_groups
        return [inner.attention.dense for i in range(config.num_hidden_layers)
                for inner in groups[i // per_group].albert_layers]
    raise InputError(f"head gates are not defined for model type '{config.model_type}'")


@contextlib.contextmanager
def head_gates(model: nn.Module, gates: torch.Tensor) -> Iterator[torch.Tensor]:
    """Multiply every head's slice of the context layer by ``gates[layer, head]`` (``(layers, heads)``, as
    :func:`head_shape`) for the forward passes inside the block; or, with ``(batch, layers, heads)`` gates, each
    example of the batch by its own gates (per-example gradients of the gates in one backward: an example's
    loss depends on its own gates only). ``gates`` may require grad (head importance) or hold zeros (masked
    heads). Hooks are removed on exit."""
    layers, heads = head_shape(model)
    if tuple(gates.shape[-2:]) != (layers, heads) or gates.dim() not in (2, 3):
        raise InputError(f"head gates of shape {tuple(gates.shape)} for a model with {layers} layers x {heads} "
                         "heads")
    def gate(layer, context):
        scale = gates[..., layer, :].to(context.dtype).repeat_interleave(context.shape[-1] // heads, dim=-1)
        if scale.dim() == 2:  # per example: (batch, hidden) -> (batch, 1, hidden)
            scale = scale[:, None, :]
        return context * scale

    with intervene(model, output_projections(model), gate, pre=True):
        yield gates


def check_head(model: nn.Module, layer: int, head: int) -> None:
    """An :class:`InputError` for a (1-based layer, 0-based head) that ``model`` does not have."""
    layers, heads = head_shape(model)
    if not 1 <= layer <= layers:
        raise InputError(f"layer {layer} is out of range: the model has attention layers 1 to {layers}")
    if not 0 <= head < heads:
        raise InputError(f"head {head} is out of range: each layer has heads 0 to {heads - 1}")
