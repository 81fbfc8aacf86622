import numpy as np
import pandas as pd
import pytest
import torch

import analysis.core.activations as activations
from analysis.core.activations import (
    activation_bytes,
    bucket_indices,
    encode,
    halving_on_oom,
    hidden_states,
    make_batch,
    max_input_length,
)
from analysis.core.inputs import TextInputs
from analysis.core.vectors import extract
from analysis.probe.reconstruction import ProbeConfig, probe
from models.loading import ModelSpec, load_model

CPU_OOM = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 100000000000000 bytes. Error code 12 (Cannot allocate memory)")


def test_halving_on_oom_splits_until_it_fits():
    seen = []

    def run(idx):
        if len(idx) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory")
        seen.append(list(idx))
        return len(idx)

    assert sum(halving_on_oom(run, list(range(7)))) == 7
    assert [i for part in seen for i in part] == list(range(7)) and max(map(len, seen)) <= 2


def test_halving_also_catches_the_cpu_allocator_but_no_other_error():
    seen = []

    def run(idx):
        if len(idx) > 1:
            raise CPU_OOM
        seen.append(idx[0])
        return 1

    assert sum(halving_on_oom(run, list(range(5)))) == 5 and seen == list(range(5))

    def broken(idx):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        list(halving_on_oom(broken, [0, 1, 2]))


def test_halving_gives_up_on_a_single_text():
    def run(idx):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):
        list(halving_on_oom(run, [0]))


def test_buckets_cover_every_text_once_shortest_first(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    texts = TextInputs(("a b c d e f", "a", "a b c", "a b", "a b c d"))
    enc = encode(loaded.tokenizer, texts, 64)
    buckets = list(bucket_indices(enc, 2))
    assert sorted(i for b in buckets for i in b) == list(range(5))
    lengths = [len(enc.input_ids[i]) for b in buckets for i in b]
    assert lengths == sorted(lengths)
    batch = make_batch(enc, buckets[-1], loaded.tokenizer.pad_token_id)
    assert batch.input_ids.shape == (1, 8) and batch.attention_mask.sum() == 8


def test_max_input_length_respects_position_embeddings(tiny_dirs):
    assert max_input_length(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))) == 64
    assert max_input_length(load_model(ModelSpec(str(tiny_dirs["roberta"]), device="cpu"))) == 64 - 2


TEXTS = tuple(" ".join(["the film is good"] * n) + " ." for n in (1, 9, 2, 12, 3, 1, 7, 4, 10, 5, 2, 8))


def test_activation_estimate_covers_the_hidden_states_a_forward_returns(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    enc = encode(loaded.tokenizer, TextInputs(TEXTS[3:4]), 64)
    batch = make_batch(enc, [0], loaded.tokenizer.pad_token_id)
    with torch.inference_mode():
        kept = sum(s.numel() * s.element_size() for s in hidden_states(loaded, batch))
    width = batch.input_ids.shape[1]
    assert activation_bytes(loaded, width, copies=1) >= kept
    assert activation_bytes(loaded, width) > activation_bytes(loaded, width, copies=1)
    assert activation_bytes(loaded, 2 * width) > 2 * activation_bytes(loaded, width)  # attention is quadratic


def test_a_memory_budget_shrinks_the_batches_of_long_texts(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    enc = encode(loaded.tokenizer, TextInputs(TEXTS), 64)
    longest = max(map(len, enc.input_ids))
    budget = 3 * activation_bytes(loaded, longest)
    buckets = list(bucket_indices(enc, 8, loaded, budget))
    assert sorted(i for b in buckets for i in b) == list(range(len(TEXTS)))
    for b in buckets:
        width = max(len(enc.input_ids[i]) for i in b)
        assert len(b) <= 8 and (len(b) == 1 or len(b) * activation_bytes(loaded, width) <= budget)
    assert len(buckets[-1]) <= 3 < len(buckets[0])  # short texts still share big batches
    assert [len(b) for b in bucket_indices(enc, 8, loaded, budget=1)] == [1] * len(TEXTS)  # one text always runs


def test_little_free_memory_changes_the_batches_not_the_results(tiny_dirs, monkeypatch):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    inputs = TextInputs(TEXTS)
    config = ProbeConfig(batch_size=16)
    roomy_calls, tight_calls = [], []
    roomy = probe(loaded, inputs, config, progress=lambda d, n: roomy_calls.append(d))
    roomy_vectors = extract(loaded, inputs, "mean", batch_size=16)
    one_text = activation_bytes(loaded, 64)
    monkeypatch.setattr(activations, "free_bytes", lambda device: 4 * one_text)  # room for about 2 long texts
    tight = probe(loaded, inputs, config, progress=lambda d, n: tight_calls.append(d))
    assert len(roomy_calls) == 1 and len(tight_calls) > 2
    pd.testing.assert_frame_equal(roomy.layers, tight.layers)
    pd.testing.assert_frame_equal(roomy.decoded, tight.decoded)
    np.testing.assert_allclose(extract(loaded, inputs, "mean", batch_size=16), roomy_vectors, rtol=1e-5, atol=1e-6)


def test_on_an_accelerator_batches_hold_a_token_budget_of_texts(tiny_dirs, monkeypatch):
    """Issue 44 item 1: on a GPU short texts make batches of ACCELERATOR_TOKENS padded tokens (more than
    batch_size texts), the memory cap still holds; on the CPU batch_size stays the count."""
    import dataclasses

    from analysis.core import activations

    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    texts = TextInputs(tuple(f"text {'word ' * (i % 9)}" for i in range(400)))
    enc = encode(loaded.tokenizer, texts, 64)
    monkeypatch.setattr(activations, "ACCELERATOR_TOKENS", 200)
    cpu = list(bucket_indices(enc, 8, loaded, budget=10**12))
    assert max(map(len, cpu)) == 8
    on_gpu = dataclasses.replace(loaded, spec=dataclasses.replace(loaded.spec, device="cuda"))
    gpu = list(bucket_indices(enc, 8, on_gpu, budget=10**12))
    assert sorted(i for b in gpu for i in b) == list(range(len(texts)))
    for b in gpu:
        width = max(len(enc.input_ids[i]) for i in b)
        assert len(b) <= max(8, 200 // width)
    assert max(map(len, gpu)) > 8 and len(gpu) < len(cpu)
    width = max(map(len, enc.input_ids))
    capped = list(bucket_indices(enc, 8, on_gpu, budget=4 * activation_bytes(loaded, width)))
    assert max(map(len, capped)) > 4 and all(len(b) <= 4 for b in capped[-3:])  # memory still caps long texts
