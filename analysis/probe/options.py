"""The tuned lens' options, defined once (:class:`LensOptions`): the ``lens train`` flags, a ``lens`` job's JSON
and the page's form are derived from it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from analysis.core.options import MAX_SEED, ModelOptions, text_column


class LensOptions(ModelOptions):
    """Training a tuned lens (:mod:`analysis.probe.lens`): the model, the texts, the optimiser (the reference's)."""

    corpus: str | None = Field(None, title="texts", description="a .txt file (a text a line), .csv/.tsv/.jsonl "
                               "(text_column), 'demo' (the bundled demo set's texts) or hf:NAME[/CONFIG]:SPLIT")
    text_column: str = text_column()
    steps: int = Field(250, ge=1, le=10_000_000, title="steps")
    max_tokens: int | None = Field(None, ge=1, title="token budget", description="stop after about this many "
                                   "training tokens, if fewer steps than 'steps'")
    batch_size: int = Field(16, ge=1, le=65536, title="texts per step")
    max_length: int = Field(128, ge=8, le=65536, title="max tokens", description="texts are cut to this many "
                            "tokens (or the model's limit)")
    optimizer: Literal["sgd", "adam"] = Field("sgd", title="optimiser", description="sgd: Nesterov momentum, as "
                                              "the tuned-lens reference; adam: amsgrad with warm-up")
    lr_scale: float = Field(1.0, gt=0, le=100, title="learning-rate scale", description="sgd: lr = scale x "
                            "(1 - momentum); adam: lr = scale x 1e-3")
    momentum: float = Field(0.9, ge=0, lt=1, title="momentum", description="sgd momentum or Adam's beta1")
    weight_decay: float = Field(1e-3, ge=0, le=1, title="weight decay")
    max_grad_norm: float = Field(1.0, ge=0, title="gradient clipping", description="0: none")
    mask_fraction: float = Field(0.15, gt=0, le=1, title="mask fraction", description="tokens masked as in "
                                 "pre-training (80% mask, 10% random, 10% kept)")
    positions: Literal["masked", "all"] = Field("masked", title="trained at", description="masked: KL at the "
                                                "masked positions; all: at every counted position")
    eval_texts: int = Field(128, ge=1, title="held-out texts", description="texts kept out of training to "
                            "measure the lens")
    save_every: int = Field(50, ge=1, title="save every", description="steps between checkpoints (stop and "
                            "resume)")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed")
