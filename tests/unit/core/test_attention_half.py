"""The attention half of each layer (issue 36, item 5): the residual stream after a layer's attention block and
before its feed-forward block, read for every family, checked three ways that do not use the code's own hook:
a forward hook on the family's attention module, a pre-hook on its feed-forward entry, and the layer's
feed-forward block recomposing the layer's output from it."""

from __future__ import annotations

import pytest
import torch

from analysis.core.activations import encode, hidden_states, make_batch, state_labels
from analysis.core.inputs import InputError, TextInputs
from analysis.duplication.plan import duplicate_first, preview
from models.loading import ModelSpec, load_model
from tests.support.models import TINY_CONFIGS, save_tiny

TEXTS = TextInputs(("the film is good .", "i hated it , very dull !", "fun"))


def batch_of(loaded):
    encoded = encode(loaded.tokenizer, TEXTS, 32)
    return make_batch(encoded, list(range(len(TEXTS))), loaded.tokenizer.pad_token_id)


def layers_of(model):
    """Per encoder layer: (its attention module, its feed-forward entry, its feed-forward block as a function of
    the attention half), from transformers' modeling code, independently of analysis.core.activations."""
    family = model.config.model_type
    base = model.base_model
    if family == "distilbert":
        return [(layer.attention, layer.ffn,
                 lambda a, layer=layer: layer.output_layer_norm(layer.ffn(a) + a)) for layer in base.transformer.layer]
    if family == "albert":
        config = model.config
        per_group = config.num_hidden_layers // config.num_hidden_groups
        out = []
        for i in range(config.num_hidden_layers):
            layer = base.encoder.albert_layer_groups[i // per_group].albert_layers[0]
            out.append((layer.attention, layer.ffn,
                        lambda a, layer=layer: layer.full_layer_layer_norm(layer.ff_chunk(a) + a)))
        return out
    return [(layer.attention, layer.intermediate, lambda a, layer=layer: layer.output(layer.intermediate(a), a))
            for layer in base.encoder.layer]


@torch.inference_mode()
def test_the_attention_half_is_the_state_between_the_attention_and_feed_forward_blocks(tiny_dir):
    loaded = load_model(ModelSpec(str(tiny_dir), device="cpu"))
    batch = batch_of(loaded)
    L = loaded.num_layers
    plain = hidden_states(loaded, batch)
    both = hidden_states(loaded, batch, half="attention")
    labels = state_labels(L, "attention")
    assert len(both) == len(labels) == 2 * L + 1
    outputs = [s for s, (_, half) in zip(both, labels, strict=True) if half == "output"]
    halves = [s for s, (_, half) in zip(both, labels, strict=True) if half == "attention"]
    assert all(torch.equal(a, b) for a, b in zip(outputs, plain, strict=True))  # the outputs are untouched

    attention_out, ffn_in = [], []
    modules = layers_of(loaded.model)
    seen: set[int] = set()
    handles = []
    for attention, ffn, _ in modules:
        if id(attention) in seen:  # ALBERT: one shared module fires at every layer
            continue
        seen.add(id(attention))
        handles.append(attention.register_forward_hook(
            lambda m, args, out: attention_out.append(out[0] if isinstance(out, tuple) else out)))
        handles.append(ffn.register_forward_pre_hook(lambda m, args: ffn_in.append(args[0])))
    try:
        loaded.model.base_model(**batch.model_inputs())
    finally:
        for handle in handles:
            handle.remove()
    if loaded.anatomy.family == "distilbert":  # its attention module returns the pre-LayerNorm context
        attention_out = [layer.sa_layer_norm(a + h) for layer, a, h in
                         zip(loaded.model.base_model.transformer.layer, attention_out, plain[:-1], strict=True)]
    assert len(attention_out) == len(ffn_in) == len(halves) == L
    keep = batch.attention_mask.bool()
    for layer, (half, by_hook, entry, (_, _, feed_forward)) in enumerate(
            zip(halves, attention_out, ffn_in, modules, strict=True), start=1):
        torch.testing.assert_close(half, by_hook, rtol=0, atol=1e-6)
        torch.testing.assert_close(half, entry, rtol=0, atol=0)
        # the layer's own feed-forward block turns its attention half into its output
        torch.testing.assert_close(feed_forward(half)[keep], plain[layer][keep], rtol=1e-5, atol=1e-5)


def test_state_labels_put_each_attention_half_before_its_layers_output():
    assert state_labels(2) == [(0, "output"), (1, "output"), (2, "output")]
    assert state_labels(2, "attention") == [(0, "output"), (1, "attention"), (1, "output"), (2, "attention"),
                                           (2, "output")]
    with pytest.raises(InputError, match="unknown half 'ffn'"):
        state_labels(2, "ffn")


@torch.inference_mode()
def test_a_duplicated_layer_gives_its_attention_half_at_each_copy(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    deeper = preview(loaded, duplicate_first(loaded.num_layers, 2))
    batch = batch_of(deeper)
    states = hidden_states(deeper, batch, half="attention")
    assert len(states) == 2 * deeper.num_layers + 1
    plain = hidden_states(deeper, batch)
    for layer in range(1, deeper.num_layers + 1):
        module = deeper.model.base_model.encoder.layer[layer - 1]
        torch.testing.assert_close(module.output(module.intermediate(states[2 * layer - 1]), states[2 * layer - 1]),
                                   plain[layer], rtol=1e-5, atol=1e-5)


def test_an_albert_with_two_attention_blocks_per_layer_is_refused(tmp_path):
    config = TINY_CONFIGS["albert"]
    TINY_CONFIGS["albert"] = type(config).from_dict({**config.to_dict(), "inner_group_num": 2})
    try:
        path = save_tiny("albert", tmp_path / "albert2", copy_steps=0)
    finally:
        TINY_CONFIGS["albert"] = config
    loaded = load_model(ModelSpec(str(path), device="cpu"))
    with pytest.raises(InputError, match="2 attention blocks per layer"):
        hidden_states(loaded, batch_of(loaded), half="attention")


def test_the_probe_command_writes_the_attention_halves(tiny_dirs, tmp_path, capsys):
    import json

    import pandas as pd

    from cli.main import main

    texts = tmp_path / "texts.txt"
    texts.write_text("the film is good .\ni hated it\n")
    model = str(tiny_dirs["distilbert"])
    out = tmp_path / "out"
    assert main(["probe", "--model", model, "--input", str(texts), "--out", str(out), "--half", "attention"]) == 0
    layers = pd.read_csv(out / "layers.csv")
    assert layers.columns[:2].tolist() == ["layer", "half"]
    assert layers[["layer", "half"]].apply(tuple, axis=1).tolist() == [
        (0, "output"), (1, "attention"), (1, "output"), (2, "attention"), (2, "output")]
    assert set(pd.read_parquet(out / "tokens.parquet")["half"]) == {"attention", "output"}
    assert set(pd.read_csv(out / "decoded.csv")["half"]) == {"attention", "output"}
    assert json.loads((out / "run.json").read_text())["options"]["half"] == "attention"
    plain = tmp_path / "plain"
    assert main(["probe", "--model", model, "--input", str(texts), "--out", str(plain)]) == 0
    assert "half" not in pd.read_csv(plain / "layers.csv").columns  # a default run's files are as before
    capsys.readouterr()
    assert main(["probe", "--model", model, "--input", str(texts), "--out", str(tmp_path / "x"), "--half",
                 "attention", "--lens", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    # not a lens at all: one line (a lens of the layer outputs only: tests/unit/probe/test_lens.py)
    assert err.count("\n") == 0 and "is not a tuned lens" in err and not (tmp_path / "x").exists()
