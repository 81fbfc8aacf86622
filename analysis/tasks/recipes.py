"""Recipes that combine two techniques, defined once for the doors that offer them (a task may import any
technique; a technique never imports another)."""

from __future__ import annotations

from pathlib import Path

from analysis.core.inputs import InputError, TextInputs


def job_classifier_importance(checkpoint: Path, data: TextInputs, name: str = "the job", **options):
    """Head importance (Michel et al. 2019, :func:`analysis.heads.importance.classifier_importance`) of a finished
    fine-tuning job's own classifier: its pooling head on its fine-tuned encoder (``checkpoint``, read by
    :func:`analysis.training.finetune.load_checkpoint`), with the job's own length limit and truncation, scored on
    ``data`` (labelled). ``options`` go to ``classifier_importance`` (batch size, steps, progress, ...)."""
    from analysis.heads.importance import classifier_importance
    from analysis.training.finetune import load_checkpoint

    if not (Path(checkpoint) / "head.json").is_file():
        raise InputError(f"{name} kept no classifier (head.json) beside its encoder")
    model, tokenizer, meta = load_checkpoint(Path(checkpoint), "cpu")
    return classifier_importance(model, tokenizer, meta["labels"], data, encoder=model.encoder,
                                 max_length=int(meta.get("max_length") or 512),
                                 truncation=meta.get("truncation") or "head", **options)
