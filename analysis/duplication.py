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
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from analysis.core.activations import counted_mask, encode, hidden_states, make_batch, max_input_length
from analysis.core.cka import linear_cka
from analysis.core.inputs import InputError, TextInputs
from analysis.core.staging import staged
from models.anatomy import DUPLICATION_KEY, anatomy_of, layer_name
from models.loading import (
    DTYPES,
    LoadedModel,
    checkpoint_dtype,
    load_as_saved,
    load_model,
    sentence_transformers_files,
)

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


def export(loaded: LoadedModel, plan: list[int], out: Path, dtype: str | None = None) -> Path:
    """Save the deeper model to ``out`` (``save_pretrained``, with the tokenizer and ``duplication.json``, which
    records the plan, the class and the dtype). ``dtype`` None saves in the source checkpoint's own dtype, not
    the dtype the model is shown in (bfloat16 on a GPU): the layers are then copied from a fresh load of the
    checkpoint in that dtype, so a float32 checkpoint exports its float32 values. The export equals the preview
    bit for bit when the two dtypes agree (always on CPU).

    What the checkpoint had is exported: a masked LM (or a model reading its layers with a borrowed head) as a
    masked LM; a checkpoint without an MLM head of its own (a bare encoder, a sentence encoder, a classifier) as
    the class it was saved as, with everything that class holds (a ``BertModel``'s pooler, a classifier's head)
    and never a placeholder; a sentence-transformers checkpoint's own files (``modules.json``, its module
    folders such as ``1_Pooling``/``2_Normalize``, ``sentence_bert_config.json``,
    ``config_sentence_transformers.json``) are copied, a layer count they state set to the new depth."""
    plan = check_plan(plan, loaded)
    dtype = dtype or checkpoint_dtype(loaded.spec)
    if dtype not in DTYPES or dtype == "auto":
        raise InputError(f"unknown dtype '{dtype}'; choose one of {', '.join(d for d in DTYPES if d != 'auto')}")
    lacks: list[str] = []
    if loaded.mlm_head is None:  # as saved: its own class, pooler and task head included
        source, lacks = load_as_saved(loaded.spec, dtype)
    elif loaded.spec.dtype != dtype:
        source = load_model(dataclasses.replace(loaded.spec, dtype=dtype, device="cpu")).model
    else:
        source = loaded.model
    config = record_plan(copy.deepcopy(source.config), plan, loaded)
    state = {k: v.detach().clone() for k, v in source.state_dict().items()}
    family = _family(loaded)
    if family != "albert":
        base = "" if source.base_model is source else f"{source.base_model_prefix}."
        prefix = f"{base}{LAYER_LISTS[family]}."
        pattern = re.compile(re.escape(prefix) + r"(\d+)\.(.*)")
        layers = {}
        for key, value in state.items():
            if m := pattern.fullmatch(key):
                layers.setdefault(int(m.group(1)), {})[m.group(2)] = value
        state = {k: v for k, v in state.items() if not pattern.fullmatch(k)}
        for new, src in enumerate(plan):
            state.update({f"{prefix}{new}.{name}": value.clone() for name, value in layers[src].items()})
    with torch.device("cpu"):
        model = type(source)(config).to(DTYPES[dtype])
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if k.endswith(("decoder.weight", "decoder.bias"))}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"export mismatch: missing {sorted(set(missing) - tied)[:4]}, unexpected "
                           f"{sorted(unexpected)[:4]}")
    sentence = sentence_transformers_files(loaded.spec)
    with staged(out) as stage:  # whole or absent (analysis.core.staging): a page or job never sees half a model
        # weights the checkpoint lacked (e.g. a pooler it was saved without) stay absent, not saved as if trained
        model.save_pretrained(stage, state_dict={k: v for k, v in model.state_dict().items() if k not in lacks}
                              if lacks else None)
        loaded.tokenizer.save_pretrained(stage)
        if sentence is not None:
            copy_sentence_files(*sentence, stage, len(plan))
        (stage / "duplication.json").write_text(json.dumps({
            "source": loaded.spec.name, "source_layers": loaded.num_layers, "plan": plan,
            "family": loaded.anatomy.family, "dtype": dtype, "mlm_head": loaded.mlm_head,
            "architecture": type(model).__name__, "sentence_transformers": sentence is not None}, indent=2))
    return out


LAYER_COUNT_KEYS = ("num_hidden_layers", "num_layers", "n_layers")


def copy_sentence_files(root: Path, names: list[str], out: Path, depth: int) -> None:
    """Copy a sentence-transformers checkpoint's files ``names`` (relative to ``root``; folders whole, a module
    folder that has no files, such as ``2_Normalize``, created) to ``out``; in a JSON file, a layer count
    (:data:`LAYER_COUNT_KEYS`, at any depth) becomes ``depth``."""
    def deeper(value):
        if isinstance(value, dict):
            return {k: depth if k in LAYER_COUNT_KEYS and isinstance(v, int) else deeper(v) for k, v in value.items()}
        return [deeper(v) for v in value] if isinstance(value, list) else value

    for name in names:
        source, target = root / name, out / name
        if source.is_dir() or not source.exists():  # a module folder; an empty one is not in a hub snapshot
            target.mkdir(parents=True, exist_ok=True)
        files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
        for file in (f for f in files if f.is_file()):
            dest = target / file.relative_to(source) if source.is_dir() else target
            dest.parent.mkdir(parents=True, exist_ok=True)
            if file.suffix == ".json":
                dest.write_text(json.dumps(deeper(json.loads(file.read_text())), indent=2))
            else:
                shutil.copyfile(file, dest)


def loads_with(out: Path) -> str:
    """How the export in ``out`` loads, for the messages that announce it: its class, and sentence-transformers
    when its files were copied."""
    record = json.loads((out / "duplication.json").read_text())
    how = f"{record['architecture']}: loads with transformers' {record['architecture']}.from_pretrained"
    return how + (" or sentence_transformers.SentenceTransformer" if record.get("sentence_transformers") else "")


EXPORT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
EXPORT_NAME_RULE = ("a plain name that starts with a letter or digit, then letters, digits, dot, dash and underscore "
                    "(at most 100 characters, no '..', no folders)")


def check_export_name(name: str) -> str:
    """``name`` when it is a plain folder name for an export (:data:`EXPORT_NAME`), else an :class:`InputError`
    stating the rule."""
    if not EXPORT_NAME.fullmatch(name or "") or ".." in name:
        raise InputError(f"'{name}' cannot name an export: use {EXPORT_NAME_RULE}")
    return name


def default_export_name(model: str, plan: list[int]) -> str:
    """A name for the export of ``model`` (hub id, local path or demo) with ``plan`` that
    :func:`check_export_name` accepts: ``org_name-15L-<plan digest>``; a local path gives its last folder's
    name. Characters outside the rule become ``_``, leading ones that may not start a name are dropped."""
    digest = hashlib.sha256(",".join(map(str, plan)).encode()).hexdigest()[:8]
    suffix = f"-{len(plan)}L-{digest}"
    path = Path(model).expanduser()
    try:
        looks_local = model.startswith((".", "/", "~")) or path.exists()
        stem = path.resolve().name if looks_local else model.replace("/", "_")
    except OSError:  # not a path this system can name
        stem = model.replace("/", "_")
    stem = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9._-]", "_", stem))
    stem = re.sub(r"^[^A-Za-z0-9]+", "", stem)[:100 - len(suffix)].rstrip(".") or "model"
    return check_export_name(stem + suffix)


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


@torch.inference_mode()
def token_states(loaded: LoadedModel, inputs: TextInputs, max_tokens: int = 4000, batch_size: int = 32) -> np.ndarray:
    """``(L + 1, n, hidden)``: every state at the first ``max_tokens`` counted (non-special) token positions of
    ``inputs``, in input order."""
    tok = loaded.tokenizer
    encoded = encode(tok, inputs, max_input_length(loaded))
    special = list(tok.all_special_ids)
    parts, n = [], 0
    for start in range(0, len(encoded), batch_size):
        batch = make_batch(encoded, list(range(start, min(start + batch_size, len(encoded)))), tok.pad_token_id,
                           loaded.spec.device)
        keep = counted_mask(batch, special, include_special=False)
        states = torch.stack(hidden_states(loaded, batch))[:, keep]  # (L + 1, tokens, hidden)
        parts.append(states.float().cpu().numpy())
        n += states.shape[1]
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
