"""THE intervention mechanism: change (or read) what a model's modules pass on, inside a ``with`` block, through
forward hooks that are removed on exit; the model's own code is never copied.

:func:`intervene` calls ``fn(layer, value)`` on each listed module's output (or, ``pre=True``, on its first input) in
forward order and passes on what ``fn`` returns (None: the value unchanged). ``modules`` lists one module per layer
it serves; a module listed at several layers (ALBERT's shared group, a duplicated layer) is hooked once, and each
of its calls in a forward pass is told the layer it serves by counting the calls since the pass began (a pre-hook on
the base model resets the count). The hooks run before any other (``prepend``): transformers records the hidden
states it returns with forward hooks of its own, installed at the first forward pass, and must record the changed
value. Users: the attention halves (:func:`analysis.core.activations.attention_halves`,
reading), the heads' gates (:func:`analysis.heads.model.head_gates`, scaling) and the neurons' ablation
(:mod:`analysis.neurons`, zeroing units)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from analysis.core.inputs import InputError
from models.anatomy import FAMILIES


@contextlib.contextmanager
def intervene(model: torch.nn.Module, modules: list[torch.nn.Module],
              fn: Callable[[int, torch.Tensor], torch.Tensor | None], pre: bool = False) -> Iterator[None]:
    """Within the block, ``fn(layer, value)`` sees (and may replace) each module's output, or its first input with
    ``pre`` (module docstring)."""
    served: dict[int, list[int]] = {}
    for layer, module in enumerate(modules):
        served.setdefault(id(module), []).append(layer)
    calls = dict.fromkeys(served, 0)

    def reset(_module, _args):  # a new forward pass: each shared module starts again at its first layer
        for key in calls:
            calls[key] = 0

    def layer_of(module) -> int:
        mine = served[id(module)]
        layer = mine[calls[id(module)] % len(mine)]
        calls[id(module)] += 1
        return layer

    def before(module, args):
        new = fn(layer_of(module), args[0])
        return None if new is None else (new, *args[1:])

    def after(module, args, output):
        value = output[0] if isinstance(output, tuple) else output
        new = fn(layer_of(module), value)
        if new is None:
            return None
        return (new, *output[1:]) if isinstance(output, tuple) else new

    handles = [model.base_model.register_forward_pre_hook(reset, prepend=True)]
    try:
        for module in {id(m): m for m in modules}.values():  # first: transformers records hidden states by hooks too
            handles.append(module.register_forward_pre_hook(before, prepend=True) if pre else
                           module.register_forward_hook(after, prepend=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


def state_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The module whose output is each hidden state ``0..L`` (as ``hidden_states`` numbers them): the embeddings (or
    their projection to the hidden size: ALBERT, a small ELECTRA), then each layer (module names from transformers'
    modeling code; ALBERT's layer ``i`` is the layer of the group its config maps it to)."""
    config = model.config
    family = FAMILIES.get(config.model_type)
    base = model.base_model
    if family == "distilbert":
        layers = list(base.transformer.layer)
    elif family == "albert":
        groups = base.encoder.albert_layer_groups  # the group's (last) layer: transformers records its output
        per_group = config.num_hidden_layers / config.num_hidden_groups
        layers = [groups[int(i / per_group)].albert_layers[-1] for i in range(config.num_hidden_layers)]
    elif family in ("bert", "roberta", "electra"):
        layers = list(base.encoder.layer)
    else:
        raise InputError(f"the layers of a '{config.model_type}' model are not known")
    embeddings = base.embeddings
    if family == "albert":  # its embeddings are narrower: hidden state 0 is their projection to the hidden size
        embeddings = base.encoder.embedding_hidden_mapping_in
    elif getattr(base, "embeddings_project", None) is not None:  # ELECTRA with embedding_size != hidden_size
        embeddings = base.embeddings_project
    return [embeddings, *layers]
