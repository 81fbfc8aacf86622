"""The token atlas' job options, defined once (:class:`TokensJobOptions`): a ``tokens`` job's JSON and the page's
job form are derived from it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from analysis.core.options import MAX_SEED, ModelOptions, PlacementOptions, text_column


class TokensJobOptions(PlacementOptions, ModelOptions):
    """A ``tokens`` job (:func:`analysis.tokens.job.run`): ``python -m analysis tokens extract`` of ``corpus``,
    then, unless ``index`` is ``none``, ``tokens index`` of every extracted layer; the model and where the
    job runs. Stored whole with the job."""

    corpus: str = Field(min_length=1, title="corpus", description="texts (.txt one per line, .txt.gz, .csv, "
                        ".tsv, .jsonl) or a CoNLL-U treebank (.conllu, .conllu.gz: tokens get UPOS and DEPREL)")
    text_column: str = text_column()
    label_column: str | None = Field(None, title="label column", description="a label column kept with each "
                                     "token")
    limit: int | None = Field(None, ge=1, title="limit", description="read at most this many texts (sentences)")
    layers: str = Field("all", title="layers", description="hidden states to keep: all, a slice such as -4: "
                        "or a list such as 0,6,12")
    shard_rows: int | None = Field(None, ge=1, title="tokens per shard", description="default: about 256 MB "
                                   "a shard")
    batch_size: int = Field(32, ge=1, le=4096, title="batch size", description="texts per forward pass")
    index: Literal["none", "auto", "flat", "ivf", "hnsw"] = Field(
        "auto", title="index", description="the neighbour index built for every extracted layer (none: "
        "extract only; auto: flat, exact, up to 1,000,000 tokens, ivf above)")
    recall_queries: int = Field(200, ge=0, le=100_000, title="recall queries", description="tokens on which "
                                "an approximate index's recall@10 against exact search is measured (0: none)")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed", description="seed of the IVF training sample and "
                      "the recall queries")
