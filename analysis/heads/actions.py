"""The heads analysis' corpus actions as a run of ``layerlens heads stats|parse|importance`` and a ``heads`` job
both do them: read the input, run the engine, and name the files written (``docs/heads.md`` and the README
describe each). One definition, so the CLI and a job write the same files with the same ``run.json`` facts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from analysis.core.csvout import to_csv
from analysis.core.inputs import InputError, TextInputs, read_file
from analysis.core.store import key_of
from analysis.core.treebank import Treebank, read_conllu
from analysis.core.vectors import Progress
from analysis.heads.options import MIN_COUNT

ACTIONS = ("stats", "parse", "importance")
TREEBANK = (".conllu", ".conllu.gz")
INTERVALS = {"heads.csv": "95% Student t interval over sentence means (sentences are the independent unit)",
             "relations.csv": "95% Wilson score interval of the chosen head's accuracy over the relation's held-out "
                              "words (the head was chosen on the selection split)",
             "baseline": "the fixed offset k per relation and direction (the word k positions away) most accurate on "
                         "the selection split, scored on the held-out words (Clark et al. 2019 §4.2)",
             "splits": "kept sentences alternate: even positions choose (selection), odd ones score (held-out)"}
LOSSES = {"mlm": "MLM cross-entropy at masked tokens; accuracy: MLM token accuracy",
          "classifier": "the classifier's cross-entropy; accuracy: classification accuracy",
          "job": "the fine-tuning job's classifier (its pooling head on its fine-tuned encoder): cross-entropy; "
                 "accuracy: classification accuracy"}


@dataclasses.dataclass
class Output:
    """What an action produced: ``files`` (file name -> table, in the order written), ``info`` (what ``run.json``
    adds), ``shown`` (the table a terminal prints) and ``model`` (``run.json``'s model, model_spec and
    load_seconds: :func:`model_facts`)."""

    files: dict[str, pd.DataFrame]
    info: dict
    shown: pd.DataFrame
    model: dict

    def write(self, out: Path) -> None:
        for name, frame in self.files.items():
            to_csv(frame, out / name)


def model_facts(loaded) -> dict:
    """What ``run.json`` says of the model read."""
    return {"model": loaded.spec.name, "model_spec": loaded.spec.to_dict(),
            "load_seconds": round(loaded.load_seconds, 3)}


def read_corpus(path: Path | str, column: str = "text", limit: int | None = None, flag: str = "--input"
                ) -> TextInputs | Treebank:
    """Texts (.txt, .csv, .tsv, .jsonl: ``column``) or a CoNLL-U treebank (by its suffix), the first ``limit``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(f"{flag} {path}: no such file (texts or a CoNLL-U treebank)")
    if path.name.lower().endswith(TREEBANK):
        return read_conllu(path, limit)
    return read_file(path, column, limit=limit)


def read_treebank(path: Path | str, limit: int | None = None, flag: str = "--treebank") -> Treebank:
    path = Path(path).expanduser()
    if not path.is_file() or not path.name.lower().endswith(TREEBANK):
        raise InputError(f"{flag} {path}: no such CoNLL-U treebank (give a .conllu or .conllu.gz file)")
    return read_conllu(path, limit)


def stats(loaded, source: TextInputs | Treebank, *, clusters: bool = True, cluster_tokens: int = 2048,
          seed: int = 0, batch_size: int = 32, progress: Progress | None = None,
          should_stop: Callable[[], bool] | None = None, resume: Path | None = None) -> Output:
    """``heads.csv`` and (``clusters``) ``clusters.csv`` of ``loaded`` (eager attention) over ``source``
    (``resume``: :func:`analysis.heads.run.analyse`'s checkpoint folder)."""
    from analysis.heads.run import analyse

    result = analyse(loaded, source, parse=False, clusters=clusters, batch_size=batch_size,
                     cluster_tokens=cluster_tokens, seed=seed, progress=progress, should_stop=should_stop,
                     resume=resume)
    files = {"heads.csv": result.heads, **({"clusters.csv": result.clusters} if result.clusters is not None else {})}
    shown = result.heads[["layer", "head", "entropy", "cls", "sep", "punct", "self", "previous", "next", "distance"]]
    return Output(files, {**result.info, "intervals": {"heads.csv": INTERVALS["heads.csv"]}}, shown,
                  model_facts(loaded))


def parse(loaded, treebank: Treebank, relations: list[str] | None = None, batch_size: int = 32,
          progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
          resume: Path | None = None, reading: str = "clark", symmetry: str = "sum",
          min_count: int = MIN_COUNT) -> Output:
    """``relations.csv``, ``head_accuracies.csv`` and ``uuas.csv`` of ``loaded`` (eager attention) on
    ``treebank``; ``run.json`` names the best attention tree (chosen on the selection split, scored on the
    held-out one) and the relations left out for their count."""
    from analysis.heads.run import analyse

    result = analyse(loaded, treebank, statistics=False, clusters=False, relations=relations,
                     batch_size=batch_size, progress=progress, should_stop=should_stop, resume=resume,
                     reading=reading, symmetry=symmetry, min_count=min_count)
    info = {**result.info, "intervals": {"relations.csv": INTERVALS["relations.csv"]},
            "baseline": INTERVALS["baseline"], "splits": INTERVALS["splits"],
            "head_accuracies": "head_accuracies.csv: every head's accuracy per relation over both splits, the "
                               "selection split (on which relations.csv's best head is chosen) included: read the "
                               "held-out columns of relations.csv for a score free of the choice"}
    return Output({"relations.csv": result.relations, "head_accuracies.csv": result.accuracies,
                   "uuas.csv": result.uuas}, info, result.relations, model_facts(loaded))


def importance(spec, *, texts: Path | None = None, data: Path | None = None, column: str = "text",
               label_column: str = "label", pair_column: str | None = None, limit: int | None = None,
               batch_size: int = 16, mask_prob: float = 0.15, seed: int = 0, steps: int = 10, drop: float = 0.01,
               progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
               resume: Path | None = None, random_orders: int = 3) -> Output:
    """``importance.csv`` and ``pruning.csv`` of the model ``spec`` names: the MLM loss of its own MLM head on
    ``texts``, or its own sequence-classification head's loss on the labelled set ``data`` (one of the two).
    ``resume``: a folder for the run's checkpoint (:class:`analysis.heads.importance.Scores`), keyed by the model's
    fingerprint, the rows read and every option that changes a number."""
    from analysis.core.activations import max_input_length
    from analysis.heads import importance as imp
    from analysis.heads.batches import classifier_batches, classifier_labels
    from models.loading import load_as_saved, load_model

    if (texts is None) == (data is None):
        raise InputError("give either texts (the MLM loss) or a labelled set (a classifier's loss), not both")
    if not 0 < mask_prob < 1:
        raise InputError(f"the mask probability must be between 0 and 1, got {mask_prob}")
    path = Path(texts or data).expanduser()
    if not path.is_file():
        raise InputError(f"{'--input' if texts else '--data'} {path}: no such file")
    options = {"steps": steps, "drop": drop, "progress": progress, "should_stop": should_stop,
               "seeds": tuple(range(random_orders))}

    def checkpoint(loaded, rows: TextInputs, loss: str) -> dict:
        if resume is None:
            return {}
        key = key_of(kind="heads-importance", model=loaded.fingerprint, data=rows.content_hash(), loss=loss,
                     batch_size=batch_size, mask_prob=mask_prob if loss == "mlm" else None, seed=seed, steps=steps,
                     drop=drop, random_orders=random_orders)
        return {"checkpoint": Path(resume) / f"{key}.json"}

    if texts is not None:
        loaded = load_model(spec)
        rows = read_file(path, column, limit=limit)
        result = imp.mlm_importance(loaded, rows, batch_size=batch_size, mask_prob=mask_prob, seed=seed, **options,
                                    **checkpoint(loaded, rows, "mlm"))
        loss = LOSSES["mlm"]
    else:
        loaded = load_model(dataclasses.replace(spec, device="cpu"))  # the tokenizer, the limit, the spec's checks
        model, _ = load_as_saved(loaded.spec, loaded.spec.dtype)
        labels = classifier_labels(model, f"'{loaded.spec.name}'")
        labelled = read_file(path, column, pair_column, limit, label_column=label_column)
        batches = classifier_batches(loaded.tokenizer, labelled, labels, max_input_length(loaded), batch_size)
        result = imp.head_importance(model, batches, **options, **checkpoint(loaded, labelled, "classifier"))
        loss = LOSSES["classifier"]
    return importance_output(result, loss, model_facts(loaded))


def importance_output(result, loss: str, model: dict) -> Output:
    """The files and ``run.json`` facts of an :class:`analysis.heads.importance.ImportanceResult` (``loss``: what
    was scored; ``model``: :func:`model_facts`, or a fine-tuning job's classifier's)."""
    seeds = result.info["seeds"]
    info = {**result.info, "loss": loss,
            "random_orders": f"{len(seeds)} seeded random permutations of all heads (seeds "
                             f"{', '.join(map(str, seeds)) or 'none'})"}
    return Output({"importance.csv": result.importance, "pruning.csv": result.pruning}, info, result.importance,
                  model)


def at_fraction(pruning: pd.DataFrame, fraction: float, order: str = "importance") -> float:
    """The pruning curve's accuracy (``order``: importance, or the first random seed's) nearest ``fraction``."""
    curve = pruning[pruning.order == order]
    return float(curve.iloc[(curve["fraction"] - fraction).abs().argsort().iloc[0]]["accuracy"])
