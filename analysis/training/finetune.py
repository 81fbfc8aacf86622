"""One fine-tuning run from data to files: what ``python -m analysis finetune`` and a dashboard job do.

Writes under ``out``: ``metrics.json`` (accuracy, macro_f1, head_trainable_parameters, history, per-class
report, confusion matrix, ``autocast``: the precision training's products ran in, ``bfloat16`` or ``float32``),
``predictions.csv`` (``example_id,label,prediction`` for the test set when given,
else the validation set), ``layer_weights.csv`` (attention / scalar-mix heads: ``example_id`` then
``layer_<i>``; rows sum to 1), ``checkpoint/`` (``encoder/`` as ``save_pretrained`` in float32, the dtype
training keeps its master weights in whatever the source checkpoint's dtype, with the tokenizer,
``head.safetensors``, ``head.json``; ``metrics.json``'s ``mlm_head_from`` names the model whose pre-trained MLM
head reads ``checkpoint/encoder``'s layers: ``ModelSpec(".../checkpoint/encoder", head_from=...)``),
``epochs/<e>/`` (per-epoch layer weights and validation [CLS] vectors)
and ``run.json``. With ``folds > 1``: k-fold cross-validation over the training set (mean and std), fold
predictions are out-of-fold, and a majority vote of the fold models labels the test set; no checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from analysis.core.activations import encode_truncated, position_limit
from analysis.core.autocast import BF16, autocast, training_autocast
from analysis.core.csvout import to_csv
from analysis.core.inputs import InputError, TextInputs, read_split
from analysis.core.parallel import Ranks, ranks_for
from analysis.core.scores import majority_class
from analysis.core.staging import check_room
from analysis.core.task import RunRecord
from analysis.training.options import saved_checkpoints
from analysis.training.taskdata import TaskData, label_ids, prepare
from analysis.training.train import (
    Callback,
    Classifier,
    FinetuneConfig,
    classification_metrics,
    evaluate,
    seed_everything,
    train,
    weights_frame,
)
from models.loading import ModelSpec, has_own_mlm_head, load_encoder, task_architecture


@dataclasses.dataclass
class Splits:
    train: TextInputs
    val: TextInputs | None = None
    test: TextInputs | None = None


def split_off(data, fraction: float, seed: int = 0):
    """(train, validation): a stratified random ``fraction`` of ``data`` held out for validation. ``data`` is
    any split with ``labels`` and ``subset``: rows as read (:class:`TextInputs`) or encoded (:class:`TaskData`,
    a fold's training rows for early stopping)."""
    from sklearn.model_selection import train_test_split

    if not 0 < fraction < 1:
        raise InputError(f"the validation fraction must be between 0 and 1, got {fraction}")
    positions = np.arange(len(data))
    try:
        tr, va = train_test_split(positions, test_size=fraction, random_state=seed, stratify=data.labels)
    except ValueError as exc:
        raise InputError(f"cannot hold out {fraction:g} of the rows for validation: {exc}") from None
    return data.subset(sorted(tr)), data.subset(sorted(va))


def majority_vote(predictions: list[np.ndarray]) -> np.ndarray:
    """Per example, the label most runs predicted; ties go to the smallest label id."""
    stacked = np.stack(predictions)
    return np.array([min(Counter(col).most_common(), key=lambda kv: (-kv[1], kv[0]))[0] for col in stacked.T])


FURTHER = "further_pretrained"  # the further pre-trained masked LM's folder in a run's folder (metrics.json names it)


def save_checkpoint(model: Classifier, tokenizer, labels: dict[str, int], config: FinetuneConfig, path: Path) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    model.encoder.save_pretrained(path / "encoder")
    tokenizer.save_pretrained(path / "encoder")
    save_file({k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()},
              path / "head.safetensors")
    (path / "head.json").write_text(json.dumps({"head": model.head_name, "labels": labels, "dtype": "float32",
                                                "dropout": config.dropout, "max_length": config.max_length,
                                                "truncation": config.truncation}, indent=2))


def load_checkpoint(path: Path, device: str = "cpu") -> tuple[Classifier, object, dict]:
    """(classifier in eval mode, tokenizer, head.json) from :func:`save_checkpoint`'s directory."""
    from safetensors.torch import load_file

    meta = json.loads((path / "head.json").read_text())
    encoder, tokenizer = load_encoder(ModelSpec(str(path / "encoder"), device=device))
    model = Classifier(encoder, meta["head"], len(meta["labels"]), meta["dropout"])
    model.head.load_state_dict(load_file(path / "head.safetensors"))
    return model.eval(), tokenizer, meta


def _one_run(encoder, tokenizer, num_labels: int, train_data: TaskData, val_data: TaskData, config, device, out,
             callbacks):
    seed_everything(config.seed)  # the head's initial weights too
    model = Classifier(encoder, config.head, num_labels, config.dropout).to(device)
    return train(model, train_data, val_data, config, tokenizer.pad_token_id, device, out, callbacks)


def further_pretrain(spec: ModelSpec, texts, steps: int, out: Path, batch_size: int = 16, max_length: int = 128,
                     lr: float = 5e-5, seed: int = 0, log: Callable[[str], None] = lambda s: None,
                     save_every: int = 0) -> Path:
    """Within-task further pre-training (Sun et al. 2019 §4.2 / §5.4): ``steps`` of masked-LM training (15%
    masking by transformers' ``DataCollatorForLanguageModeling``) on the task's own texts, from ``spec``'s
    pre-trained MLM, trained and saved in float32 (bfloat16 only as autocast where it pays:
    :func:`analysis.core.autocast.training_autocast`, as fine-tuning); saved to ``out`` (a ``save_pretrained``
    directory to fine-tune from). With ``save_every``, the masked LM is also saved at step 0 and every ``save_every``
    steps (and the last) as ``out/steps/step-<k>``: a series of checkpoints for ``layerlens series``. Returns
    ``out``."""
    from transformers import DataCollatorForLanguageModeling

    from models.loading import load_model

    seed_everything(seed)
    # a fresh copy (not the shared cache), made trainable here, in float32 whatever the checkpoint's dtype
    loaded = load_model(dataclasses.replace(spec, dtype="float32"))
    model, tok = loaded.model.train().requires_grad_(True), loaded.tokenizer
    mode = training_autocast(loaded.spec.device, model.config.hidden_size)
    enc = encode_truncated(tok, list(texts), None, max_length, "head")[0]  # the one tokenisation
    collate = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    rng = np.random.default_rng(seed)

    def save(path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(path)
        tok.save_pretrained(path)

    if save_every:
        save(out / "steps" / "step-0")
    for step in range(steps):
        rows = rng.choice(len(enc), size=min(batch_size, len(enc)), replace=False)
        batch = {k: v.to(loaded.spec.device) for k, v in collate([{"input_ids": enc[i]} for i in rows]).items()}
        with autocast(loaded.spec.device, mode):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            log(f"further pre-training step {step + 1}/{steps} ({mode}): MLM loss {loss.item():.3f}")
        if save_every and ((step + 1) % save_every == 0 or step == steps - 1):
            save(out / "steps" / f"step-{step + 1}")
    save(out)
    return out


def saved_model_bytes(spec: ModelSpec) -> int:
    """The bytes of one saved masked LM of ``spec``'s architecture in float32 (safetensors: 4 bytes a parameter),
    counted on the meta device from its config: no weights read."""
    from transformers import AutoModelForMaskedLM

    from models.loading import config_and_family

    config = config_and_family(spec)[0]
    with torch.device("meta"):
        model = AutoModelForMaskedLM.from_config(config)
    return 4 * sum(p.numel() for p in model.parameters())


def run_finetune(spec: ModelSpec, splits: Splits, config: FinetuneConfig, out: Path,
                 callbacks: list[Callback] = (), log: Callable[[str], None] = lambda s: None) -> dict:
    """Fine-tune ``spec`` on ``splits`` with ``config``; write the files above; return ``metrics.json``'s dict."""
    start = time.perf_counter()
    if splits.train.labels is None:
        raise InputError("the training data has no labels: choose the label column")
    if config.folds == 1 and splits.val is None:
        raise InputError("a validation set is needed (or use k-fold cross-validation with --folds K)")
    labels = label_ids(splits.train.labels, splits.val.labels if splits.val else None,
                       splits.test.labels if splits.test else None)
    names = list(labels)
    ranks = ranks_for(spec.device)
    spec = dataclasses.replace(spec, device=ranks.device_for(spec.device)).resolved()
    device = spec.device
    if ranks.is_main and (count := saved_checkpoints(config)):  # before any training: never a disk filled midway
        check_room(out, count * saved_model_bytes(spec), f"the {count:,} checkpoints this run saves (epochs' "
                   "encoders, further pre-training steps)")
    if ranks.is_main:
        out.mkdir(parents=True, exist_ok=True)
    if config.further_pretrain_steps:
        texts = splits.train.texts + (splits.train.pairs or ())
        further = out / FURTHER
        if ranks.is_main:  # one process trains and saves it; the others then load it
            further_pretrain(spec, texts, config.further_pretrain_steps, further, config.batch_size,
                             config.max_length, seed=config.seed, log=log,
                             save_every=config.further_pretrain_save_every)
        ranks.barrier()
        spec = dataclasses.replace(spec, name=str(further), revision=None)
    seed_everything(config.seed)  # parts the checkpoint lacks (a masked LM's pooler) start from the run's seed
    encoder, tokenizer = load_encoder(spec)
    precision = training_autocast(device, encoder.config.hidden_size)
    log(f"encoder: {spec.name} ({encoder.config.model_type}, {encoder.config.num_hidden_layers} layers, float32 "
        f"master weights on {device}, {'bfloat16 autocast' if precision == BF16 else 'float32 products'}); "
        f"{len(splits.train):,} training rows")
    max_length = min(config.max_length, position_limit(encoder.config))
    encode = lambda inputs: prepare(tokenizer, inputs, labels, max_length, config.truncation)  # noqa: E731
    train_data = encode(splits.train)
    test_data = encode(splits.test) if splits.test is not None else None
    head_params = Classifier(encoder, config.head, len(labels), config.dropout).head_parameters()
    result: dict = {"labels": names, "head": config.head, "head_trainable_parameters": head_params,
                    "truncated_train_texts": train_data.truncated, "max_length_used": max_length,
                    # what training's products ran in (float32 master weights either way); the scores below are
                    # computed in float32
                    "autocast": precision}
    if config.folds == 1:
        val_data = encode(splits.val)
        model, state = _one_run(encoder, tokenizer, len(labels), train_data, val_data, config, device, out, callbacks)
        target, name = (test_data, "test") if test_data is not None else (val_data, "validation")
        ev = evaluate(model, target, config.batch_size, tokenizer.pad_token_id, device, ranks=ranks)
        chosen = (f"validation loss on the {len(val_data):,} validation rows" if config.early_stopping else
                  f"none: the last of {config.epochs} epoch(s) is scored (the per-epoch history selects nothing)")
        result.update(evaluated_on=name, history=state.history, steps=state.step, stopped=len(state.history)
                      < config.epochs and state.step < state.total_steps,
                      steps_per_process=ranks.all_gather(state.step),  # equal: see analysis.training.train.share
                      epoch_chosen_on=chosen,
                      # early stopping scored on the rows that chose its epoch: optimistic, and said so
                      scored_on_selection_rows=bool(config.early_stopping and test_data is None))
        if target.labels[0] >= 0:
            result.update(ev.metrics(target.labels, names, train_data.labels))
        if ranks.is_main:
            to_csv(_predictions(target, ev.predictions, names), out / "predictions.csv")
            if ev.layer_weights is not None:
                to_csv(weights_frame(ev, target), out / "layer_weights.csv")
            save_checkpoint(model, tokenizer, labels, config, out / "checkpoint")
            for kept in sorted((out / "epochs").glob("*/encoder")):  # each epoch's encoder readable on its own
                tokenizer.save_pretrained(kept)
        # Kao et al. Fig. 2: the fine-tuned layers read by the pre-trained MLM head of the model they started from
        # the further pre-trained model is recorded relative to the run's folder, which a staged --out renames
        head = FURTHER if config.further_pretrain_steps else spec.name
        result["mlm_head_from"] = head if has_own_mlm_head(spec) else None
    else:
        result.update(_cross_validate(encoder, tokenizer, labels, train_data, test_data, config, device, out,
                                      callbacks, log, ranks))
    result["seconds"] = round(time.perf_counter() - start, 2)
    if ranks.is_main:
        (out / "metrics.json").write_text(json.dumps(result, indent=2, default=float))
    return result


def run_options(options, out: Path, callbacks: list[Callback] = (),
                log: Callable[[str], None] = lambda s: None) -> dict:
    """One run from :class:`analysis.training.options.FinetuneOptions` (the ``finetune`` command and every job): read
    the splits (holding out ``val_fraction`` of the training rows when no validation set is given and no k-fold),
    run, and write ``run.json`` beside the other files. Returns ``metrics.json``'s dict."""
    from analysis.training.options import sources

    if not options.train:
        raise InputError("no training data: set train (a file, 'demo' or hf:NAME[/CONFIG]:SPLIT)")
    config = options.training()
    read = split_reader(options)
    train_rows = read(options.train)
    val = read(options.val) if options.val else None
    if val is None and config.folds == 1:
        train_rows, val = split_off(train_rows, config.val_fraction, config.seed)
        log(f"note: validation = {len(val)} rows held out from the training data (stratified, seed {config.seed})")
    splits = Splits(train_rows, val, read(options.test) if options.test else None)
    origin = sources(options)
    log(f"learning rate {config.lr:g} ({origin.get('lr', 'LayerLens default')})")
    metrics = run_finetune(options.spec(), splits, config, out, callbacks, log)
    ranks = ranks_for(options.spec().device)
    if not ranks.is_main:
        return metrics
    RunRecord("finetune", {
        "options": options.to_dict(), "values_from": origin, "config": config.to_dict(),
        # the batch size is the global batch: each of the processes takes its share of every batch (at most
        # per_process_batch rows), and every process takes the same number of steps
        "processes": ranks.count, "per_process_batch": math.ceil(config.batch_size / ranks.count),
        "global_batch": config.batch_size,
        "autocast": metrics.get("autocast"),  # bfloat16 (autocast, float32 master weights) or float32
        # a task model's own head (a classifier's, say) is not used: the LayerLens head above replaces it
        "replaced_task_head": task_architecture(options.spec()),
        "model_spec": options.spec().to_dict(),
        "train": options.train, "val": options.val, "test": options.test, "text_column": options.text_column,
        "pair_column": options.pair_column, "label_column": options.label_column}).write(out)
    return metrics


def split_reader(options) -> Callable[[str], TextInputs]:
    """Reads a data source (``train``, ``val`` or ``test``) with ``options``' columns."""
    return lambda source: read_split(source, options.text_column, options.pair_column, options.label_column)


def held_out_rows(options, artifacts: Path) -> tuple[TextInputs, str]:
    """The rows a finished run was evaluated on and never trained on: its test file, else its validation file,
    else the validation rows it held out of its training file (the ids in ``predictions.csv``). Returns the
    rows and a sentence saying which they are. A k-fold run has none (every row trained some fold)."""
    if options.folds > 1:
        raise InputError("a k-fold run trained on every row (each in some fold): it has no held-out rows")
    read = split_reader(options)
    if options.test:
        rows = read(options.test)
        return rows, f"the {len(rows):,} test rows of {options.test}"
    if options.val:
        rows = read(options.val)
        return rows, f"the {len(rows):,} validation rows of {options.val}"
    ids = set(pd.read_csv(artifacts / "predictions.csv", usecols=["example_id"]).example_id.tolist())
    train_rows = read(options.train)
    rows = train_rows.subset([i for i, row in enumerate(train_rows.ids) if row in ids])
    return rows, (f"the {len(rows):,} validation rows held out of {options.train} (stratified, seed "
                  f"{options.seed}; the run trained on the other {len(train_rows) - len(rows):,})")


def _predictions(data: TaskData, predictions: np.ndarray, names: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"example_id": list(data.ids),
                         "label": [names[y] if y >= 0 else "" for y in data.labels],
                         "prediction": [names[p] for p in predictions]})


def fold_splits(labels, folds: int, seed: int, names: list | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """The k-fold cross-validation's ``(training rows, held-out rows)`` per fold: stratified, shuffled with
    ``seed``; an :class:`InputError` when a class (named by ``names[label]`` if given) has fewer rows than folds.
    The run and the submit-time check (:func:`analysis.training.job.check_held_out`) both split with it."""
    from sklearn.model_selection import StratifiedKFold

    counts = Counter(labels)
    rare = min(counts, key=counts.get)
    if counts[rare] < folds:
        raise InputError(f"class '{names[rare] if names else rare}' has {counts[rare]} row(s): too few for "
                         f"{folds}-fold cross-validation")
    splitter = StratifiedKFold(folds, shuffle=True, random_state=seed)
    return list(splitter.split(np.zeros(len(labels)), labels))


def _cross_validate(encoder, tokenizer, labels, data: TaskData, test: TaskData | None, config, device, out,
                    callbacks, log, ranks: Ranks) -> dict:
    names = list(labels)
    splits = fold_splits(data.labels, config.folds, config.seed, names)
    initial = {k: v.detach().cpu().clone() for k, v in encoder.state_dict().items()}
    folds, oof, test_votes = [], np.zeros(len(data), dtype=np.int64), []
    for k, (tr, va) in enumerate(splits):
        log(f"fold {k + 1}/{config.folds}")
        encoder.load_state_dict(initial)  # every fold starts from the pre-trained weights
        fold_config = config.replace(seed=config.seed + k)
        fit, watch = (split_off(data.subset(tr), config.val_fraction, config.seed + k)
                      if config.early_stopping else (data.subset(tr), data.subset(va)))
        fold_out = out / "folds" / str(k)
        model, state = _one_run(encoder, tokenizer, len(labels), fit, watch, fold_config, device, fold_out, callbacks)
        scored = data.subset(va)  # only scored: never seen by training nor by the choice of epoch
        ev = evaluate(model, scored, config.batch_size, tokenizer.pad_token_id, device, ranks=ranks)
        oof[va] = ev.predictions
        m = ev.metrics(scored.labels, names, fit.labels)
        if ranks.is_main:
            fold_out.mkdir(parents=True, exist_ok=True)
            (fold_out / "rows.json").write_text(json.dumps({
                "trained_on": list(map(int, fit.ids)), "chose_epoch": list(map(int, watch.ids))
                if config.early_stopping else [], "scored": list(map(int, scored.ids))}))
        folds.append({"fold": k, "accuracy": m["accuracy"], "macro_f1": m["macro_f1"], "history": state.history,
                      "trained_rows": len(fit), "epoch_rows": len(watch) if config.early_stopping else 0,
                      "scored_rows": len(scored)})
        if test is not None:
            test_votes.append(evaluate(model, test, config.batch_size, tokenizer.pad_token_id, device,
                                       ranks=ranks).predictions)
    acc, f1 = np.array([f["accuracy"] for f in folds]), np.array([f["macro_f1"] for f in folds])
    chosen = (f"validation loss on {config.val_fraction:.0%} of the training rows of each fold (stratified, seed "
              f"{config.seed} + fold); the held-out fold is only scored" if config.early_stopping else
              f"none: every fold trains {config.epochs} epoch(s) and its last epoch is scored (the per-epoch "
              "history is measured on the held-out fold and selects nothing)")
    result = {"folds": folds, "accuracy": float(acc.mean()), "accuracy_std": float(acc.std()),
              "macro_f1": float(f1.mean()), "macro_f1_std": float(f1.std()), "evaluated_on": "out-of-fold",
              "epoch_chosen_on": chosen, "scored_on_selection_rows": False}
    majority = majority_class(data.labels, list(range(len(names))))
    pooled = classification_metrics(oof, data.labels, names, majority)  # every row once, out of fold
    result.update({k: pooled[k] for k in ("baseline", "predicted_classes", "one_class", "confusion_matrix",
                                          "report")}, pooled_accuracy=pooled["accuracy"],
                  accuracy_interval=pooled["accuracy_interval"])
    if test is not None:
        vote = majority_vote(test_votes)
        if ranks.is_main:
            to_csv(_predictions(test, vote, names), out / "predictions.csv")
        if test.labels[0] >= 0:
            ens = classification_metrics(vote, test.labels, names, majority)
            result["ensemble_test"] = {k: ens[k] for k in ("accuracy", "accuracy_interval", "macro_f1", "baseline",
                                                           "one_class", "confusion_matrix")}
    elif ranks.is_main:
        to_csv(_predictions(data, oof, names), out / "predictions.csv")
    return result


