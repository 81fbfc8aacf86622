"""Comparing checkpoints' options, defined once (:class:`CompareConfig`): the ``layerlens compare`` flags,
run.json's options and the page's choices come from it. Importable without torch (the CLI's parser is built
from it)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from analysis.core.options import (
    FREE,
    MAX_SEED,
    POOLINGS,
    ModelOptions,
    Options,
    batch_size_field,
    command_flags,
    max_length_field,
    path,
)

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
    folds: int = Field(5, ge=1, json_schema_extra={"browser_max": 20},
                       title="folds", description="folds of the linear probe")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="seed of the folds, of the sentence bootstrap "
                      "and of the rows the CKA interval uses above 1,000")
    debiased: bool = Field(False, title="debiased CKA", description="debiased CKA (Nguyen et al. 2021) instead of "
                           "linear CKA in layer_summary.csv's cka columns only (cka_cross.csv stays linear CKA; it "
                           "matters for few rows)")
    neighbours: int = Field(NEIGHBOURS, ge=1, json_schema_extra={"browser_max": 1000},
                            title="neighbours", description="nearest rows whose overlap is "
                            "measured")
    reconstruction: bool = Field(True, title="reconstruction", description="each model's reconstruction accuracy "
                                 "per layer through its MLM head and the change (a model without a head gets blank "
                                 "columns, run.json says why)")
    pairing: Literal[PAIRINGS] = Field("index", title="layer pairing", description="models of different depth: "  # type: ignore[valid-type]
                                       "pair layers by index (0 .. the shallower model's last) or by relative "
                                       "depth (layer / L: every layer of the shallower model with the deeper one's "
                                       "nearest); run.json lists the pairs and the layers left out (cka_cross.csv "
                                       "has every pair)")


class CompareInputs(ModelOptions):
    """What ``layerlens compare`` compares: two or more models (``model``, the first is the reference A), a
    fine-tuning job's epochs (``job``) or a sweep group's jobs (``group``); the rows; where the models run."""

    model: list[str] | None = Field(None, json_schema_extra=path("model"),
                                    title="models", description="a checkpoint (hub id, directory, demo, "
                                    "random:NAME, job:N: job N's fine-tuned model read by the MLM head it started "
                                    "from); give it twice or more: the first is the reference A, each other one is "
                                    "compared with it")
    job: int | None = Field(None, ge=0, json_schema_extra=FREE,
                            title="job", description="instead of --model: the epochs of fine-tuning job "
                            "N against the model it started from, from the vectors each epoch saved (epochs/<e>/, "
                            "not recomputed), on the job's validation rows (no --data)")
    group: str | None = Field(None, title="sweep group", description="instead of --model: every finished job of "
                              "sweep group G against the model they started from (--data, or the held-out rows of "
                              "the group's first job)")
    head_from: str | None = Field(None, json_schema_extra=path("model"),
                                  title="MLM head from", description="lend this masked LM's MLM head to every "
                                  "compared model that has none of its own (a fine-tuned classifier: the model it "
                                  "was fine-tuned from), for the reconstruction columns; a model with its own head "
                                  "keeps it")
    data: Path | None = Field(None, json_schema_extra=path("data"),
                              title="rows", description="rows: .txt, .csv, .tsv or .jsonl (labels optional)")
    text_column: str = Field("text", min_length=1, title="text column", description="column holding the texts")
    pair_column: str | None = Field(None, title="second text column", description="column holding the second text "
                                    "of a pair")
    label_column: str = Field("label", min_length=1, title="label column", description="column holding the class "
                              "labels, if any (without it the probe columns are left out)")
    bootstrap: int | None = Field(None, ge=1, json_schema_extra=FREE,
                                  title="bootstrap", description="ignored: the CKA interval is a "
                                  "delete-one jackknife over the rows now (kept so that older command lines run)")
