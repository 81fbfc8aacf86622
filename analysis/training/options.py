"""The options of a fine-tuning run, defined once: field, type, default, bounds and help.

Everything else is derived from these two schemas: the ``finetune`` command's flags, its ``--config`` files,
job validation at submit (:mod:`jobs.submit`), the jobs page's form and the README's option tables
(:func:`markdown_table`). A value is resolved in one order everywhere (:func:`resolve`):

    schema default  <-  model default (:func:`model_defaults`, by size)  <-  preset (:data:`PRESETS`)  <-  given

so ``--preset sun2019`` on the CLI, ``preset: sun2019`` in a config file or a job, and *sun2019* on the page
all give the same options. This module imports neither torch nor transformers (the CLI's parsers are built from it).
pydantic does the type checks and coercion (``"3"`` is 3, ``"abc"`` is an error
naming the option), because a config file, a job's JSON and a form all arrive as loosely typed values and
argparse only covers one of them; its errors are rewritten into one readable :class:`InputError`.
"""

from __future__ import annotations

import functools
import typing
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from analysis.core.inputs import InputError
from analysis.core.options import (
    FREE,
    MAX_SEED,
    ModelOptions,
    Options,
    PlacementOptions,
    Truncation,
    label_column,
    markdown_table,
    pair_column,
    path,
    text_column,
)
from models.spec import DEMO_NAME

SCHEDULES = ("linear", "epoch-decay")
Schedule = Literal[SCHEDULES]  # type: ignore[valid-type]

# The papers' settings, as partial option sets; options given explicitly win.
PRESETS: dict[str, dict] = {
    # Sun et al. 2019 §5.1/5.3: batch 24, lr 2e-5, warm-up 0.1, dropout 0.1, 4 epochs, layer decay 0.95
    # (§5.3.3), head+tail truncation at 512 (§5.3.1); the [CLS] head of the original BERT classifier.
    "sun2019": {"head": "cls", "batch_size": 24, "lr": 2e-5, "warmup": 0.1, "dropout": 0.1, "epochs": 4,
                "layer_decay": 0.95, "truncation": "head+tail", "max_length": 512, "schedule": "linear"},
    # GRUBERT §2.3: Adam at 1e-5 multiplied by 0.9 after each epoch, batch 64, 15 epochs, dropout 0.5 (inside
    # the GRU head), early stopping on validation loss; tweets cut at 40 sub-tokens.
    "grubert": {"head": "gru-share-3", "batch_size": 64, "lr": 1e-5, "schedule": "epoch-decay", "warmup": 0.0,
                "weight_decay": 0.0, "epochs": 15, "early_stopping": True, "max_length": 40, "layer_decay": 1.0},
}


def preset_summary(name: str) -> str:
    return ", ".join(f"{k} {v}" for k, v in PRESETS[name].items())


# Defaults that depend on the model's size, never its name (so the demo model and a deeper export of it get
# the same): bert-base's 2e-5 from hidden size 512 up; 1e-4 below, where small models (the demo model: hidden
# 256) teach nothing at 2e-5. A preset or an explicit value wins.
SMALL_HIDDEN = 512
SMALL_MODEL_DEFAULTS = {"lr": 1e-4}


def model_defaults(model: str) -> dict:
    """The defaults of :data:`SMALL_MODEL_DEFAULTS` when ``model``'s config says hidden size < 512; nothing when
    it is larger or its config cannot be read (the error then comes where the model is loaded)."""
    return dict(SMALL_MODEL_DEFAULTS) if (_hidden_size(model) or SMALL_HIDDEN) < SMALL_HIDDEN else {}


def _hidden_size(model: str) -> int | None:
    config = model_config(model)
    return None if config is None else config.hidden_size  # DistilBERT's dim too (a config alias)


@functools.lru_cache(maxsize=64)
def model_config(model: str):
    """``model``'s transformers config (read once), or None when it cannot be read."""
    from models.loading import ModelLoadError, ModelSpec, config_and_family

    try:
        config, _ = config_and_family(ModelSpec(model))
    except (ModelLoadError, OSError, ValueError):
        return None
    return config


class FinetuneConfig(Options):
    """The training engine's hyper-parameters (:func:`analysis.training.train.train`)."""

    head: str = Field("cls", title="head", description="cls, pooler, layer-K, first4-|last4-concat|mean|max, "
                      "all-concat, lstm, attention, scalar-mix, gru-share-C, gru-cat-C, gru-share-C-linear")
    epochs: int = Field(3, ge=1, le=100_000, json_schema_extra={"browser_max": 200}, title="epochs")
    batch_size: int = Field(16, ge=1, le=4096, title="batch size", description="examples per optimiser step")
    lr: float = Field(2e-5, gt=0, le=1, title="learning rate", description="base learning rate (2e-5, the "
                      "papers', for models of bert-base's size; 1e-4 for models of hidden size < 512, e.g. the demo)",
                      json_schema_extra={"step": 1e-5, "format": "%.0e"})
    layer_decay: float = Field(1.0, gt=0, le=1, title="layer LR decay ξ", description="layer k trains at "
                               "lr·ξ^(L-k) (Sun et al.: 0.95)", json_schema_extra={"step": 0.05})
    weight_decay: float = Field(0.01, ge=0, le=1, title="weight decay", description="AdamW, not on biases and "
                                "LayerNorm")
    warmup: float = Field(0.1, ge=0, lt=1, title="warm-up", description="proportion of the steps")
    max_grad_norm: float = Field(1.0, ge=0, json_schema_extra=FREE,
                                 title="gradient clipping", description="max gradient norm; 0: none")
    dropout: float = Field(0.1, ge=0, lt=1, title="dropout", description="dropout in the head")
    truncation: Truncation = Field("head", title="truncation", description="long texts: keep the head, the tail, "
                                   "or head+tail (128 + 382 at 512, scaled)")
    max_length: int = Field(128, ge=8, le=8192, title="max tokens", description="tokens per text")
    max_steps: int | None = Field(None, ge=1, json_schema_extra={"browser_max": 1_000_000},
                                  title="max steps", description="stop after this many optimiser steps")
    folds: int = Field(1, ge=1, le=100, title="folds", description="k-fold cross-validation over the training rows")
    val_fraction: float = Field(0.2, gt=0, lt=1, title="validation fraction", description="held out of the "
                                "training rows (stratified) when no validation set is given; with k-fold and early "
                                "stopping, of each fold's training rows")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="k-fold: fold k uses seed + k")
    early_stopping: bool = Field(False, title="early stopping", description="stop when validation loss stops "
                                 "improving (patience epochs) and keep the best epoch")
    patience: int = Field(2, ge=1, json_schema_extra=FREE,
                          title="patience", description="epochs without improvement before stopping")
    save_vectors: bool = Field(True, title="save vectors", description="per-epoch validation [CLS] of every "
                               "layer, for the atlas")
    group_by_length: bool = Field(True, title="group by length", description="batches of similar length (less "
                                  "padding), in random order")
    schedule: Schedule = Field("linear", title="schedule", description="linear warm-up and decay, or epoch-decay: "
                               "lr x 0.9 after each epoch (GRUBERT)")
    further_pretrain_steps: int = Field(0, ge=0, json_schema_extra={"browser_max": 100_000},
                                        title="further pre-training steps", description="masked-LM "
                                        "steps on the training texts first (within-task, Sun et al. 4.2)")
    further_pretrain_save_every: int = Field(0, ge=0, json_schema_extra=FREE,
                                             title="save further pre-training every", description="also "
                                             "save the masked LM every this many steps (and at step 0) under "
                                             "further_pretrained/steps/: a series for `layerlens series`")
    save_epoch_checkpoints: bool = Field(False, title="save each epoch's encoder", description="also save the "
                                         "encoder after every epoch (epochs/<e>/encoder): a series for `layerlens "
                                         "series --checkpoints job:N`")


MAX_SAVED_CHECKPOINTS = 50  # saved encoders and masked LMs a job from the browser may ask for


def saved_checkpoints(config) -> int:
    """The encoders and masked LMs a fine-tuning run with ``config`` saves beside its result, each the size of the
    model: every epoch's encoder of every fold with ``save_epoch_checkpoints``, and with further pre-training its
    result, its step 0 and one every ``further_pretrain_save_every`` steps (and the last)."""
    epochs = config.epochs * config.folds if config.save_epoch_checkpoints else 0
    further = 0
    if config.further_pretrain_steps:
        further = 1 + (2 + config.further_pretrain_steps // config.further_pretrain_save_every
                       if config.further_pretrain_save_every else 0)
    return epochs + further


class FinetuneData(Options):
    """A fine-tuning run's data: the splits, their columns, the preset and the processes (a block of
    :class:`FinetuneOptions`, kept apart so the options keep their order: training, model, data, placement)."""

    browser_kept: ClassVar[dict[str, str]] = {
        name: "the browser's job holds out the validation fraction of its training rows; a separate validation or "
              "test file is the CLI's --val/--test (or a config file)" for name in ("val", "test")}

    train: str | None = Field(None, json_schema_extra=path("data"),
                              title="training data", description="a .csv/.tsv/.jsonl file, 'demo', or "
                              "hf:NAME[/CONFIG]:SPLIT")
    val: str | None = Field(None, json_schema_extra=path("data"),
                            title="validation data", description="same forms; default: hold out "
                            "val_fraction of train")
    test: str | None = Field(None, json_schema_extra=path("data"),
                             title="test data", description="same forms; predictions.csv is for them")
    text_column: str = text_column()
    pair_column: str | None = pair_column()
    label_column: str = label_column()
    preset: Literal[tuple(PRESETS)] | None = Field(None, title="preset",  # type: ignore[valid-type]
                                                   description="the papers' settings as defaults: "
                                                   + "; ".join(f"{k}: {preset_summary(k)}" for k in PRESETS))
    num_processes: int = Field(1, ge=1, le=64, title="processes", description="jobs: processes under accelerate "
                               "launch; the batch size stays the global batch")


class FinetuneOptions(PlacementOptions, FinetuneData, ModelOptions, FinetuneConfig):
    """Everything a fine-tuning run or job carries: the hyper-parameters (:class:`FinetuneConfig`), the model
    (:class:`ModelOptions`), the data (:class:`FinetuneData`) and where a job runs (:class:`PlacementOptions`)."""

    @model_validator(mode="after")
    def _fold_seeds(self):
        """Fold k runs with seed + k (analysis.training.finetune): the last fold's seed must be a seed too."""
        if self.seed + self.folds - 1 > MAX_SEED:
            raise ValueError(f"seed: with {self.folds} folds the folds use seeds {self.seed} to "
                             f"{self.seed + self.folds - 1}, and a seed must be at most {MAX_SEED}")
        return self

    def check_for_browser(self) -> None:
        """A job from the browser saves at most ``LAYERLENS_MAX_SAVED_CHECKPOINTS`` (default 50) models (issue 53
        item 7: 100,000 epochs' encoders would fill any disk); the CLI's user decides for themself."""
        from analysis.core.textfiles import setting

        cap, count = setting("LAYERLENS_MAX_SAVED_CHECKPOINTS", MAX_SAVED_CHECKPOINTS), saved_checkpoints(self)
        if count > cap:
            raise InputError(f"this job would save {count:,} checkpoints (epochs' encoders and further pre-training "
                             f"steps), more than a job from the browser may ({cap:,}): save fewer (fewer epochs, "
                             "or a larger 'save further pre-training every'), or run it with the CLI")

    def training(self) -> FinetuneConfig:
        return FinetuneConfig.from_dict(self.to_dict())


def resolve(*given: dict) -> FinetuneOptions:
    """The options from what was ``given`` (dicts, later ones winning: a config file, then flags): on top of
    the preset named in them, on top of the model's defaults, on top of the schema's. Unknown keys and bad
    values are one :class:`InputError`."""
    explicit: dict = {}
    for values in given:
        explicit.update({k: v for k, v in values.items() if v is not None})
    unknown = sorted(set(explicit) - set(FinetuneOptions.model_fields))
    if unknown:
        raise InputError(f"unknown option(s) {', '.join(unknown)} (use the flag names with underscores)")
    preset = explicit.get("preset")
    if preset is not None and preset not in PRESETS:
        raise InputError(f"unknown preset '{preset}' (choose from {', '.join(PRESETS)})")
    model = explicit.get("model", DEMO_NAME)
    return FinetuneOptions(**{**model_defaults(str(model)), **PRESETS.get(preset, {}), **explicit})


# What a sweep from the browser may vary: the training engine's hyper-parameters (FinetuneConfig), never the
# data, the columns, the model, pickle loading, the preset or where the job runs (the CLI trusts its user).
SWEEPABLE: tuple[str, ...] = tuple(FinetuneConfig.model_fields)
MAX_SWEEP = 256  # points in one sweep; LAYERLENS_MAX_SWEEP raises it


def max_sweep() -> int:
    import os

    given = os.environ.get("LAYERLENS_MAX_SWEEP", "").strip()
    if not given:
        return MAX_SWEEP
    if not given.isdigit() or int(given) < 1:
        raise InputError(f"LAYERLENS_MAX_SWEEP must be a whole number of at least 1, got {given!r}")
    return int(given)


def grid(items: list[str], allowed: typing.Iterable[str] | None = None) -> list[dict]:
    """A sweep: ``["head=cls,attention", "lr=2e-5,5e-5"]`` -> the cross product as option dicts, the first key
    varying slowest. Keys are option names (dashes or a plural ``s`` allowed: ``heads``, ``num-processes``);
    values stay as typed, the schema checks them when each job is resolved. ``allowed``: the keys that may
    vary (the browser's: :data:`SWEEPABLE`); any other is an :class:`InputError`. More points than
    :func:`max_sweep` are refused from the value counts, before any point is built."""
    import itertools
    import math

    axes: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        name = key.strip().replace("-", "_")
        fields = FinetuneOptions.model_fields
        if name not in fields and name.endswith("s") and name[:-1] in fields:
            name = name[:-1]
        if not sep or not name:
            raise InputError(f"grid item '{item}' is not KEY=VALUE[,VALUE...]")
        if name not in FinetuneOptions.model_fields:
            raise InputError(f"grid: unknown option '{key}' (use the option names, e.g. head, lr, layer_decay)")
        if allowed is not None and name not in allowed:
            raise InputError(f"grid: '{name}' cannot be swept from the browser: a sweep varies the training "
                             f"options ({', '.join(allowed)}); the data, model and where it runs are the form's")
        if name in axes:
            raise InputError(f"grid: '{name}' is given twice")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not vals:
            raise InputError(f"grid: '{key}' has no values")
        axes[name] = vals
    count, cap = math.prod(len(v) for v in axes.values()), max_sweep()
    if count > cap:
        raise InputError(f"grid: {' x '.join(str(len(v)) for v in axes.values())} values make {count:,} points, "
                         f"more than the {cap:,} a sweep may have: fewer values, or raise LAYERLENS_MAX_SWEEP "
                         "on the machine that submits")
    return [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]


def sources(options: FinetuneOptions) -> dict[str, str]:
    """Where the values that are not the schema's own defaults could come from: the preset or the model's
    size, when the value is theirs (``{"lr": "default for models of hidden size < 512"}``); given otherwise."""
    out = {}
    preset = PRESETS.get(options.preset or "", {})
    small = model_defaults(options.model)
    for name, value in options.to_dict().items():
        if name in preset and preset[name] == value:
            out[name] = f"preset {options.preset}"
        elif name in small and small[name] == value:
            out[name] = f"default for models of hidden size < {SMALL_HIDDEN}"
        elif value != FinetuneOptions.model_fields[name].default and name != "preset":
            out[name] = "given"
    return out


def defaults_for(model: str, preset: str | None) -> dict:
    """Each option's value before anything is given explicitly (what a form shows first)."""
    return resolve({"model": model, "preset": preset}).to_dict()


# --- derived views: bounds for forms, flags, documentation ---------------------------------------------------


if __name__ == "__main__":  # python -m analysis.training.options: the README's option table
    print(markdown_table(FinetuneOptions))
