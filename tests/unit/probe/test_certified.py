"""The certified head on both of its paths (issue 44 item 5): the CPU's (numba scan) and the device's (torch only,
run here on the CPU), against a float64 reference and against the float32 head.

- a row the certificate accepts has the float64 reference's prediction, top-k order and rank (its gaps exceed the
  bound, which covers float32's own error too);
- every row equals the float32 head's integers, with probabilities within the stated bound;
- adversarial near ties (top two logits closer than the bound) are recomputed, every one;
- exact ties follow the documented rule: earlier vocabulary index first;
- the original token inside the top-k is scored from its float32 logit."""

from __future__ import annotations

import pytest
import torch

from analysis.probe.certified import CertifiedHead
from analysis.probe.rowstats import row_stats

PATHS = pytest.mark.parametrize("on_device", [False, True], ids=["cpu-scan", "device-torch"])


def scored(decoder, states, targets, k, on_device):
    transform = torch.nn.Identity()
    head = CertifiedHead(transform, decoder)
    head.on_device = on_device
    with torch.no_grad():
        got = head.score(states, targets, k)
        want = row_stats(decoder(states).float(), targets, k)
    return head, got, want


def assert_float32(head, got, want):
    for g, w, name in zip(got, want, ["pred", "prob", "rank", "top_ids", "top_probs"], strict=True):
        if name in ("prob", "top_probs"):
            assert torch.allclose(g.log(), w.log(), rtol=0, atol=head.stats.max_log_prob_bound + 1e-5), name
        else:
            assert torch.equal(g, w), name


def float64_reference(decoder, states, targets, k):
    logits = states.double() @ decoder.weight.double().T + decoder.bias.double()
    target = logits.gather(1, targets[:, None])
    top = logits.topk(k, dim=1)
    return logits.argmax(1), (logits > target).sum(1) + 1, top.indices


@PATHS
def test_certified_rows_are_the_float64_references_and_all_rows_float32s(on_device):
    torch.manual_seed(0)
    hidden, vocab, n = 48, 500, 600
    decoder = torch.nn.Linear(hidden, vocab)
    with torch.no_grad():
        decoder.weight.mul_(8.0)  # logits spread as a trained head's (a few units apart at the top)
    states = torch.randn(n, hidden) * 2
    targets = torch.randint(0, vocab, (n,))
    with torch.no_grad():
        targets[::3] = decoder(states[::3]).argmax(1)  # the original token inside the top-k (first, here)
    head, got, want = scored(decoder, states, targets, 5, on_device)
    assert_float32(head, got, want)
    pred, rank, top = float64_reference(decoder, states, targets, 5)
    assert torch.equal(got[0], pred) and torch.equal(got[2], rank) and torch.equal(got[3], top)
    # both kinds of rows occur (a random head has close top-5s)
    assert head.stats.rows == n and 0 < head.stats.recomputed < 0.6 * n
    assert (got[0] == targets).sum() >= n // 3  # the target-in-top-k rows were scored


@PATHS
def test_near_ties_closer_than_the_bound_are_all_recomputed(on_device):
    torch.manual_seed(1)
    hidden, vocab, n = 64, 300, 300
    decoder = torch.nn.Linear(hidden, vocab)
    with torch.no_grad():
        decoder.weight.mul_(4.0)
        decoder.weight[1::2] = decoder.weight[0::2] * (1 + 3e-6)  # pairs a few float32 ulps apart
        decoder.bias[1::2] = decoder.bias[0::2]
    states = torch.randn(n, hidden)
    head, got, want = scored(decoder, states, torch.randint(0, vocab, (n,)), 5, on_device)
    assert head.stats.recomputed == head.stats.rows == n
    assert_float32(head, got, want)


@PATHS
def test_exact_ties_go_to_the_earlier_index(on_device):
    torch.manual_seed(2)
    hidden, vocab, n = 32, 200, 200
    decoder = torch.nn.Linear(hidden, vocab)
    with torch.no_grad():
        decoder.weight[101] = decoder.weight[7]  # tokens 7 and 101 score the same on every row
        decoder.bias[101] = decoder.bias[7]
        decoder.bias[7] += 40.0
        decoder.bias[101] += 40.0  # and they are every row's top two
    states = torch.randn(n, hidden)
    head, got, want = scored(decoder, states, torch.randint(0, vocab, (n,)), 3, on_device)
    assert_float32(head, got, want)
    assert (got[0] == 7).all() and (got[3][:, :2] == torch.tensor([7, 101])).all()
    assert head.stats.recomputed == n  # an exact tie is never certified: the float32 head settles it


@PATHS
def test_a_target_tied_with_others_keeps_the_strict_rank(on_device):
    """rank = 1 + tokens strictly above the target: a token tied with it does not push it down."""
    torch.manual_seed(3)
    hidden, vocab, n = 16, 100, 50
    decoder = torch.nn.Linear(hidden, vocab)
    with torch.no_grad():
        decoder.weight[50] = decoder.weight[20]
        decoder.bias[50] = decoder.bias[20]
    states = torch.randn(n, hidden)
    targets = torch.full((n,), 50)
    head, got, want = scored(decoder, states, targets, 3, on_device)
    assert_float32(head, got, want)
    _, rank, _ = float64_reference(decoder, states, targets, 3)
    assert torch.equal(got[2], rank)


@PATHS
def test_a_few_near_tokens_are_settled_one_by_one_without_recomputing(on_device):
    torch.manual_seed(1)
    hidden, vocab = 16, 300
    decoder = torch.nn.Linear(hidden, vocab)
    with torch.no_grad():
        decoder.bias.zero_()
        decoder.bias[:4] = torch.tensor([60.0, 45.0, 30.0, 15.0])
    states = torch.randn(400, hidden)
    head, got, want = scored(decoder, states, torch.randint(4, vocab, (400,)), 4, on_device)
    assert_float32(head, got, want)
    assert head.stats.settled > 100 and head.stats.recomputed < head.stats.rows


@pytest.mark.parametrize("mode", ["unmasked", "masked"])
def test_the_probe_on_the_device_path_gives_the_float32_tables(monkeypatch, mode):
    """The demo model's probe with the certified head's torch path (a GPU's), on the CPU: the float32 tables."""
    from analysis.core.inputs import TextInputs
    from analysis.probe import certified
    from analysis.probe.reconstruction import ProbeConfig, probe
    from models.loading import ModelSpec, load_model
    from tests.unit.core.test_precision import SENTENCES, check_against_float32

    monkeypatch.setenv("LAYERLENS_BF16_UNITS", "1")
    real = certified.CertifiedHead.__init__

    def device_path(self, *args):
        real(self, *args)
        self.on_device = True
    monkeypatch.setattr(certified.CertifiedHead, "__init__", device_path)
    loaded = load_model(ModelSpec("demo", device="cpu"))
    inputs = TextInputs(tuple(SENTENCES * 3))
    plain = probe(loaded, inputs, ProbeConfig(mode=mode, precision="float32"))
    exact = probe(loaded, inputs, ProbeConfig(mode=mode, precision="certified"))
    assert exact.precision["head_product"] == "bfloat16, certified"
    info = exact.precision
    assert 0 < info["recomputed"] < info["rows"]
    # per hidden state: the rows scored and recomputed there, and the share certified, in the state order
    assert len(info["rows_per_state"]) == loaded.num_layers + 1 and sum(info["rows_per_state"]) == info["rows"]
    assert sum(info["recomputed_per_state"]) == info["recomputed"]
    assert info["certified_share_per_state"] == [round(1 - r / n, 6) for r, n in
                                                 zip(info["recomputed_per_state"], info["rows_per_state"], strict=True)]
    check_against_float32(exact, plain)
