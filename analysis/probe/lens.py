"""Tuned lens for masked language models: one trained affine translator per layer next to the raw reconstruction
probe (Belrose et al. 2023, "Eliciting latent predictions from transformers with the tuned lens", adapted from
decoders to encoders).

Reading a layer with the model's own MLM head (Kao et al.; :mod:`analysis.probe.reconstruction`) is the encoder's
logit lens. The tuned lens reads hidden state ``l`` (0..L-1) as ``head(h + A_l h + b_l)``; the last layer is read
by the head directly. ``A_l`` and ``b_l`` start at zero, so an untrained lens *is* the raw probe. The model and
its head (its own pre-trained MLM head, or the ``--head-from`` one) are frozen.

Training (the recipe, resuming, checkpoints): :mod:`analysis.probe.lens_training`.

With ``half="attention"`` (``layerlens lens train --half attention``) it also reads each layer's attention half
(the residual stream after the attention block, :func:`analysis.core.activations.hidden_states`) through a
translator of its own, so the probe's ``--half attention`` curve has a tuned reading at every one of its points.

Artifacts (a directory): ``config.json`` (the model, its weights id, family, layers, hidden size, head, and
``half: attention`` for a lens of both halves),
``translators.safetensors``, ``training.json`` (options, ``autocast``: ``bfloat16`` or ``float32``, loss curve,
held-out KL and top-1 agreement per layer before and after, raw vs tuned; written last, its presence with all steps
done is what makes a lens finished),
and ``checkpoint.safetensors`` to resume: the translators, the optimizer's state and the step, curve, options,
weights and texts they belong to, in one file replaced by one rename, so a run killed at any point resumes from
one step's state, never from a mix of two. A folder with a checkpoint and no finished ``training.json`` is a
*partial* lens (:func:`trained`, :func:`label`). Loading a lens for another model is an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from analysis.core.inputs import InputError
from analysis.core.staging import write_atomic
from models.loading import LoadedModel
from models.spec import DEMO_DIR

FORMAT = 1
CONFIG, WEIGHTS, TRAINING = "config.json", "translators.safetensors", "training.json"
CHECKPOINT = "checkpoint.safetensors"  # the one file a run resumes from (earlier versions: optimizer + state.json)


class TunedLens(nn.Module):
    """Translators for hidden states ``0..num_layers - 1`` (float32); :meth:`forward` maps a layer's states. With
    ``half="attention"`` (issue 36 item 5) a second set, ``attention_translators``, reads each layer ``l``'s
    attention half (index ``l - 1``): every state :func:`analysis.core.activations.hidden_states` returns but the
    last is translated."""

    def __init__(self, num_layers: int, hidden_size: int, half: str = "output"):
        super().__init__()
        self.num_layers, self.hidden_size, self.half = num_layers, hidden_size, half
        self.translators = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))
        if half == "attention":
            self.attention_translators = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))
        for t in self.modules():
            if isinstance(t, nn.Linear):
                nn.init.zeros_(t.weight)
                nn.init.zeros_(t.bias)

    def states(self) -> list[tuple[int, str]]:
        """``(layer, half)`` of every state this lens translates (and is trained on), in the encoder's order."""
        from analysis.core.activations import state_labels

        return state_labels(self.num_layers, self.half)[:-1]

    def forward(self, h: torch.Tensor, layer: int, half: str = "output") -> torch.Tensor:
        """``h + A h + b`` for layer ``layer``'s ``half`` in float32, returned in ``h``'s dtype; the last layer's
        output as it is."""
        if half == "attention":
            if self.half != "attention":
                raise InputError("this tuned lens was trained on the layer outputs only: read the attention halves "
                                 "without it, or train one with `layerlens lens train --half attention`")
            translator = self.attention_translators[layer - 1]
        elif layer == self.num_layers:
            return h
        else:
            translator = self.translators[layer]
        x = h.float()
        return (x + translator(x)).to(h.dtype)

    def translate(self, stacked: torch.Tensor, labels: list[tuple[int, str]] | None = None) -> torch.Tensor:
        """``(states, ..., hidden)``: every state through its translator; ``labels``: each state's ``(layer,
        half)`` (default: the layer outputs ``0..L``)."""
        labels = labels or [(i, "output") for i in range(stacked.shape[0])]
        with torch.no_grad():
            return torch.stack([self(stacked[i], *labels[i]) for i in range(stacked.shape[0])])


def identity(loaded: LoadedModel) -> dict:
    """What a lens is trained for: the model's weights (any dtype) with its head, family and shape."""
    return {"model": loaded.spec.name, "weights_id": loaded.weights_id, "family": loaded.anatomy.family,
            "num_layers": loaded.num_layers, "hidden_size": loaded.anatomy.hidden_size,
            "mlm_head": loaded.mlm_head}


def halves(directory: Path) -> str:
    """Which states the lens in ``directory`` reads: ``output`` (the layer outputs) or ``attention`` (also each
    layer's attention half)."""
    return read_config(directory).get("half", "output")


def save(lens: TunedLens, loaded: LoadedModel, directory: Path, training: dict | None = None) -> Path:
    """The lens's files: translators, config and (last, marking it finished) ``training.json``."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / WEIGHTS, lambda path: save_file({k: v.detach().cpu().contiguous()
                                                         for k, v in lens.state_dict().items()}, path))
    write_config(loaded, directory, lens.half)
    if training is not None:
        write_atomic(directory / TRAINING, lambda path: path.write_text(json.dumps(training, indent=2, default=float)
                                                                   + "\n"))
    return directory


def write_config(loaded: LoadedModel, directory: Path, half: str = "output") -> None:
    """``config.json``; ``half`` (the states the lens reads) only when it also reads the attention halves."""
    config = {"format": FORMAT, **identity(loaded), **({"half": half} if half != "output" else {})}
    write_atomic(directory / CONFIG, lambda path: path.write_text(json.dumps(config, indent=2) + "\n"))


def read_config(directory: Path) -> dict:
    path = Path(directory) / CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        raise InputError(f"{directory} is not a tuned lens (no readable {CONFIG}; `layerlens lens train` "
                         "writes one)") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT or "weights_id" not in config:
        raise InputError(f"{path} is not a tuned lens config this version reads")
    return config


def load(directory: Path, loaded: LoadedModel) -> TunedLens:
    """The lens in ``directory`` (a partial one: its checkpoint's translators); an :class:`InputError` when it was
    trained for other weights."""
    from safetensors.torch import load_file

    config = read_config(directory)
    mine = identity(loaded)
    if config["weights_id"] != mine["weights_id"]:
        raise InputError(f"the lens in {directory} was trained for '{config['model']}' ({config['weights_id']}), "
                         f"not for '{mine['model']}' ({mine['weights_id']}): train one for this model with "
                         "`layerlens lens train`")
    lens = TunedLens(config["num_layers"], config["hidden_size"], config.get("half", "output"))
    checkpoint = Path(directory) / CHECKPOINT
    if finished(directory) or not checkpoint.is_file():
        lens.load_state_dict(load_file(Path(directory) / WEIGHTS))
    else:
        lens.load_state_dict(read_checkpoint(checkpoint)[1]["lens"])
    return lens.to(loaded.spec.device)


def read_checkpoint(path: Path) -> tuple[dict, dict]:
    """``(state, tensors)`` of a checkpoint file, both from one open file (a rename that swaps in a newer checkpoint
    meanwhile is not seen half): ``tensors`` has ``lens`` (the translators' state dict), ``optimizer`` and
    ``per_layer`` (the loss curve, steps x layers)."""
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        state = json.loads(f.metadata()["layerlens"])
        tensors: dict = {"lens": {}, "optimizer": {}}
        for key in f.keys():
            part, _, name = key.partition(".")
            if part in tensors:
                tensors[part][name] = f.get_tensor(key)
            else:
                tensors[key] = f.get_tensor(key)
    return state, tensors


def checkpoint_state(path: Path) -> dict | None:
    """A checkpoint's state (step, total_steps, options, weights_id, texts), or None when it is not one."""
    try:
        from safetensors import safe_open

        with safe_open(path, "pt") as f:
            state = json.loads((f.metadata() or {})["layerlens"])
        return state if isinstance(state, dict) and state.get("format") == FORMAT else None
    except Exception:  # absent, cut short, not safetensors, not ours: not a checkpoint to resume from
        return None


def _measured(directory: Path) -> tuple[int, int] | None:
    """``(steps, total_steps)`` from ``training.json``, which a run writes last, after measuring the lens."""
    try:
        training = json.loads((Path(directory) / TRAINING).read_text())
        return int(training["steps"]), int(training["total_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def trained(directory: Path) -> tuple[int, int | None] | None:
    """``(steps trained, steps planned)`` of the lens in ``directory``, from its ``training.json`` when that says
    all steps ran, else from its checkpoint; planned None for a lens stopped by an earlier version that did not say
    it; None when the folder says nothing (a lens saved by hand, taken as finished)."""
    directory = Path(directory)
    measured = _measured(directory)
    if measured is not None and measured[0] == measured[1]:
        return measured
    state = checkpoint_state(directory / CHECKPOINT)
    if state is not None:
        return state["step"], state["total_steps"]
    if measured is not None:  # stopped by an earlier version, which measured and wrote training.json on a stop
        return measured
    try:
        return int(json.loads((directory / "state.json").read_text())["step"]), None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def finished(directory: Path) -> bool:
    """Whether the lens in ``directory`` ran all its steps and was measured: not the partial lens of a run that was
    stopped, cancelled or killed (which :func:`label` marks, and a run with the same options resumes)."""
    measured = _measured(directory)
    return (measured is not None and measured[0] == measured[1]) or trained(directory) is None


def search_roots() -> list[Path]:
    """Where lenses are looked for: beside the demo model (its bundled lens), ``LAYERLENS_HOME/lenses`` and the
    artifacts of lens jobs (``LAYERLENS_HOME/jobs/<id>/artifacts``)."""
    from analysis.core.home import jobs_dir, lenses_dir

    return [DEMO_DIR, lenses_dir(), jobs_dir()]


def label(directory: Path) -> str:
    """How pages name a lens: ``bundled lens``, ``job #4``, or its folder's name, ``· both halves`` for a lens that
    also reads the attention halves; a partial lens says so: ``job #4 (partial: step 300 of 3,000)``."""
    name = folder_name(directory)
    try:
        name += " · both halves" if halves(directory) == "attention" else ""
    except InputError:
        pass
    if finished(directory):
        return name
    step, total = trained(directory)
    return f"{name} (partial: step {step:,}" + (f" of {total:,})" if total is not None else ")")


def folder_name(directory: Path) -> str:
    directory = Path(directory)
    if directory.name == "artifacts" and directory.parent.name.isdigit():
        return f"job #{directory.parent.name}"
    return "bundled lens" if directory.parent == DEMO_DIR else directory.name


def training_positions(directory: Path) -> str | None:
    """Where the lens in ``directory`` was trained (``masked`` or ``all``), from its ``training.json``."""
    try:
        return json.loads((Path(directory) / TRAINING).read_text())["options"]["positions"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find(loaded: LoadedModel, roots: list[Path] | None = None) -> list[Path]:
    """The lens directories under ``roots`` (default :func:`search_roots`; searched two levels deep) trained for
    ``loaded``'s weights: the finished ones first, then the partial ones (:func:`label` says which)."""
    found = []
    for root in roots if roots is not None else search_roots():
        for config in sorted([*Path(root).glob(f"*/{CONFIG}"), *Path(root).glob(f"*/*/{CONFIG}")]):
            try:
                mine = read_config(config.parent)["weights_id"] == loaded.weights_id
            except InputError:
                continue
            if mine and ((config.parent / WEIGHTS).is_file() or (config.parent / CHECKPOINT).is_file()):
                found.append(config.parent)
    return sorted(found, key=lambda d: not finished(d))  # stable: the search order within each


