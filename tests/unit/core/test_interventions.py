"""The one intervention mechanism (analysis.core.interventions): in every family, zeroing units at a state's module
zeroes them in that hidden state as transformers returns it, changes the states after it, leaves the states before
it alone, and is gone after the block."""

from __future__ import annotations

import torch

from analysis.core.interventions import intervene, state_modules
from models.loading import ModelSpec, load_model


def states(loaded, enc):
    with torch.no_grad():
        return loaded.model.base_model(**enc, output_hidden_states=True).hidden_states


def test_zeroing_units_at_a_state_in_every_family(tiny_dir):
    loaded = load_model(ModelSpec(str(tiny_dir), device="cpu"))
    modules = state_modules(loaded.model)
    assert len(modules) == loaded.num_layers + 1
    enc = loaded.tokenizer(["the film is good", "it was dull and very dull"], return_tensors="pt", padding=True)
    plain = states(loaded, enc)
    units = torch.tensor([0, 3, 5])
    for target in range(loaded.num_layers + 1):
        def zero(layer, value, target=target):
            if layer != target:
                return None
            value = value.clone()
            value[..., units] = 0
            return value
        with intervene(loaded.model, modules, zero):
            ablated = states(loaded, enc)
        assert (ablated[target][..., units] == 0).all()
        for before in range(target):
            assert torch.equal(ablated[before], plain[before])
        if target < loaded.num_layers:
            assert not torch.allclose(ablated[target + 1], plain[target + 1])
    for a, b in zip(states(loaded, enc), plain, strict=True):  # the hooks are gone
        assert torch.equal(a, b)


def test_a_shared_module_is_told_the_layer_it_serves():
    """ALBERT runs one layer group at every layer: the hook sees layers 1..L in order, each pass anew."""
    from transformers import AlbertConfig, AlbertModel

    model = AlbertModel(AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=3,
                                     num_attention_heads=2, intermediate_size=32)).eval()
    seen = []
    with intervene(model, state_modules(model), lambda layer, value: seen.append(layer)):
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3]]))
            model(input_ids=torch.tensor([[1, 2]]))
    assert seen == [0, 1, 2, 3, 0, 1, 2, 3]
