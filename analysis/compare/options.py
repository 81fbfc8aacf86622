"""Comparing checkpoints' options, defined once (:class:`CompareConfig`): the ``layerlens compare`` flags,
run.json's options and the page's choices come from it. Importable without torch (the CLI's parser is built
from it)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from analysis.core.options import MAX_SEED, POOLINGS, Options, batch_size_field, command_flags, max_length_field

NEIGHBOURS = 10
PAIRINGS = ("index", "relative")  # how layers pair when depths differ: analysis.compare.checks.layer_pairs
COMPARE_FLAGS = command_flags(("pooling", "max_length", "batch_size", "folds", "seed", "debiased", "reconstruction"),
                              pairing="--pair-layers")  # `layerlens compare`'s: field -> flag


class CompareConfig(Options):
    """Checkpoints layer by layer on the same rows (:func:`analysis.compare.run.compare`). Frozen: a page's
    remembered result is keyed by it."""

    model_config = ConfigDict(frozen=True)

    pooling: Literal[POOLINGS] = Field("cls", title="pooling", description="sentence vector")  # type: ignore[valid-type]
    max_length: int | None = max_length_field(lowest=1)
    batch_size: int = batch_size_field()
    folds: int = Field(5, ge=1, title="folds", description="folds of the linear probe")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="seed of the folds, of the sentence bootstrap "
                      "and of the rows the CKA interval uses above 1,000")
    debiased: bool = Field(False, title="debiased CKA", description="debiased CKA (Nguyen et al. 2021) instead of "
                           "linear CKA in layer_summary.csv's cka columns only (cka_cross.csv stays linear CKA; it "
                           "matters for few rows)")
    neighbours: int = Field(NEIGHBOURS, ge=1, title="neighbours", description="nearest rows whose overlap is "
                            "measured")
    reconstruction: bool = Field(True, title="reconstruction", description="each model's reconstruction accuracy "
                                 "per layer through its MLM head and the change (a model without a head gets blank "
                                 "columns, run.json says why)")
    pairing: Literal[PAIRINGS] = Field("index", title="layer pairing", description="models of different depth: "  # type: ignore[valid-type]
                                       "pair layers by index (0 .. the shallower model's last) or by relative "
                                       "depth (layer / L: every layer of the shallower model with the deeper one's "
                                       "nearest); run.json lists the pairs and the layers left out (cka_cross.csv "
                                       "has every pair)")
