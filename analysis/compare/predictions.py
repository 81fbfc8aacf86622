"""A classifier's own prediction of each row, for the movers table's "prediction before and after" (issue 28, 3.).

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

from analysis.core.inputs import TextInputs
from models.loading import LoadedModel


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

