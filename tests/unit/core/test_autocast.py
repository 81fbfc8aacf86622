"""analysis.core.autocast: the training side of the precision policy, and the frozen model's bfloat16 shadows."""

import pytest
import torch

from analysis.core.autocast import autocast, bf16_shadow, training_autocast
from models.loading import ModelSpec, load_model


@pytest.mark.parametrize("units, mode", [("1", "bfloat16"), ("0", "float32")])
def test_the_policy_is_bf16_pays_forced_by_the_environment(monkeypatch, units, mode):
    monkeypatch.setenv("LAYERLENS_BF16_UNITS", units)
    assert training_autocast("cpu") == mode
    with autocast("cpu", mode):
        out = torch.nn.functional.linear(torch.ones(2, 3), torch.ones(4, 3))
    assert out.dtype == (torch.bfloat16 if units == "1" else torch.float32)
    with pytest.raises(ValueError, match="autocast mode"):
        autocast("cpu", "float16")


def test_a_shadow_computes_what_autocast_computes_and_leaves_the_model_alone(tiny_dir):
    """Every family: under bf16 autocast the shadow's hidden states and MLM logits equal the model's bit for bit;
    the model's own tensors keep their dtype and storage; only the shadow's nn.Linear weights are bfloat16."""
    loaded = load_model(ModelSpec(str(tiny_dir), device="cpu"))
    base, head = loaded.model.base_model, loaded.anatomy.head
    before = {n: (p.dtype, p.data_ptr()) for n, p in loaded.model.named_parameters()}
    shadow_base, shadow_head = bf16_shadow(base), bf16_shadow(head)
    ids = torch.randint(5, 99, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = base(input_ids=ids, output_hidden_states=True).hidden_states
        got = shadow_base(input_ids=ids, output_hidden_states=True).hidden_states
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
        logits, shadow_logits = head(want[-1]), shadow_head(want[-1])
    assert logits.dtype == torch.bfloat16 and torch.equal(logits, shadow_logits)
    assert {n: (p.dtype, p.data_ptr()) for n, p in loaded.model.named_parameters()} == before
    linear = [m for m in shadow_base.modules() if isinstance(m, torch.nn.Linear)]
    assert linear and all(m.weight.dtype == torch.bfloat16 for m in linear)
    embeddings = [m.weight for m in shadow_base.modules() if isinstance(m, torch.nn.Embedding)]
    assert {w.dtype for w in embeddings} == {torch.float32}  # lookups as under autocast (a tied decoder: below)
    decoder = loaded.anatomy.decoder
    if decoder.weight is loaded.model.get_input_embeddings().weight:  # tied: the shadow's decoder has its own copy
        shadow_decoder = [m for m in shadow_head.modules() if isinstance(m, torch.nn.Linear)][-1]
        assert shadow_decoder.weight.dtype == torch.bfloat16
        assert torch.equal(shadow_decoder.weight, decoder.weight.to(torch.bfloat16))


def test_a_small_model_trains_in_float32_on_a_cpu_unless_forced(monkeypatch):
    """bf16 autocast pays on a CPU only for models of hidden size >= CPU_MIN_HIDDEN (measured); forced, always."""
    from analysis.core import autocast as A

    monkeypatch.setattr("analysis.core.precision.bf16_pays", lambda device="cpu": True)
    monkeypatch.delenv("LAYERLENS_BF16_UNITS", raising=False)
    assert A.training_autocast("cpu", 256) == "float32" and A.training_autocast("cpu", 768) == "bfloat16"
    assert A.training_autocast("cuda", 256) == "bfloat16"
    monkeypatch.setenv("LAYERLENS_BF16_UNITS", "1")
    assert A.training_autocast("cpu", 16) == "bfloat16"
