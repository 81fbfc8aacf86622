"""The attention-heads job options, defined once (:class:`HeadsJobOptions`): a ``heads`` job's JSON is checked
against it (:mod:`analysis.heads.job`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from analysis.core.options import MAX_SEED, ModelOptions, PlacementOptions, pair_column, text_column

READINGS = ("clark", "row")  # head -> dependent: Clark's transposed map, or the head word's own row
SYMMETRIES = ("sum", "max")  # attention trees over W + W^T (Clark's "both") or max(W, W^T)
MIN_COUNT = 20  # words a relation needs in each split (selection, held-out) to be reported


class HeadsJobOptions(PlacementOptions, ModelOptions):
    """A ``heads`` job (:func:`analysis.heads.job.run`): one corpus action of ``layerlens heads`` (stats, parse or
    importance) with the same inputs and the same files; the model and where the job runs."""

    action: Literal["stats", "parse", "importance"] = Field(title="action", description="stats: per-head statistics "
                                                            "and the head map; parse: heads as parsers on a UD "
                                                            "treebank; importance: head importance and pruning")
    input: str | None = Field(None, title="texts or treebank", description="stats: texts (.txt, .csv, .tsv, "
                              ".jsonl) or a CoNLL-U treebank; importance: texts scored by the MLM loss")
    treebank: str | None = Field(None, title="treebank", description="parse: a CoNLL-U treebank (.conllu, "
                                 ".conllu.gz)")
    data: str | None = Field(None, title="labelled set", description="importance: a labelled set scored by the "
                             "model's own sequence-classification head")
    text_column: str = text_column()
    label_column: str = Field("label", min_length=1, title="label column")
    pair_column: str | None = pair_column()
    limit: int | None = Field(None, ge=1, json_schema_extra={"browser_max": 1_000_000}, title="limit",
                              description="read at most this many texts (sentences)")
    relations: str | None = Field(None, title="relations", description="parse: comma-separated relations "
                                  "(default: every one in the treebank)")
    reading: Literal["clark", "row"] = Field("clark", title="head -> dependent", description="parse: clark (the "
                                             "word attending most to the dependent is its head) or row (the head "
                                             "word's own most-attended word)")
    tree: Literal["sum", "max"] = Field("sum", title="attention trees", description="parse: over W + W^T (sum) or "
                                        "max(W, W^T)")
    min_count: int = Field(MIN_COUNT, ge=1, le=1_000_000, title="minimum count", description="parse: words a "
                           "relation needs in each split to be reported")
    batch_size: int = Field(32, ge=1, le=4096, json_schema_extra={"browser_max": 256}, title="batch size",
                            description="sentences per forward pass")
    clusters: bool = Field(True, title="head map", description="stats: also the head map (clusters.csv)")
    cluster_tokens: int = Field(2048, ge=2, le=1_000_000, json_schema_extra={"browser_max": 20_000},
                                title="head-map tokens", description="attending tokens "
                                "sampled for the head map's Jensen-Shannon distances")
    steps: int = Field(10, ge=1, le=1000, json_schema_extra={"browser_max": 50}, title="pruning points",
                       description="points of the pruning curve "
                       "after 0%")
    random_orders: int = Field(3, ge=0, le=100, json_schema_extra={"browser_max": 10}, title="random orders",
                               description="importance: seeded random orders of the heads to compare with")
    mask_prob: float = Field(0.15, gt=0, lt=1, title="mask probability", description="importance on texts: "
                             "share of each text's tokens masked")
    drop: float = Field(0.01, ge=0, le=1, title="allowed drop", description="the accuracy drop a layer's "
                        "prunable share allows")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="the head map's sample and MDS; the MLM "
                      "masking")

    def source(self) -> tuple[str, str]:
        """(the option holding this action's input, its path); a ``ValueError`` when it is missing or another
        action's input is given."""
        wanted = {"stats": ("input",), "parse": ("treebank",), "importance": ("input", "data")}[self.action]
        given = [name for name in ("input", "treebank", "data") if getattr(self, name)]
        if len(given) != 1 or given[0] not in wanted:
            raise ValueError(f"a heads {self.action} job reads {' or '.join(wanted)} (one of them), not "
                             f"{', '.join(given) or 'nothing'}")
        return given[0], str(getattr(self, given[0]))
