"""The neurons technique's options, defined once (:class:`NeuronsConfig`). Importable without torch."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from analysis.core.options import MAX_SEED, Options, batch_size_field, max_length_field


class NeuronsConfig(Options):
    """Rank each layer's units by a linear probe's weights, ablate the top k (Dalvi et al. 2019, §3-4)."""

    model_config = ConfigDict(frozen=True)

    pooling: Literal["cls", "mean"] = Field("cls", title="pooling", description="the sentence vector: cls, the "
                                            "first token's state; mean, the mean over counted tokens")
    layers: str = Field("all", min_length=1, title="layers", description="hidden states to rank and ablate: all, a "
                        "slice or 0,4,8")
    k: int = Field(10, ge=1, json_schema_extra={"browser_max": 10_000},
                   title="units ablated", description="the top k units of a layer (and, against them, "
                   "k random units and the bottom k) are zeroed at that layer's output")
    random_seeds: int = Field(3, ge=1, le=20, title="random draws", description="draws of k random units")
    test_fraction: float = Field(0.3, gt=0, lt=1, title="test share", description="rows held out to measure the "
                                 "probes (stratified by class)")
    l1_ratio: float = Field(0.5, ge=0, le=1, title="L1 share", description="the probe's elastic-net mix "
                            "(0: L2 only, 1: L1 only)")
    C: float = Field(1.0, gt=0, le=1e6, title="inverse regularisation", description="the probe's C (scikit-learn)")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="seed of the split, the probe and the random "
                      "units")
    max_length: int | None = max_length_field()
    batch_size: int = batch_size_field()
