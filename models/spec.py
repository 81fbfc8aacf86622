"""What to load, the names that describe it, and where it runs (device and dtype resolution), without importing
torch or transformers at import time: the CLI's parsers, the options schema and the job commands read these, and
``python -m analysis jobs list`` stays fast."""

from __future__ import annotations

import dataclasses
from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent / "demo"
DEMO_NAME = "demo"
SUGGESTED_MODELS = (DEMO_NAME, "bert-base-uncased", "albert-base-v2", "roberta-base", "distilbert-base-uncased")
DEVICES = ("auto", "cpu", "cuda", "mps")
RANDOM_PREFIX = "random:"  # random:NAME is NAME's architecture (its config and tokenizer) with random weights
RANDOM_SEED = 0  # the seed of those weights: the same random model in every session, run and process
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")  # models.loading.DTYPES maps them to torch dtypes


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is written for the person who asked for it."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What to load. ``name`` is a hub id, a local ``save_pretrained`` directory, or ``"demo"``: any checkpoint
    of the supported families (a masked LM, a bare encoder, a task model, a sentence encoder). ``head_from``
    names a masked LM whose pre-trained MLM head reads this model's layers (Kao et al. Fig. 2).

    ``random:NAME`` is the control a reviewer asks for: NAME's architecture, config and tokenizer with weights
    initialised as transformers initialises a new model, seeded with :data:`RANDOM_SEED` (MLM head included)."""

    name: str = DEMO_NAME
    revision: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    allow_pickle: bool = False
    head_from: str | None = None

    def __post_init__(self):
        if not self.name or not self.name.strip():
            raise ModelLoadError("no model named: give a hub id, a local directory or 'demo'")
        object.__setattr__(self, "name", self.name.strip())
        object.__setattr__(self, "head_from", (self.head_from or "").strip() or None)
        if self.random_init and not self.source:
            raise ModelLoadError(f"'{self.name}': name the model whose architecture to use, e.g. random:demo")
        if self.device.split(":")[0] not in DEVICES:
            raise ModelLoadError(f"unknown device '{self.device}'; choose one of {', '.join(DEVICES)}")
        if self.dtype not in DTYPE_NAMES:
            raise ModelLoadError(f"unknown dtype '{self.dtype}'; choose one of {', '.join(DTYPE_NAMES)}")

    @property
    def random_init(self) -> bool:
        """Whether this is ``random:NAME``: NAME's architecture with seeded random weights."""
        return self.name.startswith(RANDOM_PREFIX)

    @property
    def source(self) -> str:
        """The path or hub id handed to ``from_pretrained`` (for ``random:NAME``, NAME's: config and tokenizer)."""
        name = self.name.removeprefix(RANDOM_PREFIX).strip()
        return str(DEMO_DIR) if name == DEMO_NAME else name

    def resolved(self) -> ModelSpec:
        """The same spec with ``auto`` device and dtype made concrete (what the cache keys on)."""
        device = resolve_device(self.device)
        return dataclasses.replace(self, device=device, dtype=resolve_dtype(self.dtype, device))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def resolve_device(device: str = "auto") -> str:
    """``auto`` -> cuda, then mps, then cpu. An explicit device that is not available is an error (torch is
    imported here, not at the top: this module stays importable without it)."""
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    kind = device.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for, but no CUDA GPU is available here")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError("device 'mps' was asked for, but Apple's MPS backend is not available here")
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    """``auto`` -> float32 on every device: the exact mode is the default (issue 26; a float32 encoder is cheap
    next to the MLM head, and bfloat16 weights changed 0.16% of a GPU probe's predictions with nothing saying so).
    bfloat16 and float16 are the approximate mode, asked for by name (:func:`analysis.core.precision.mode`)."""
    return "float32" if dtype == "auto" else dtype


GENERIC_FOLDERS = {"model", "models", "checkpoint", "checkpoints", "encoder", "final", "best", "output", "outputs",
                   "out", "export", "exports", "artifacts", "hf", "weights"}


def short_name(model: str) -> str:
    """How pages, legends and job names show a model: a hub id whole (``org/name``); a local folder by its name,
    with its parent when the name alone says nothing (``sst2-seed3/model``, ``job7/encoder``), never the server's
    absolute path."""
    path = Path(str(model)).expanduser()
    if not path.is_absolute() and not path.exists():
        return str(model)
    if not path.exists():
        return path.name or str(model)
    name = path.resolve().name
    if name.lower() in GENERIC_FOLDERS or len(name) < 3:
        parent = path.resolve().parent.name
        if parent.lower() in GENERIC_FOLDERS:  # jobs/<id>/artifacts/checkpoint/encoder
            parent = f"{path.resolve().parent.parent.name}/{parent}"
        return f"{parent}/{name}"
    return name
