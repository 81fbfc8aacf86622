"""Host syncs in the probe's batch loop (issue 44, item 2; the CPU proxies the issue names), counted with
``torch.profiler`` and a spy:

- the scored positions are found on the host from the batch's host copy (numpy), so no ``aten::nonzero`` runs on
  the device's tensors (there was one per hidden state, then one per batch);
- the finiteness check is a device flag read with the results, not a ``bool()`` per forward pass;
- every result of a batch reaches the host through one :func:`analysis.core.transfer.to_host` call (one wait);
- the one ``item`` left per batch is transformers' own check of the attention mask (``masking_utils``: whether a
  padded batch may skip its mask), which a padded batch needs and an unpadded one skips;
- with the torch statistics (the GPU's), ``topk`` and ``logsumexp`` run once per forward pass and logits chunk,
  not once per hidden state.

The tables stay exact: the pinned outputs and the probe's own tests check them."""

from __future__ import annotations

from collections import Counter

import pytest
from torch.profiler import ProfilerActivity, profile

import analysis.probe.reconstruction as reconstruction
from analysis.core.inputs import TextInputs
from analysis.probe.reconstruction import ProbeConfig, probe
from analysis.probe.rowstats import row_stats_torch
from models.loading import ModelSpec, load_model

TEXTS = TextInputs(tuple(f"the film is good and fun {'very ' * (i % 7)}." for i in range(48)))
SAME_LENGTH = TextInputs(tuple(f"the film number {i % 10} is good ." for i in range(32)))


def counted_run(loaded, monkeypatch, inputs, config, torch_stats=False):
    forwards, copies, batches = [], [], []
    real_states, real_host, real_summary = (reconstruction.hidden_states, reconstruction.to_host,
                                            reconstruction.summarise)
    monkeypatch.setattr(reconstruction, "hidden_states", lambda *a, **k: forwards.append(1) or real_states(*a, **k))
    monkeypatch.setattr(reconstruction, "to_host", lambda *a, **k: copies.append(1) or real_host(*a, **k))
    monkeypatch.setattr(reconstruction, "summarise", lambda *a, **k: batches.append(1) or real_summary(*a, **k))
    if torch_stats:
        monkeypatch.setattr(reconstruction, "row_stats", row_stats_torch)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        probe(loaded, inputs, config)
    return Counter(e.name for e in prof.events()), len(forwards), len(copies), len(batches)


@pytest.mark.parametrize("half", ["output", "attention"])
@pytest.mark.parametrize("mode", ["unmasked", "masked"])
def test_one_copy_to_the_host_per_batch_and_no_sync_of_ours(tiny_dirs, monkeypatch, half, mode):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    calls, forwards, copies, batches = counted_run(loaded, monkeypatch, TEXTS,
                                                   ProbeConfig(mode=mode, batch_size=16, half=half))
    assert batches >= 3 and forwards >= batches and copies == batches, (forwards, copies, batches)
    assert calls["aten::nonzero"] == 0
    # transformers' mask check, once per forward of a padded batch; nothing else reads a device value
    assert calls["aten::_local_scalar_dense"] <= forwards, (calls["aten::_local_scalar_dense"], forwards)


def test_an_unpadded_batch_reads_nothing_from_the_device_before_its_one_copy(tiny_dirs, monkeypatch):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    lengths = {len(loaded.tokenizer(t)["input_ids"]) for t in SAME_LENGTH.texts}
    assert len(lengths) == 1
    calls, forwards, copies, batches = counted_run(loaded, monkeypatch, SAME_LENGTH, ProbeConfig(batch_size=16))
    assert copies == batches == 2
    # one per batch: transformers still asks whether the mask is all ones (it is: the mask is then dropped)
    assert calls["aten::_local_scalar_dense"] <= batches and calls["aten::nonzero"] == 0


def test_device_statistics_run_once_per_pass_not_per_state(tiny_dirs, monkeypatch):
    """Reading the attention halves doubles the states (4 -> 7 on the tiny model) and leaves the statistics' calls
    as they were: one ``topk`` per forward pass (one logits chunk per pass here)."""
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    counts = {}
    for half in ("output", "attention"):
        config = ProbeConfig(batch_size=16, logits_budget_bytes=1 << 30, half=half)
        calls, forwards, _, _ = counted_run(loaded, monkeypatch, TEXTS, config, torch_stats=True)
        counts[half] = (calls["aten::topk"], calls["aten::logsumexp"], forwards)
    assert counts["output"] == counts["attention"], counts
    topk, _, forwards = counts["output"]
    assert topk == forwards
