"""The comparison of checkpoints with what other techniques read of each model (:func:`compare`): the recipes
:func:`analysis.compare.run.compare` is given, because a technique never imports another.

- :func:`reconstructions`: each model's reconstruction probe (:mod:`analysis.probe`), for the reconstruction
  columns and their change;
- :func:`own_predictions`: a classifier's own prediction of each row, for the movers table's "prediction before
  and after" (issue 28, 3.).

Two kinds of classifier head are read, each as it predicts:
- a fine-tuning job's checkpoint (``checkpoint/encoder`` beside ``head.json`` and ``head.safetensors``): the
  LayerLens head it was trained with (:func:`analysis.training.finetune.load_checkpoint`), on the rows tokenised as the
  job tokenised (its length limit and truncation), as :func:`analysis.training.train.evaluate` scores it;
- a Hugging Face sequence classifier (``*ForSequenceClassification``): its own head
  (:func:`analysis.atlas.atlas.classify`), class names from its ``id2label``.
A masked LM or bare encoder has none: its column stays blank. The probe columns of the movers table are the other
"prediction": the linear probe's out-of-fold prediction at that layer (:func:`analysis.atlas.atlas.out_of_fold`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from analysis.compare.options import CompareConfig
from analysis.core.inputs import InputError, TextInputs
from models.loading import LoadedModel


def compare(models: list[LoadedModel], inputs: TextInputs, config: CompareConfig | None = None, progress=None,
            names: list[str] | None = None):
    """:func:`analysis.compare.run.compare` with the reconstruction probe and the classifiers' own predictions."""
    from analysis.compare import run

    return run.compare(models, inputs, config, progress, names, reconstruct=reconstructions,
                       predict=own_predictions)


def reconstructions(models: list[LoadedModel], inputs: TextInputs, config: CompareConfig, progress=None,
                    pairs: list[tuple[int, int]] | None = None,
                    names: list[str] | None = None) -> tuple[dict[int, object], dict[int, str]]:
    """Each model's reconstruction probe on ``inputs`` (:mod:`analysis.compare.recon`): ``({model index: per-token
    table}, {model index: which head read it, or why it was not read})``. A model listed twice is probed once.
    ``pairs`` (default: the first model with each other): a model is read only when it is in a pair whose two
    models both have an MLM head (own or lent): the change needs both, and a checkpoint without a head against its
    ``random:`` twin (whose random head it lacks) would otherwise spend the probe's time on one side only."""
    from analysis.probe.reconstruction import ProbeConfig, probe, require_mlm_head

    names = names or [m.spec.name for m in models]
    pairs = pairs or [(0, i) for i in range(1, len(models))]
    headed = [m.mlm_head is not None for m in models]
    needed = {k for pair in pairs if all(headed[k] for k in pair) for k in pair}
    probe_config = ProbeConfig(top_k=1, batch_size=config.batch_size, max_length=config.max_length)
    tokens, why, done = {}, {}, {}
    for i, m in enumerate(models):
        try:
            require_mlm_head(m)
        except InputError as exc:
            why[i] = f"not read: {exc}"
            continue
        if i not in needed:
            lacking = list(dict.fromkeys(names[k] for pair in pairs if i in pair for k in pair if not headed[k]))
            why[i] = (f"not read (skipped): '{', '.join(lacking)}' has no MLM head (its own or a lent one), and the "
                      "reconstruction change needs both models of a pair read by a head")
            continue
        key = m.spec.resolved()
        if key not in done:
            report = (lambda k, n, name=m.spec.name: progress(f"reconstruction of {name}", k, n)) if progress else None
            done[key] = probe(m, inputs, probe_config, progress=report).tokens
        tokens[i] = done[key]
        why[i] = "read by its own MLM head" if m.mlm_head == "own" else f"read by the MLM head {m.mlm_head}"
    return tokens, why



def job_checkpoint(loaded: LoadedModel) -> Path | None:
    """The job checkpoint folder ``loaded`` was read from (its ``encoder/``), or None."""
    from analysis.training.runs import classifier_checkpoint

    return classifier_checkpoint(loaded.spec.source) if Path(loaded.spec.source).name == "encoder" else None


def own_predictions(loaded: LoadedModel, inputs: TextInputs, max_length: int | None = None,
                    batch_size: int = 32) -> tuple[list[str] | None, str | None]:
    """``(predicted class per row, which head predicted)``; ``(None, None)`` for a model without a classifier head."""
    checkpoint = job_checkpoint(loaded)
    if checkpoint is not None:
        from analysis.core.activations import position_limit
        from analysis.training.finetune import load_checkpoint
        from analysis.training.taskdata import prepare
        from analysis.training.train import evaluate

        model, tokenizer, meta = load_checkpoint(checkpoint, loaded.spec.device)
        names = sorted(meta["labels"], key=meta["labels"].get)
        limit = min(max_length or 10**9, meta.get("max_length") or 10**9, position_limit(model.encoder.config))
        data = prepare(tokenizer, dataclasses.replace(inputs, labels=None), {}, limit, meta.get("truncation", "head"))
        ev = evaluate(model, data, batch_size, tokenizer.pad_token_id, loaded.spec.device)
        return [names[i] for i in ev.predictions], (f"the job's own LayerLens head '{meta['head']}' "
                                                    f"({checkpoint / 'head.safetensors'})")
    if loaded.task == "SequenceClassification":
        from analysis.atlas.atlas import classify

        predicted, _ = classify(loaded, inputs, max_length, batch_size)
        return predicted, f"the checkpoint's own {loaded.architecture or 'sequence classification'} head"
    return None, None

