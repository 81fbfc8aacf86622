"""The token atlas' options, each field defined once: one schema per action of ``layerlens tokens``
(:class:`TokensExtractOptions`, :class:`TokensIndexOptions`, :class:`TokensNeighboursOptions`,
:class:`TokensGeometryOptions`, :class:`TokensMapOptions`), from which the tasks (:mod:`analysis.tasks.tokens`)
derive their CLI flags, and the ``tokens`` job's (:class:`TokensJobOptions`: extract a corpus, then index it), from
which the page's job form is derived."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from analysis.core.options import FREE, MAX_SEED, Options, PlacementOptions, path, text_column
from analysis.core.task import ReadingOptions

INDEX_KINDS = ("auto", "flat", "hnsw", "ivf")  # analysis.tokens.search's kinds (not imported: no faiss at import)
MAP_METHODS = ("pca", "umap")  # analysis.tokens.maps.METHODS


class TokensModel(ReadingOptions):
    """The model block and how many texts go through it at once."""

    batch_size: int = Field(32, ge=1, le=4096, title="batch size", description="texts per forward pass")


class Corpus(Options):
    """How a corpus is read and which hidden states are kept."""

    text_column: str = text_column()
    label_column: str | None = Field(None, title="label column", description="a label column kept with each "
                                     "token")
    limit: int | None = Field(None, ge=1, json_schema_extra={"browser_max": 1_000_000},
                              title="limit", description="read at most this many texts (sentences)")
    layers: str = Field("all", title="layers", description="hidden states to keep (extract) or to use: all, a "
                        "slice such as -4: or a list such as 0,6,12")
    shard_rows: int | None = Field(None, ge=1, json_schema_extra={"browser_max": 10**7},
                                   title="tokens per shard", description="default: about 256 MB "
                                   "a shard")


class Seed(Options):
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="seed of the samples: the IVF training "
                      "sample and the recall queries (index), UMAP's sample and fit (map), the samples and the "
                      "bootstrap (geometry)")


class TokensExtractOptions(Corpus, TokensModel):
    """``tokens extract``: token vectors per layer to disk (cached, resumable)."""

    input: Path | None = Field(None, json_schema_extra=path("data"),
                               title="corpus", description="texts (.txt one per line, .txt.gz, .csv, .tsv, "
                               ".jsonl) or a CoNLL-U treebank (.conllu, .conllu.gz: tokens get UPOS and DEPREL)")


class FromVectors(TokensExtractOptions):
    """An action on an extraction: ``vectors``, or the corpus read and extracted first."""

    vectors: Path | None = Field(None, json_schema_extra=path("store"),
                                 title="vectors", description="an extraction directory (printed by extract) "
                                 "or extract's --out; else --input is read and extracted first")


class TokensIndexOptions(Seed, FromVectors):
    """``tokens index``: a nearest-neighbour index per layer."""

    index: Literal["auto", "flat", "hnsw", "ivf"] = Field(
        "auto", title="index", description="index kind (auto: flat, exact, up to 1,000,000 tokens, ivf above; "
        "measured in docs/tokens.md)")
    rebuild: bool = Field(False, title="rebuild", description="build again even when cached")
    recall_queries: int = Field(200, ge=0, le=100_000, title="recall queries", description="tokens on which an "
                                "approximate index's recall@10 against exact search is measured (0: none)")
    threads: int | None = Field(None, ge=1, json_schema_extra={"browser_max": 64},
                                title="threads", description="faiss threads (default: faiss's own)")


class TokensNeighboursOptions(FromVectors):
    """``tokens neighbours``: the nearest tokens of one token at each layer."""

    index: Literal["auto", "flat", "hnsw", "ivf"] = Field("auto", title="index", description="the index searched")
    exact: bool = Field(False, title="exact", description="brute-force search over the shards, no index")
    standardize: bool = Field(False, title="standardize", description="cosine of vectors z-scored per dimension "
                              "over the corpus (Timkey & van Schijndel 2021: no rogue dimension dominates; brute "
                              "force)")
    row: int | None = Field(None, ge=0, json_schema_extra=FREE,
                            title="row", description="the query token's row in tokens.parquet")
    text_id: int | None = Field(None, ge=0, json_schema_extra=FREE,
                                title="text id", description="the query's text (with --position or "
                                "--word)")
    position: int | None = Field(None, ge=0, json_schema_extra=FREE,
                                 title="position", description="the query's token position in its "
                                 "text")
    word: str | None = Field(None, title="word", description="the query's word or token (first match, or within "
                             "--text-id)")
    k: int = Field(10, ge=1, le=100_000, title="neighbours", description="neighbours per layer")


class TokensGeometryOptions(Seed, FromVectors):
    """``tokens geometry``: anisotropy, self-similarity, intra-sentence similarity, variance, rogue dimensions per
    layer."""

    blocks: int = Field(20, ge=1, json_schema_extra={"browser_max": 1000},
                        title="blocks", description="contiguous text blocks of the intervals (bootstrap; "
                        "jackknife for the variance statistics)")
    boots: int = Field(200, ge=1, json_schema_extra={"browser_max": 10_000}, title="bootstrap replicates")
    min_count: int = Field(5, ge=1, json_schema_extra=FREE,
                           title="minimum count", description="occurrences a word type needs for "
                           "self-similarity")
    max_types: int = Field(1000, ge=1, json_schema_extra={"browser_max": 100_000},
                           title="word types", description="word types sampled")
    max_texts: int = Field(1000, ge=1, json_schema_extra={"browser_max": 100_000},
                           title="texts", description="texts sampled for intra-sentence similarity")


class TokensMapOptions(Seed, FromVectors):
    """``tokens map``: every token's 2-D coordinates at one layer (PCA or UMAP), cached beside the vectors."""

    layer: int | None = Field(None, json_schema_extra=FREE,
                              title="layer", description="the hidden state (default: the last extracted)")
    method: Literal["pca", "umap"] = Field("pca", title="method", description="pca (exact, every token) or umap "
                                           "(fitted on --sample random tokens, the others transformed)")
    sample: int = Field(20_000, ge=1, json_schema_extra={"browser_max": 200_000},
                        title="UMAP sample", description="tokens UMAP is fitted on")
    rebuild: bool = Field(False, title="rebuild", description="compute again even when cached")


class TokensJobOptions(PlacementOptions, Corpus, TokensModel):
    """A ``tokens`` job (:func:`analysis.tokens.job.run`): ``layerlens tokens extract`` of ``corpus``, then, unless
    ``index`` is ``none``, ``tokens index`` of every extracted layer; the model and where the job runs. Stored
    whole with the job."""

    corpus: str = Field(min_length=1, json_schema_extra=path("data"),
                        title="corpus", description="texts (.txt one per line, .txt.gz, .csv, "
                        ".tsv, .jsonl) or a CoNLL-U treebank (.conllu, .conllu.gz: tokens get UPOS and DEPREL)")
    index: Literal["none", "auto", "flat", "ivf", "hnsw"] = Field(
        "auto", title="index", description="the neighbour index built for every extracted layer (none: "
        "extract only; auto: flat, exact, up to 1,000,000 tokens, ivf above)")
    recall_queries: int = Field(200, ge=0, le=100_000, title="recall queries", description="tokens on which "
                                "an approximate index's recall@10 against exact search is measured (0: none)")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="seed of the IVF training sample and "
                      "the recall queries")
