"""A duplication plan made real (Kao et al. 2020, §3): independent copies of the planned layers in a fresh model of
the new depth, saved with ``save_pretrained`` (with a sentence encoder's own files), under a name checked to be
plain. Plain transformers loads it (:func:`loads_with`) and computes what :func:`analysis.duplication.plan.preview`
computed."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path

import torch

from analysis.core.inputs import InputError
from analysis.core.staging import staged
from analysis.duplication.plan import LAYER_LISTS, _family, check_plan, record_plan
from models.loading import (
    DTYPES,
    LoadedModel,
    checkpoint_dtype,
    load_as_saved,
    load_model,
    sentence_transformers_files,
)


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
