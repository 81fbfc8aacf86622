"""The classifier lens's readout against plain transformers: at the last layer it is the model's own logits, and at
layer l it is the logits of the same model with its layers after l removed (the early exit it stands for)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from analysis.classifier_lens.readout import HubReadout, PoolingReadout, early_exit
from tests.support.models import TINY_CONFIGS, tiny_tokenizer

TEXTS = ["the film is good", "it was very bad and dull !", "i liked the movie"]


def classifier(family: str, seed: int = 0):
    torch.manual_seed(seed)
    config = copy.deepcopy(TINY_CONFIGS[family])
    config.num_labels = 3
    return AutoModelForSequenceClassification.from_config(config).eval()


def inputs(family: str) -> dict:
    enc = tiny_tokenizer()(TEXTS, padding=True, return_tensors="pt")
    if family in ("distilbert", "roberta", "xlm-roberta"):
        enc.pop("token_type_ids", None)
    return dict(enc)


def truncated(model, layers: int):
    """``model`` with only its first ``layers`` layers (a plain transformers model, no LayerLens code)."""
    cut = copy.deepcopy(model)
    base = cut.base_model
    stack = base.transformer if hasattr(base, "transformer") else base.encoder
    stack.layer = torch.nn.ModuleList(list(stack.layer)[:layers])
    return cut


@pytest.mark.parametrize("family", sorted(f for f in TINY_CONFIGS if f != "albert"))
def test_every_layer_is_the_model_stopped_there(family):
    model, batch = classifier(family), inputs(family)
    readout = HubReadout(model)
    with torch.no_grad():
        states = readout.states(batch)
        for layer in range(readout.num_layers + 1):
            expected = truncated(model, layer)(**batch).logits
            torch.testing.assert_close(readout.logits(states, batch["attention_mask"], layer), expected)
        assert torch.equal(readout.logits(states, batch["attention_mask"], readout.num_layers), model(**batch).logits)


def test_albert_reads_its_own_pooler():
    model, batch = classifier("albert"), inputs("albert")
    readout = HubReadout(model)
    with torch.no_grad():
        states = readout.states(batch)
        last = readout.num_layers
        assert torch.equal(readout.logits(states, batch["attention_mask"], last), model(**batch).logits)
        one = copy.deepcopy(model)
        one.config.num_hidden_layers = 1  # ALBERT shares one layer, run num_hidden_layers times
        one.base_model.encoder.config.num_hidden_layers = 1
        torch.testing.assert_close(readout.logits(states, batch["attention_mask"], 1), one(**batch).logits)


def test_a_model_without_a_known_head_is_refused():
    from transformers import BertForTokenClassification

    with pytest.raises(ValueError, match="not one the classifier lens reads|no classifier"):
        HubReadout(BertForTokenClassification(TINY_CONFIGS["bert"]))


@pytest.mark.parametrize("head", ["cls", "attention", "scalar-mix", "gru-share-1", "pooler"])
def test_a_jobs_pooling_head_at_the_last_layer_is_the_jobs_prediction(head):
    from transformers import AutoModel

    from analysis.training.train import Classifier

    torch.manual_seed(0)
    model = Classifier(AutoModel.from_config(TINY_CONFIGS["bert"]), head, 3, 0.0).eval()
    batch = inputs("bert")
    readout = PoolingReadout(model)
    last = readout.num_layers
    with torch.no_grad():
        states = readout.states(batch)
        assert torch.equal(readout.logits(states, batch["attention_mask"], last),
                           model(batch["input_ids"], batch["attention_mask"]).logits)
        if head == "cls":  # a head reading h_L only: layer L - 1 is the job's model with its last layer removed
            cut = copy.deepcopy(model)
            cut.encoder.encoder.layer = torch.nn.ModuleList(list(cut.encoder.encoder.layer)[:last - 1])
            shorter = cut.encoder(**batch, output_hidden_states=True).hidden_states
            expected = cut.head([*shorter, shorter[-1]], batch["attention_mask"]).logits
            torch.testing.assert_close(readout.logits(states, batch["attention_mask"], last - 1), expected)


def test_early_exit_repeats_the_exit_state():
    states = [torch.full((1,), float(i)) for i in range(5)]
    assert [s.item() for s in early_exit(states, 2)] == [0, 1, 2, 2, 2]
    assert [s.item() for s in early_exit(states, 4)] == [0, 1, 2, 3, 4]
