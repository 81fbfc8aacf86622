"""The attention-heads options, each field defined once: one schema per action (:class:`HeadsStatsOptions`,
:class:`HeadsParseOptions`, :class:`HeadsImportanceOptions`, :class:`HeadsViewOptions`), from which the tasks
``heads stats|parse|importance|view`` (:mod:`analysis.tasks.heads`) derive their CLI flags and page forms, and the
``heads`` job's (:class:`HeadsJobOptions`: an action, every action's fields, where the job runs)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from analysis.core.options import FREE, MAX_SEED, Options, PlacementOptions, pair_column, path, text_column
from analysis.core.task import ReadingOptions

ACTIONS = ("stats", "parse", "importance", "view")
READINGS = ("clark", "row")  # head -> dependent: Clark's transposed map, or the head word's own row
SYMMETRIES = ("sum", "max")  # attention trees over W + W^T (Clark's "both") or max(W, W^T)
MIN_COUNT = 20  # words a relation needs in each split (selection, held-out) to be reported


class HeadsModel(ReadingOptions):
    """The model block and how many sentences go through it at once."""

    batch_size: int = Field(32, ge=1, le=4096, json_schema_extra={"browser_max": 256}, title="batch size",
                            description="sentences per forward pass")


class Limit(Options):
    browser_kept: ClassVar[dict[str, str]] = {
        "limit": "a job from the browser reads its whole file (the page's own runs take the first sentences)"}
    limit: int | None = Field(None, ge=1, json_schema_extra={"browser_max": 1_000_000}, title="limit",
                              description="read at most this many texts (sentences), from the "
                              "start")


class Corpus(Limit):
    text_column: str = text_column()


class Seed(Options):
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="stats: the head map's sample and MDS; "
                      "importance: the MLM masking")


class HeadsStatsOptions(Seed, Corpus, HeadsModel):
    """``heads stats``: per-head statistics over a corpus (Clark et al. 2019 §3) and the head map (§6)."""

    input: str = Field(json_schema_extra=path("data"),
                       title="texts or treebank", description="texts (.txt one per line, .csv, .tsv, .jsonl) or a "
                       "CoNLL-U treebank (.conllu, .conllu.gz)")
    clusters: bool = Field(True, title="head map", description="also the head map (clusters.csv)")
    cluster_tokens: int = Field(2048, ge=2, le=1_000_000, json_schema_extra={"browser_max": 20_000},
                                title="head-map tokens", description="attending tokens sampled for the head map's "
                                "Jensen-Shannon distances")


class HeadsParseOptions(Limit, HeadsModel):
    """``heads parse``: heads as dependency parsers on a UD treebank (Clark §4.2) and their attention trees' UUAS."""

    treebank: str = Field(json_schema_extra=path("data"),
                          title="treebank", description="a CoNLL-U treebank (.conllu, .conllu.gz)")
    relations: str | None = Field(None, title="relations", description="comma-separated relations to score "
                                  "(default: every one in the treebank)")
    reading: Literal["clark", "row"] = Field("clark", title="head -> dependent", description="clark (the word "
                                             "attending most to the dependent is its head, Clark et al.'s "
                                             "transposed map) or row (the head word's own most-attended word is "
                                             "the dependent)")
    tree: Literal["sum", "max"] = Field("sum", title="attention trees", description="attention trees over W + W^T "
                                        "(sum, Clark's 'both') or max(W, W^T)")
    min_count: int = Field(MIN_COUNT, ge=1, le=1_000_000, title="minimum count", description="words a relation "
                           "needs in each split (selection, held-out) to be reported")

    def wanted(self) -> list[str] | None:
        """The relations asked for (None: every one in the treebank)."""
        return [r.strip() for r in self.relations.split(",") if r.strip()] if self.relations else None


class HeadsImportanceOptions(Seed, Corpus, HeadsModel):
    """``heads importance``: head importance and the pruning curve (Michel et al. 2019)."""

    browser_kept: ClassVar[dict[str, str]] = {
        name: "the page's importance job scores texts by the MLM loss; a labelled set scored by a classifier is the "
              "CLI's --data (or the page's own run)" for name in ("data", "label_column", "pair_column")}

    data: str | None = Field(None, json_schema_extra=path("data"),
                             title="labelled set", description="a labelled set (.csv, .tsv, .jsonl) scored by "
                             "the model's own sequence-classification head (a fine-tuned classifier with labels), "
                             "or with the model job:N by that fine-tuning job's classifier")
    input: str | None = Field(None, json_schema_extra=path("data"),
                              title="texts", description="texts scored by the MLM loss of the model's own MLM "
                              "head")
    label_column: str = Field("label", min_length=1, title="label column")
    pair_column: str | None = pair_column()
    steps: int = Field(10, ge=1, le=1000, json_schema_extra={"browser_max": 50}, title="pruning points",
                       description="points of the pruning curve after 0% (10: every 10% of the heads)")
    random_orders: int = Field(3, ge=0, le=100, json_schema_extra={"browser_max": 10}, title="random orders",
                               description="seeded random orders of the heads the importance order is compared "
                               "with (3: seeds 0, 1, 2)")
    mask_prob: float = Field(0.15, gt=0, lt=1, title="mask probability", description="texts: share of each text's "
                             "tokens masked")
    drop: float = Field(0.01, ge=0, le=1, title="allowed drop", description="the accuracy drop a layer's prunable "
                        "share allows (0.01: 1 point)")


class HeadsViewOptions(HeadsModel):
    """``heads view``: one sentence's attention, every layer and head (bertviz's head view as arrays)."""

    text: str = Field(title="sentence", description="the sentence (never cut: over the model's limit is an error)")
    layer: int | None = Field(None, json_schema_extra=FREE,
                              title="layer", description="also write attention.csv (long form) for this "
                              "attention layer (1-based)")
    head: int | None = Field(None, json_schema_extra=FREE,
                             title="head", description="with the layer: only this head (0-based)")
    compare: str | None = Field(None, json_schema_extra=path("model"),
                                title="compare with", description="a second model with the same tokenizer "
                                "(a name, random, job:N): attention.npz gains attention_compared and difference "
                                "(second - first)")


ACTION_OPTIONS = {"stats": HeadsStatsOptions, "parse": HeadsParseOptions, "importance": HeadsImportanceOptions,
                  "view": HeadsViewOptions}


class HeadsJobOptions(PlacementOptions, HeadsViewOptions, HeadsImportanceOptions, HeadsParseOptions,
                      HeadsStatsOptions):
    """A ``heads`` job: one action of ``layerlens heads`` (its fields: :data:`ACTION_OPTIONS`) with the same files,
    and where the job runs. Only the action's own input is given (:meth:`source`)."""

    action: Literal["stats", "parse", "importance", "view"] = Field(
        title="action", description="stats: per-head statistics and the head map; parse: heads as parsers on a UD "
        "treebank; importance: head importance and pruning; view: one sentence's attention")
    input: str | None = Field(None, json_schema_extra=path("data"),
                              title="texts or treebank", description="stats: texts (.txt, .csv, .tsv, "
                              ".jsonl) or a CoNLL-U treebank; importance: texts scored by the MLM loss")
    treebank: str | None = Field(None, json_schema_extra=path("data"),
                                 title="treebank", description="parse: a CoNLL-U treebank (.conllu, "
                                 ".conllu.gz)")
    text: str | None = Field(None, title="sentence", description="view: the sentence")

    def source(self) -> tuple[str, str]:
        """(the option holding this action's input, its value); a ``ValueError`` when it is missing or another
        action's input is given."""
        wanted = {"stats": ("input",), "parse": ("treebank",), "importance": ("input", "data"),
                  "view": ("text",)}[self.action]
        given = [name for name in ("input", "treebank", "data", "text") if getattr(self, name)]
        if len(given) != 1 or given[0] not in wanted:
            raise ValueError(f"a heads {self.action} job reads {' or '.join(wanted)} (one of them), not "
                             f"{', '.join(given) or 'nothing'}")
        return given[0], str(getattr(self, given[0]))

    def for_action(self):
        """The action's own options (:data:`ACTION_OPTIONS`) from these."""
        schema = ACTION_OPTIONS[self.action]
        return schema(**{k: v for k, v in self.model_dump().items() if k in schema.model_fields})
