"""The precision policy (analysis.core.precision): the certified bf16 vocabulary product gives the float32 tables.

Both paths run everywhere: ``LAYERLENS_BF16_UNITS`` says whether the machine has bf16 matrix units."""

import numpy as np
import pytest
import torch

from analysis.core.inputs import TextInputs
from analysis.core.precision import bf16_units, head_product
from analysis.probe.certified import CertifiedHead
from analysis.probe.reconstruction import ProbeConfig, Scores, probe, score_rows
from analysis.probe.rowstats import row_stats
from models.loading import ModelSpec, load_model
from tests.unit.probe.test_reconstruction import TEXTS

SENTENCES = TEXTS + ["the acting was wonderful and the plot was good .", "a dull , very dull film , not fun at all"]


@pytest.fixture
def bf16_on(monkeypatch):
    monkeypatch.setenv("LAYERLENS_BF16_UNITS", "1")


def test_the_capability_can_be_forced_either_way(monkeypatch):
    monkeypatch.setenv("LAYERLENS_BF16_UNITS", "0")
    assert not bf16_units("cpu") and head_product("certified", "cpu") == "float32"
    monkeypatch.setenv("LAYERLENS_BF16_UNITS", "1")
    assert bf16_units("cpu") and head_product("certified", "cpu") == "bfloat16, certified"
    assert head_product("float32", "cpu") == "float32"
    assert head_product("certified", "cpu", needs_distributions=True) == "float32"  # lens, divergence: float32
    with pytest.raises(ValueError, match="precision must be one of"):
        head_product("fast", "cpu")


def test_without_the_override_the_capability_is_read_off_the_cpu(monkeypatch):
    from analysis.core.precision import _cpu_flags, bf16_pays

    monkeypatch.delenv("LAYERLENS_BF16_UNITS", raising=False)
    has_units = bool({"amx_bf16", "avx512_bf16"} & _cpu_flags()) and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert bf16_units("cpu") == has_units
    assert bf16_pays("cpu") <= has_units  # never bf16 training without the units


def check_against_float32(exact, plain, certified=None):
    """Integers identical; probabilities within the bound the certified path stated."""
    assert exact.layers[["tokens", "correct"]].equals(plain.layers[["tokens", "correct"]])
    assert exact.decoded.equals(plain.decoded)
    a, b = exact.tokens, plain.tokens
    for col in ("text_id", "layer", "position", "input_token", "predicted_token", "correct", "rank"):
        assert a[col].tolist() == b[col].tolist(), col
    assert [list(x) for x in a["top_tokens"]] == [list(x) for x in b["top_tokens"]]
    bound = exact.precision["max_log_prob_bound"]
    gap = np.abs(np.log(a["prob"].to_numpy()) - np.log(b["prob"].to_numpy()))
    assert gap.max() <= bound, (gap.max(), bound)
    top_gap = np.abs(np.log(np.stack(a["top_probs"])) - np.log(np.stack(b["top_probs"])))
    assert top_gap.max() <= bound
    return gap.max(), bound


@pytest.mark.parametrize("mode", ["unmasked", "masked"])
@pytest.mark.slow
def test_the_demo_models_exact_tables_are_the_float32_tables(bf16_on, mode):
    loaded = load_model(ModelSpec("demo", device="cpu"))
    inputs = TextInputs(tuple(SENTENCES * 3))
    plain = probe(loaded, inputs, ProbeConfig(mode=mode, precision="float32"))
    exact = probe(loaded, inputs, ProbeConfig(mode=mode, precision="certified"))
    assert plain.precision["head_product"] == "float32"
    info = exact.precision
    assert info["head_product"] == "bfloat16, certified" and info["rows"] == len(exact.tokens)
    assert 0 < info["recomputed"] < info["rows"]  # most rows certified, the near ties recomputed
    worst, bound = check_against_float32(exact, plain)
    assert worst > 0  # the bf16 normaliser really was used


def test_every_family_gives_the_float32_tables(bf16_on, tiny_dir):
    loaded = load_model(ModelSpec(str(tiny_dir), device="cpu"))
    inputs = TextInputs(tuple(SENTENCES))
    plain = probe(loaded, inputs, ProbeConfig(top_k=3, precision="float32"))
    exact = probe(loaded, inputs, ProbeConfig(top_k=3, precision="certified"))
    assert exact.precision["head_product"] == "bfloat16, certified"
    check_against_float32(exact, plain)


def certified_against_float32(decoder: torch.nn.Linear, targets: torch.Tensor) -> CertifiedHead:
    """Score random states through LayerNorm + ``decoder`` with the certified head: integers identical to the
    float32 head's, probabilities within the bound it states. Returns the head (its stats)."""
    transform = torch.nn.LayerNorm(decoder.in_features)
    states = torch.randn(len(targets), decoder.in_features)
    head = CertifiedHead(transform, decoder)
    got = head.score(states, targets, 4)
    want = row_stats(decoder(transform(states)).detach(), targets, 4)
    for g, w, name in zip(got, want, ["pred", "prob", "rank", "top_ids", "top_probs"], strict=True):
        if name in ("prob", "top_probs"):
            assert torch.allclose(g.log(), w.log(), rtol=0, atol=head.stats.max_log_prob_bound + 1e-5), name
        else:
            assert torch.equal(g, w), name
    return head


def test_near_ties_fall_back_and_agree_with_float32(bf16_on):
    """Vocabulary rows that differ by less than bf16 can resolve: every such row must be recomputed."""
    torch.manual_seed(0)
    hidden, vocab = 64, 300
    decoder = torch.nn.Linear(hidden, vocab)
    with torch.no_grad():
        decoder.weight.mul_(4.0)
        # pairs of rows a few float32 ulps apart: their logits tie far below bf16's resolution
        decoder.weight[1::2] = decoder.weight[0::2] * (1 + 3e-6)
        decoder.bias[1::2] = decoder.bias[0::2]
    head = certified_against_float32(decoder, torch.randint(0, vocab, (500,)))
    assert head.stats.recomputed == head.stats.rows == 500  # every row has a near tie in its top-5


def test_the_logit_bound_holds_and_is_not_vacuous(bf16_on):
    """The stated per-row bound E_i is never exceeded by the bf16 product, on the demo model's own head."""
    loaded = load_model(ModelSpec("demo", device="cpu"))
    a = loaded.anatomy
    head = CertifiedHead(a.head_transform, a.decoder)
    states = torch.randn(400, a.hidden_size) * 3
    with torch.no_grad():
        z = a.head_transform(states)
        exact = a.decoder(z)
        approx = (z.bfloat16() @ head.weight16.T).float() + head.bias
        error = (approx - exact).abs().max(dim=1).values
    bound = head.bound(z)
    assert (error <= bound).all()
    assert (error > bound / 100).any()  # the bound is a bound on real errors, within two orders of magnitude


def test_score_rows_with_the_certified_head_equals_score_rows_in_float32(bf16_on):
    loaded = load_model(ModelSpec("demo", device="cpu"))
    a = loaded.anatomy
    stacked = torch.randn(3, 90, a.hidden_size) * 2
    targets = torch.randint(0, a.vocab_size, (90,))
    plain, _ = score_rows(a.head, stacked, targets, 5, rows_per_chunk=64)
    certified = CertifiedHead(a.head_transform, a.decoder)
    exact, _ = score_rows(a.head, stacked, targets, 5, rows_per_chunk=64, certified=certified)
    assert isinstance(exact, Scores)
    for name in ("pred", "rank", "top_ids"):
        assert torch.equal(getattr(exact, name), getattr(plain, name)), name
    assert certified.stats.rows == 3 * 90


def test_the_bf16_copy_belongs_to_its_weight_not_to_a_reused_address():
    """A freed model's memory is reused by the next of the same shape: the copy must be the new weight's."""
    from analysis.probe.certified import _bf16_copy

    for seed in range(5):
        torch.manual_seed(seed)
        weight = torch.nn.Parameter(torch.randn(99, 32))
        assert torch.equal(_bf16_copy(weight), weight.detach().to(torch.bfloat16)), seed
        del weight


def test_the_head_is_its_transform_then_its_decoder_in_every_family(tiny_dir):
    a = load_model(ModelSpec(str(tiny_dir), device="cpu")).anatomy
    h = torch.randn(11, a.hidden_size)
    with torch.no_grad():
        assert torch.equal(a.decoder(a.head_transform(h)), a.head(h))


def test_a_rank_with_a_few_near_tokens_is_settled_token_by_token(bf16_on):
    """Tokens within the bf16 bound of the target's logit, but apart in float32, are compared one by one: the
    rank is the float32 rank without recomputing the row."""
    torch.manual_seed(1)
    hidden, vocab = 16, 300
    decoder = torch.nn.Linear(hidden, vocab)
    with torch.no_grad():
        decoder.bias.zero_()
        decoder.bias[:4] = torch.tensor([60.0, 45.0, 30.0, 15.0])  # a top-4 far apart: certain at once
    head = certified_against_float32(decoder, torch.randint(4, vocab, (400,)))
    assert head.stats.settled > 100  # most rows had near tokens and were settled, not recomputed
    assert head.stats.recomputed < head.stats.rows


@pytest.mark.slow
def test_run_json_names_the_mode_and_an_approximate_run_states_its_agreement_with_float32():
    from analysis.core.precision import AGREEMENT_TEXTS

    inputs = TextInputs(tuple(SENTENCES * 8))
    exact = probe(load_model(ModelSpec("demo", device="cpu")), inputs, ProbeConfig())
    assert exact.precision["mode"] == "exact: float32" and "agreement" not in exact.precision
    approx = probe(load_model(ModelSpec("demo", device="cpu", dtype="bfloat16")), inputs, ProbeConfig())
    info = approx.precision
    assert info["mode"].startswith("approximate: encoder and head in bfloat16") and info["encoder"] == "bfloat16"
    agreement = info["agreement"]
    assert agreement["texts"] == AGREEMENT_TEXTS
    # recompute the agreement by hand: the same sample in float32 and in bfloat16, token by token
    sample = TextInputs(inputs.texts[:AGREEMENT_TEXTS])
    a = probe(load_model(ModelSpec("demo", device="cpu", dtype="bfloat16")), sample, ProbeConfig()).tokens
    b = probe(load_model(ModelSpec("demo", device="cpu", dtype="float32")), sample, ProbeConfig()).tokens
    same = (a["predicted_token"] == b["predicted_token"]).to_numpy()
    assert agreement["predictions_identical"] == pytest.approx(same.mean())
    assert 0.9 <= agreement["predictions_identical"] <= 1  # bfloat16 may change a few predictions, not most
    assert agreement["max_prob_difference"] == pytest.approx((a["prob"] - b["prob"]).abs().max())
    assert agreement["max_prob_difference"] > 0  # bfloat16 really ran
    assert len(agreement["predictions_identical_per_layer"]) == len(approx.layers)


def test_the_cli_runs_the_mode_asked_for_and_names_it_in_run_json(bf16_on, tiny_dir, tmp_path):
    import json

    from cli.main import main

    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(SENTENCES))
    for precision, dtype in (("float32", "float32"), ("certified", "float32"), ("float32", "bfloat16")):
        out = tmp_path / f"{precision}-{dtype}"
        assert main(["probe", "--model", str(tiny_dir), "--input", str(texts), "--out", str(out),
                     "--precision", precision, "--dtype", dtype]) == 0
        info = json.loads((out / "run.json").read_text())["precision"]
        assert info["head_product"] == ("bfloat16, certified" if precision == "certified" else "float32")
        assert info["mode"].startswith("approximate" if dtype == "bfloat16" else "exact")
        assert ("agreement" in info) == (dtype == "bfloat16")
