"""The layer atlas' options, defined once (:class:`AtlasConfig`): the ``layerlens atlas`` flags, run.json's options
and the page's choices come from it. Importable without torch (the CLI's parser is built from it)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from analysis.core.options import MAX_SEED, METHODS, POOLINGS, Options, batch_size_field, max_length_field

COLOR_BY = ("label", "prediction", "correct")  # a classifier's own predictions can colour the atlas
ATLAS_FLAGS = ("pooling", "method", "color_by", "layers", "max_length", "folds", "seed")  # `layerlens atlas`'s


class AtlasConfig(Options):
    """Per-layer sentence maps, separability and CKA of a labelled set (:func:`analysis.atlas.atlas.atlas`).
    Frozen: a page's remembered result is keyed by it."""

    model_config = ConfigDict(frozen=True)

    pooling: Literal[POOLINGS] = Field("cls", title="pooling", description="cls: first token; mean: mean of "  # type: ignore[valid-type]
                                       "counted tokens; model: a sentence encoder's own pooling")
    method: Literal[METHODS] = Field("pca", title="method", description="2-D projection")  # type: ignore[valid-type]
    layers: str = Field("-6:", min_length=1, title="layers", description="hidden states to project: all, a slice "
                        "or 0,4,8")
    max_length: int | None = max_length_field()
    batch_size: int = batch_size_field()
    folds: int = Field(5, ge=2, json_schema_extra={"browser_max": 20},
                       title="folds", description="folds of the linear probe")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="seed of the folds, the projection and any "
                      "sample")
    color_by: Literal[COLOR_BY] = Field("label", title="colour by", description="a classifier checkpoint can "  # type: ignore[valid-type]
                                        "also colour its points by its own prediction or by whether it is correct "
                                        "(coords.csv gains prediction, probability, correct)")
