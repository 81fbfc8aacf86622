import pytest
import torch

from analysis.activations import bucket_indices, encode, halving_on_oom, make_batch, max_input_length
from analysis.inputs import TextInputs
from models.loading import ModelSpec, load_model


def test_halving_on_oom_splits_until_it_fits():
    seen = []

    def run(idx):
        if len(idx) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory")
        seen.append(list(idx))
        return len(idx)

    assert sum(halving_on_oom(run, list(range(7)))) == 7
    assert [i for part in seen for i in part] == list(range(7)) and max(map(len, seen)) <= 2


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
