"""The options of the linguistic-structure analysis (one schema: the CLI's flags are built from it)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from analysis.core.inputs import InputError
from analysis.core.options import (
    MAX_SEED,
    ModelOptions,
    Options,
    PlacementOptions,
    label_column,
    pair_column,
    path,
    text_column,
)

TASKS = ("upos", "deprel", "distance", "depth")
EWT = Path(__file__).resolve().parents[3] / "shared" / "data" / "ud_english_ewt"
DEFAULT_TRAIN = EWT / "en_ewt-ud-dev.conllu.gz"
DEFAULT_TEST = EWT / "en_ewt-ud-test.conllu.gz"
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "ud_english_ewt_sample"  # bundled: the page's default
SAMPLE_TRAIN = SAMPLE / "en_ewt-ud-dev-first300.conllu.gz"
SAMPLE_TEST = SAMPLE / "en_ewt-ud-test-first150.conllu.gz"


class StructureOptions(Options):
    """What :func:`analysis.structure.run.run_structure` computes (the model and files are given beside it)."""

    tasks: str = Field("upos,deprel,distance,depth", title="tasks", description="comma-separated: "
                       + ", ".join(TASKS))
    word_vector: Literal["first", "mean"] = Field("first", title="word vector", description="a word's vector: its "
                                                  "first subword's (Hewitt & Manning) or the mean of its subwords'")
    probe: Literal["linear", "mlp"] = Field("linear", title="label probe", description="linear: multinomial "
                                            "logistic regression; mlp: one hidden layer of 256 ReLU units")
    rank: int | None = Field(None, ge=1, le=65536, title="structural probe rank", description="k of B (k x "
                             "hidden), at most the hidden size (default min(hidden, 128))")
    layers: str = Field("all", title="layers", description="hidden states to probe: all, a slice such as -6: or a "
                        "list such as 0,4,8")
    tree_layers: str = Field("all", title="tree layers", description="layers whose predicted trees go to "
                             "trees.jsonl (of those probed), or none")
    mdl: bool = Field(True, title="MDL", description="online codelength of the label tasks (Voita & Titov)")
    batch_size: int = Field(32, ge=1, le=4096, title="batch size", description="sentences per forward pass when "
                            "extracting the word vectors")
    seed: int = Field(0, ge=0, le=MAX_SEED, title="seed")
    seeds: int = Field(1, ge=1, le=20, title="seeds", description="train the probes with this many seeds (seed, "
                       "seed + 1, ...): summary.csv's intervals then pool the seeds' bootstrap distributions, so they "
                       "cover the spread over training seeds as well as the test sentences. They widen only as far "
                       "as the seeds disagree: seeds that agree, and the linear label probe (it has no seed), leave "
                       "them as with one seed; every other number is the first seed's")
    max_sentences: int | None = Field(None, ge=1, json_schema_extra={"browser_max": 1_000_000},
                                      title="max sentences", description="read at most this many "
                                      "sentences of each file (the first)")
    max_epochs: int = Field(30, ge=1, le=1000, title="structural probe epochs", description="at most this many "
                            "epochs (early stopping on a 10% dev split of the training file)")

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, value: str) -> str:
        names = [t.strip().lower() for t in value.split(",") if t.strip()]
        unknown = [t for t in names if t not in TASKS]
        if unknown or not names:
            raise ValueError(f"unknown task(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(TASKS)}")
        return ",".join(dict.fromkeys(names))

    @property
    def task_list(self) -> list[str]:
        return self.tasks.split(",")


class StructureInputs(Options):
    """What a structure run reads: the two treebanks and an optional labelled set (the CLI's ``--label-data``), the
    same block in the CLI's task (:mod:`analysis.tasks.structure`) and in a job."""

    train: str = Field(str(DEFAULT_TRAIN), min_length=1, json_schema_extra=path("data"),
                       title="train on", description="CoNLL-U treebank the "
                       "probes are trained on (.conllu or .conllu.gz)")
    test: str = Field(str(DEFAULT_TEST), min_length=1, json_schema_extra=path("data"),
                      title="score on", description="CoNLL-U treebank the probes "
                      "are scored on")
    label_data: str | None = Field(None, json_schema_extra=path("data"),
                                   title="labelled set", description="a labelled set of texts (.csv, .tsv, "
                                   ".jsonl): its task label becomes one more task, 'label'")
    text_column: str = text_column()
    pair_column: str | None = pair_column()
    label_column: str = label_column()
    label_pooling: Literal["cls", "mean"] = Field("cls", title="label pooling", description="the labelled set's "
                                                  "sentence vector")


class StructureJobOptions(PlacementOptions, ModelOptions, StructureOptions, StructureInputs):
    """A ``structure`` job (:mod:`jobs`): the analysis's options plus the model, the inputs (:class:`StructureInputs`)
    and where the job runs. Stored whole with the job."""

    def analysis(self) -> StructureOptions:
        """The options :func:`analysis.structure.run.run_structure` takes."""
        return StructureOptions.from_dict(self.to_dict())


def check_rank(rank: int | None, hidden: int) -> int:
    from analysis.structure.structural import default_rank

    if rank is None:
        return default_rank(hidden)
    if rank > hidden:
        raise InputError(f"--rank {rank} is more than the model's hidden size {hidden}: B is k x hidden, k <= hidden")
    return rank
