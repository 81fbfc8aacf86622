"""The ``finetune`` job kind (:mod:`jobs.kinds`): fine-tune a head on a labelled set, the default kind (a job
whose options name no ``kind``).

Checked at submit (:func:`validate`): every option's type and bounds (a negative learning rate, ``num_processes``
"abc" or 0, an unknown truncation, ...), that the model's config loads and the head fits it (``gru-share-5`` on
12 layers, ``pooler`` on DistilBERT), that the data sources read, that the text/pair/label columns exist, that the
training labels have at least two classes and that the held-out rows leave every class a row
(:func:`check_held_out`). Run (:func:`run`): :func:`analysis.training.finetune.run_options`. This module never
imports ``jobs``: the browser's check, the model-config reader, the log, the progress reporter and the stop
request are passed in.
"""

from __future__ import annotations

from pathlib import Path

from analysis.core.inputs import InputError
from analysis.training.options import FinetuneOptions

NAME = "finetune"
OPTIONS = FinetuneOptions
STAGED = True  # the artifacts appear whole when the run is complete (analysis.core.staging), on the main process


def label(config: dict) -> str:
    """What the store and the pages call the job's work: its head (``attention``)."""
    return config.get("head", "cls")


def describe(config: dict) -> list[str]:
    """The job name's parts after its label and model: the data and the preset and training options that differ
    from what the model and the preset give by default (``demo set · epochs 1, lr 0.003``)."""
    from analysis.training.options import FinetuneConfig, defaults_for

    defaults = defaults_for(config.get("model", "demo"), config.get("preset"))
    data = config.get("train") or ""
    data = "demo set" if data == "demo" else Path(data).name if not data.startswith("hf:") else data[3:]
    changed = [f"{k.replace('_', ' ')} {config[k]:g}" if isinstance(config[k], float) else
               f"{k.replace('_', ' ')} {config[k]}" for k in FinetuneConfig.model_fields
               if k not in ("head", "save_vectors") and k in config and config[k] != defaults[k]]
    preset = [f"preset {config['preset']}"] if config.get("preset") else []
    return [data, ", ".join(preset + changed) or "defaults"]


def sweepable() -> tuple[str, ...]:
    """The options a sweep from the browser may vary: the training options
    (:data:`analysis.training.options.SWEEPABLE`, read when asked)."""
    from analysis.training import options

    return options.SWEEPABLE


def check_held_out(options, train) -> None:
    """The validation rows the run will hold out of ``train`` (with ``val_fraction``), held out now with the
    run's own function (:func:`analysis.training.finetune.split_off`), so a fraction that leaves a class without a row
    in the held-out or the training part is refused at submit, not after the model has loaded. k-fold: every class
    needs a row per fold, and with early stopping each fold's training rows are split as the run splits them."""
    from analysis.training.finetune import fold_splits, split_off

    def hold_out(rows, seed: int) -> None:
        try:
            split_off(rows, options.val_fraction, seed)
        except InputError as exc:
            raise InputError(f"val_fraction (validation fraction) {options.val_fraction:g}: {exc}") from None

    if options.folds == 1:
        if not options.val:
            hold_out(train, options.seed)
        return
    folds = fold_splits(train.labels, options.folds, options.seed)
    if options.early_stopping:
        for k, (rows, _) in enumerate(folds):
            hold_out(train.subset(sorted(rows)), options.seed + k)


def validate(config: dict, browser, model_config) -> tuple[dict, str]:
    """(the options to store, every field, the device the job will run on); a refusal is an
    :class:`InputError`, a ``ModelLoadError`` or a ``ValueError`` whose message says why. ``browser``: None, or
    the browser's check of the options (``browser(options)``: the data sources and the model), applied before
    anything is read; ``model_config(spec)``: the model's (config, family), or a ``ModelLoadError``."""
    from analysis.training.finetune import split_reader
    from analysis.training.heads import build_head
    from analysis.training.options import resolve
    from analysis.training.taskdata import label_ids

    options = resolve({k: v for k, v in config.items() if k != "kind"})
    if browser:
        options = browser(options)
    if not options.train:
        raise InputError("no training data: set train (a file, 'demo' or hf:NAME[/CONFIG]:SPLIT)")
    spec = options.spec().resolved()
    loaded_config, _ = model_config(spec)
    read = split_reader(options)
    train = read(options.train)
    others = [read(s) for s in (options.val, options.test) if s]
    label_ids(train.labels, *(o.labels for o in others))
    check_held_out(options, train)
    build_head(options.head, loaded_config.num_hidden_layers, loaded_config.hidden_size, 2,
               pooler=object() if getattr(loaded_config, "model_type", "") not in ("distilbert", "electra")
               else None)
    return options.to_dict(), spec.device


def run(config: dict, out: Path, control) -> dict:
    """Fine-tune as the job's options say (:func:`analysis.training.finetune.run_options`), its progress (step,
    epoch, loss, learning rate, per-epoch validation metrics) through ``control.reporter()`` (from the main
    process only: the others of a multi-process run report nothing) and its lines through ``control.log``.
    Returns the run's metrics."""
    from analysis.core.parallel import is_main_process
    from analysis.training.finetune import run_options
    from analysis.training.options import resolve

    main_process = is_main_process()
    report = control.reporter()
    options = resolve(config)

    def progress(event, state, _control):
        if not main_process:
            return
        if event == "epoch":
            h = state.history[-1]
            line = (f"epoch {h['epoch']}/{options.epochs}: train loss {h['train_loss']:.4f}, validation loss "
                    f"{h['val_loss']:.4f}, accuracy {h['val_accuracy']:.4f}, macro-F1 {h['val_macro_f1']:.4f}")
        else:
            line = (f"step {state.step}/{state.total_steps} (epoch {state.epoch}): loss {state.last_loss:.4f}, "
                    f"lr {state.lr:.3g}")
        report(line, {"step": state.step, "total_steps": state.total_steps, "epoch": state.epoch,
                      "epochs": options.epochs, "loss": state.last_loss, "lr": state.lr, "history": state.history},
               force=event == "epoch")

    return run_options(options, out, [progress], log=control.log)
