"""Layer duplication (Kao et al. 2020, §3): a deeper model made of the pre-trained layers, without training.

A **plan** lists the source layer (0-based encoder layer) of each layer of the new model, in order. The paper's
preset makes an L-layer model L + k deep by inserting a copy of each of the first k layers right after its
original (12 -> 15: ``0,0,1,1,2,2,3,...,11``). ALBERT shares one layer across depth, so its plan is a depth N.

- :func:`preview` builds a *view*: new module objects down to the encoder whose layer list holds the same
  layer modules in plan order, with a copied config. No weight is copied and the (shared, cached) model is not
  touched: its objects, config and parameters stay as they were.
- :func:`export` materialises independent copies in a fresh model of the new depth and ``save_pretrained``s it;
  plain transformers loads it (as the class the checkpoint was saved as, :func:`loads_with`) and computes what
  the preview computed.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re

import torch

from analysis.core.inputs import InputError
from models.anatomy import DUPLICATION_KEY, anatomy_of, layer_name
from models.loading import LoadedModel

LAYER_LISTS = {"bert": "encoder.layer", "roberta": "encoder.layer", "electra": "encoder.layer",
               "distilbert": "transformer.layer"}


def duplicate_first(num_layers: int, k: int) -> list[int]:
    """The paper's plan: the first ``k`` layers each followed by a copy of itself, then the rest."""
    if not 0 <= k <= num_layers:
        raise InputError(f"can duplicate 0..{num_layers} of the first layers, not {k}")
    return [i for i in range(num_layers) for _ in range(2 if i < k else 1)]


def duplicate_last(num_layers: int, k: int) -> list[int]:
    if not 0 <= k <= num_layers:
        raise InputError(f"can duplicate 0..{num_layers} of the last layers, not {k}")
    return [i for i in range(num_layers) for _ in range(2 if i >= num_layers - k else 1)]


def max_depth(num_layers: int) -> int:
    """The deepest plan allowed for a model of ``num_layers`` layers: ``LAYERLENS_MAX_DEPTH_FACTOR`` (default 4)
    times its depth, so a typing slip cannot build (and write) a model of thousands of layers."""
    return int(os.environ.get("LAYERLENS_MAX_DEPTH_FACTOR", 4)) * num_layers


def check_depth(depth: int, num_layers: int) -> int:
    """``depth``, or an :class:`InputError` when it is above :func:`max_depth` (checked before any loading)."""
    if depth > max_depth(num_layers):
        raise InputError(f"a plan of {depth:,} layers is deeper than {max_depth(num_layers)} ("
                         f"{max_depth(num_layers) // max(num_layers, 1)}x the model's {num_layers} layers): "
                         "shorten it, or raise LAYERLENS_MAX_DEPTH_FACTOR")
    return depth


def parse_plan(text: str, num_layers: int) -> list[int]:
    """A custom plan from ``"0,0,1,2"`` (0-based source layers; repeats, drops and reorders allowed), at most
    :func:`max_depth` layers."""
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    if not parts:
        raise InputError("the plan is empty: list the source layer of each new layer, e.g. 0,0,1,2,3")
    check_depth(len(parts), num_layers)
    try:
        plan = [int(p) for p in parts]
    except ValueError:
        raise InputError(f"cannot read the plan '{text}': use whole numbers separated by commas") from None
    bad = sorted({i for i in plan if not 0 <= i < num_layers})
    if bad:
        raise InputError(f"layer(s) {', '.join(map(str, bad))} do not exist: the source model has layers "
                         f"0..{num_layers - 1} (0-based)")
    return plan


def check_plan(plan: list[int], loaded: LoadedModel) -> list[int]:
    if not plan:
        raise InputError("the plan is empty")
    if loaded.anatomy.family == "albert":
        check_depth(len(plan), loaded.num_layers)
        return plan  # a depth: every entry is the shared layer
    return parse_plan(",".join(map(str, plan)), loaded.num_layers)


def _family(loaded: LoadedModel) -> str:
    return "roberta" if loaded.anatomy.family in ("roberta", "xlm-roberta") else loaded.anatomy.family


def _view_path(model: torch.nn.Module, dotted: str) -> torch.nn.Module:
    """A shallow copy of ``model`` in which the modules along ``dotted`` (e.g. ``bert.encoder``) are shallow
    copies too, so replacing a child of the last one changes nothing in ``model``. Returns the copy."""
    root = copy.copy(model)
    root._modules = dict(model._modules)
    node = root
    for name in dotted.split(".") if dotted else []:
        child = copy.copy(node._modules[name])
        child._modules = dict(child._modules)
        node._modules[name] = child
        node = child
    return root


@torch.inference_mode()
def _hooks_installed(loaded: LoadedModel) -> None:
    """transformers 5 records hidden states with forward hooks that a model installs on its layer modules on
    its first forward, and marks the model object as hooked. A view made before that would install a second
    set on the shared layers (doubling every recorded state, in the cached model too). One tiny forward of the
    original, by the public path, installs them first; the view then inherits the mark."""
    ids = torch.tensor([[loaded.tokenizer.cls_token_id or 0, loaded.tokenizer.sep_token_id or 0]],
                       device=loaded.spec.device)
    loaded.model.base_model(input_ids=ids, output_hidden_states=True)
    loaded.model(input_ids=ids, output_hidden_states=True)


def record_plan(config, plan: list[int], loaded: LoadedModel):
    """``config`` made ``len(plan)`` layers deep, recording which original layer each new one copies (composed
    with the source's own record when the source was itself duplicated), so the layers keep their names."""
    before = loaded.anatomy.plan
    config.num_hidden_layers = len(plan)
    setattr(config, DUPLICATION_KEY, {"source": (getattr(config, DUPLICATION_KEY, None) or {}).get(
        "source", loaded.spec.name), "plan": [before[i] if before else i for i in plan]})
    return config


def preview(loaded: LoadedModel, plan: list[int]) -> LoadedModel:
    """The deeper model as a view over ``loaded``'s modules (see the module docstring). For ALBERT ``plan``
    only gives the depth, ``len(plan)``."""
    plan = check_plan(plan, loaded)
    _hooks_installed(loaded)
    model = loaded.model
    config = record_plan(copy.deepcopy(model.config), plan, loaded)
    base_name = model.base_model_prefix
    family = _family(loaded)
    if family == "albert":
        view = _view_path(model, f"{base_name}.encoder")
        encoder = view._modules[base_name]._modules["encoder"]
    else:
        holder_path, list_name = LAYER_LISTS[family].rsplit(".", 1)
        view = _view_path(model, f"{base_name}.{holder_path}")
        encoder = view._modules[base_name]._modules[holder_path]
        layers = encoder._modules[list_name]
        encoder._modules[list_name] = torch.nn.ModuleList([layers[i] for i in plan])
        if hasattr(encoder, "n_layers"):
            encoder.n_layers = len(plan)
    encoder.config = config
    view._modules[base_name].config = config
    view.config = config
    return dataclasses.replace(loaded, model=view, anatomy=anatomy_of(view), nbytes=0, load_seconds=0.0)


def aligned_positions(plan: list[int], num_layers: int, family: str) -> list[float | None]:
    """Where the original model's hidden states sit on the deeper model's axis: the embeddings at 0, original
    layer s at the deeper layer that last copies it (its output is what the original's layer s fed on); a layer
    the plan drops has no place (None). ALBERT: layer i at i (the shared layer is applied at every depth)."""
    if family == "albert":
        return [float(i) for i in range(num_layers + 1)]
    last = {src: i for i, src in enumerate(plan, start=1)}
    return [0.0] + [float(last[s]) if s in last else None for s in range(num_layers)]


def source_names(plan: list[int], family: str) -> list[str]:
    """Hidden-state labels of the deeper model aligned by source: ``embeddings``, then ``{i} ← {source}``."""
    return [layer_name(i, len(plan), tuple(plan), family) for i in range(len(plan) + 1)]


