"""The probe technique's options, each defined once: :class:`ProbeConfig` (the reconstruction probe; the
``layerlens probe`` flags and a run.json's ``options`` come from it) and :class:`LensOptions` (the tuned lens; the
``lens train`` flags, a ``lens`` job's JSON and the page's form come from it)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from analysis.core.options import (
    FREE,
    HALF_HELP,
    HALVES,
    MAX_SEED,
    PRECISIONS,
    ModelOptions,
    Options,
    batch_size_field,
    max_length_field,
    path,
    text_column,
)

MODES = ("unmasked", "masked")
PROBE_FLAGS = ("mode", "include_special", "top_k", "max_length", "seed", "precision", "half")  # `layerlens probe`'s


class ProbeConfig(Options):
    """The reconstruction probe's options (Kao et al. 2020, §3: each layer read through the model's own MLM head).
    Frozen: a page's remembered result is keyed by it. ``batch_size`` and ``logits_budget_bytes`` change the
    memory a run takes, never its numbers."""

    model_config = ConfigDict(frozen=True)

    mode: Literal[MODES] = Field("unmasked", title="mode", description="unmasked: the input as is (Kao et "  # type: ignore[valid-type]
                                 "al.); masked: every token masked once, 15% at a time")
    include_special: bool = Field(False, title="include special tokens", description="also count [CLS], [SEP] and "
                                  "other specials")
    top_k: int = Field(5, ge=1, json_schema_extra={"browser_max": 100},
                       title="top-k", description="predictions kept per token")
    batch_size: int = batch_size_field()
    max_length: int | None = max_length_field()
    mask_fraction: float = Field(0.15, gt=0, le=1, title="mask fraction", description="the masked mode's share of "
                                 "a text's tokens masked at once")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="seed of the masked mode's random groups")
    logits_budget_bytes: int = Field(32 * 2**20, ge=1, json_schema_extra={"browser_max": 2**32},
                                     title="logits budget", description="bytes of vocabulary "
                                     "logits held at once")
    precision: Literal[PRECISIONS] = Field("float32", title="precision", description="the MLM head's "  # type: ignore[valid-type]
                                           "vocabulary product: float32 (default), or certified: bf16 on a "
                                           "machine with bf16 units, each row certified equal to float32 or "
                                           "recomputed (identical tables; run.json says what ran). --dtype "
                                           "bfloat16 is the approximate mode, checked against float32 on a sample")
    half: Literal[HALVES] = Field("output", title="half", description=HALF_HELP + "; with 'attention', "  # type: ignore[valid-type]
                                  "layers.csv, decoded.csv and tokens.parquet gain a half column "
                                  "(attention/output) and each layer has two rows, its attention half first "
                                  "(with --lens: a lens trained with --half attention)")

    def to_dict(self) -> dict:  # "half" only when it is not the default: a run.json reads as before
        out = self.model_dump()
        if self.half == "output":
            out.pop("half")
        return out


class LensOptions(ModelOptions):
    """Training a tuned lens (:mod:`analysis.probe.lens`): the model, the texts, the optimiser (the reference's)."""

    corpus: str | None = Field(None, json_schema_extra=path("data"),
                               title="texts", description="a .txt file (a text a line), .csv/.tsv/.jsonl "
                               "(text_column), 'demo' (the bundled demo set's texts) or hf:NAME[/CONFIG]:SPLIT")
    text_column: str = text_column()
    steps: int = Field(250, ge=1, le=10_000_000, json_schema_extra={"browser_max": 100_000}, title="steps")
    max_tokens: int | None = Field(None, ge=1, json_schema_extra={"browser_max": 10**9},
                                   title="token budget", description="stop after about this many "
                                   "training tokens, if fewer steps than 'steps'")
    batch_size: int = Field(32, ge=1, le=65536, title="texts per step")  # what `lens train` always used
    max_length: int = Field(128, ge=8, le=65536, title="max tokens", description="texts are cut to this many "
                            "tokens (or the model's limit)")
    optimizer: Literal["sgd", "adam"] = Field("sgd", title="optimiser", description="sgd: Nesterov momentum, as "
                                              "the tuned-lens reference; adam: amsgrad with warm-up")
    lr_scale: float = Field(1.0, gt=0, le=100, title="learning-rate scale", description="sgd: lr = scale x "
                            "(1 - momentum); adam: lr = scale x 1e-3")
    momentum: float = Field(0.9, ge=0, lt=1, title="momentum", description="sgd momentum or Adam's beta1")
    weight_decay: float = Field(1e-3, ge=0, le=1, title="weight decay")
    max_grad_norm: float = Field(1.0, ge=0, json_schema_extra=FREE, title="gradient clipping", description="0: none")
    mask_fraction: float = Field(0.15, gt=0, le=1, title="mask fraction", description="tokens masked as in "
                                 "pre-training (80% mask, 10% random, 10% kept)")
    positions: Literal["masked", "all"] = Field("masked", title="trained at", description="masked: KL at the "
                                                "masked positions; all: at every counted position")
    eval_texts: int = Field(128, ge=1, json_schema_extra={"browser_max": 100_000},
                            title="held-out texts", description="texts kept out of training to "
                            "measure the lens")
    save_every: int = Field(50, ge=1, json_schema_extra=FREE,
                            title="save every", description="steps between checkpoints (stop and "
                            "resume)")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed")
    half: Literal[HALVES] = Field("output", title="half", description="output: a translator per layer output; "  # type: ignore[valid-type]
                                  "attention: also one per layer's attention half, trained the same way, for the "
                                  "probe's --half attention")

    def to_dict(self) -> dict:  # "half" only when it is not the default: a lens's options read as before
        out = self.model_dump()
        if self.half == "output":
            out.pop("half")
        return out
