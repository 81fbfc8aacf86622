"""A classifier's own head applied to one layer's states (the *readout*), for the two kinds of classifier:

- a Hugging Face ``*ForSequenceClassification`` (:class:`HubReadout`): its head reads only the last layer's
  sequence output ``h_L``; reading layer ``l`` puts ``h_l`` in its place and runs the head as the model's own
  ``forward`` does (BERT: ``classifier(pooler(h))``; ALBERT: ``classifier(tanh(pooler(h[:, 0])))``; DistilBERT:
  ``classifier(relu(pre_classifier(h[:, 0])))``; RoBERTa, XLM-R, CamemBERT, ELECTRA: ``classifier(h)``, their
  classification head reading ``h[:, 0]``). Dropout is off (eval mode), so ``l = L`` is the model's own logits;
- a LayerLens fine-tuning job's classifier (:class:`PoolingReadout`): its pooling head reads any of the ``L + 1``
  states (``cls``, ``pooler``, ``attention`` over 1..L, ``scalar-mix``, GRUBERT, ...). Reading layer ``l`` is an
  **early exit**: the states after ``l`` are replaced by ``h_l``, as if layers ``l + 1 .. L`` were the identity
  on the residual stream, and the head reads ``(h_0, .., h_l, h_l, .., h_l)``. For a head that reads only ``h_L``
  (``cls``, ``pooler``) this is exactly the hub case; for every head ``l = L`` is the job's own prediction.

This is the logit lens (nostalgebraist 2020) with the classifier's head in place of the unembedding; the tuned
variant (:mod:`analysis.classifier_lens.tuned`) adds Belrose et al. (2023)'s affine translators, eq. (2)-(4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def early_exit(states: Sequence[torch.Tensor], layer: int) -> tuple[torch.Tensor, ...]:
    """``(h_0, .., h_layer, h_layer, .., h_layer)``: the ``L + 1`` states of a model that stops at ``layer``."""
    return tuple(states[: layer + 1]) + (states[layer],) * (len(states) - 1 - layer)


class HubReadout:
    """The head of a transformers ``*ForSequenceClassification`` (module docstring), read at any layer."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.encoder = model.base_model
        self.num_layers = model.config.num_hidden_layers
        self.num_classes = model.config.num_labels
        self.head = hub_head(model)

    def states(self, inputs: dict) -> tuple[torch.Tensor, ...]:
        return self.encoder(**inputs, output_hidden_states=True, return_dict=True).hidden_states

    def logits(self, states: Sequence[torch.Tensor], mask: torch.Tensor, layer: int) -> torch.Tensor:
        return self.head(states[layer])


def hub_head(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``h -> logits`` of ``model``'s own classification head, given the sequence output ``h`` (batch, seq,
    hidden); a :class:`ValueError` for a head this module does not know."""
    base, kind = model.base_model, model.config.model_type
    classifier = getattr(model, "classifier", None)
    if classifier is None:
        raise ValueError(f"{type(model).__name__} has no classifier module")
    if type(classifier).__name__.endswith("ClassificationHead"):  # RoBERTa, XLM-R, CamemBERT, ELECTRA: reads h[:, 0]
        return classifier
    if kind == "distilbert":
        return lambda h: classifier(torch.relu(model.pre_classifier(h[:, 0])))
    if kind == "albert":
        return lambda h: classifier(base.pooler_activation(base.pooler(h[:, 0])))
    if getattr(base, "pooler", None) is not None:  # BERT: the pooler's dense + tanh on h[:, 0]
        return lambda h: classifier(base.pooler(h))
    raise ValueError(f"the classification head of {type(model).__name__} is not one the classifier lens reads "
                     "(BERT, ALBERT, DistilBERT, RoBERTa, ELECTRA)")


class PoolingReadout:
    """A LayerLens job's classifier (an ``encoder`` and a pooling ``head(states, mask)``; :class:`analysis.training.
    train.Classifier`), read at any layer by an early exit (module docstring)."""

    def __init__(self, classifier: torch.nn.Module):
        self.classifier = classifier
        self.encoder = classifier.encoder
        self.num_layers = self.encoder.config.num_hidden_layers
        self.num_classes = getattr(classifier, "num_labels", None)
        self.uses_types = getattr(self.encoder.config, "type_vocab_size", 0) > 1

    def states(self, inputs: dict) -> tuple[torch.Tensor, ...]:
        if not self.uses_types:  # as the job's Classifier.forward: token types only where the model has them
            inputs = {k: v for k, v in inputs.items() if k != "token_type_ids"}
        return self.encoder(**inputs, output_hidden_states=True, return_dict=True).hidden_states

    def logits(self, states: Sequence[torch.Tensor], mask: torch.Tensor, layer: int) -> torch.Tensor:
        return self.classifier.head(early_exit(states, layer), mask).logits
