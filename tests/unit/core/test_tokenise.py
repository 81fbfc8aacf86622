"""Every path tokenises through one function (analysis.core.activations.encode_truncated), which ignores the padding
and truncation a checkpoint's tokenizer.json stores (sentence-transformers' fixed padding to 128) and applies
LayerLens's own: the probe, the atlas, the tuned lens and fine-tuning see the same ids."""

import pytest

from analysis.core.activations import encode, encode_truncated
from analysis.core.inputs import TextInputs
from analysis.training.taskdata import prepare
from models.loading import ModelSpec, load_encoder, load_model
from tests.support.models import save_tiny, tiny_tokenizer

TEXTS = ("the film is good .", "a very dull movie ! it was not fun and i hated it , very bad", "fun")
PAIRS = ("good", "the movie was very bad and dull , not fun", "i liked it")


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory):
    return save_tiny("bert", tmp_path_factory.mktemp("plain") / "bert", copy_steps=0)


@pytest.fixture(scope="module")
def padded_dir(tmp_path_factory):
    """A tiny BERT with a tokenizer saved as sentence-transformers saves one: fixed padding and truncation."""
    out = save_tiny("bert", tmp_path_factory.mktemp("padded") / "bert", copy_steps=0)
    tok = tiny_tokenizer()
    tok.backend_tokenizer.enable_padding(length=32, pad_id=0, pad_token="[PAD]")
    tok.backend_tokenizer.enable_truncation(32)
    tok.save_pretrained(out)
    return out


def test_the_saved_tokenizer_really_stores_fixed_padding(padded_dir):
    tok = load_model(ModelSpec(str(padded_dir), device="cpu")).tokenizer
    assert tok.backend_tokenizer.padding["length"] == 32 and tok.backend_tokenizer.truncation["max_length"] == 32


@pytest.mark.parametrize("strategy", ["head", "tail", "head+tail"])
@pytest.mark.parametrize("max_length", [8, 64])
@pytest.mark.parametrize("pairs", [None, PAIRS])
def test_fine_tuning_ids_ignore_the_stored_padding(padded_dir, strategy, max_length, pairs):
    plain = tiny_tokenizer()
    expected = encode_truncated(plain, TEXTS, pairs, max_length, strategy)
    _, tokenizer = load_encoder(ModelSpec(str(padded_dir), device="cpu"))  # what run_finetune tokenises with
    assert encode_truncated(tokenizer, TEXTS, pairs, max_length, strategy) == expected
    inputs = TextInputs(TEXTS, pairs, labels=("a", "b", "a"))
    data = prepare(tokenizer, inputs, {"a": 0, "b": 1}, max_length, strategy)
    assert (data.input_ids, data.token_type_ids, data.truncated) == expected
    assert all(0 not in ids for ids in data.input_ids)  # no [PAD] inside a text: the mask is the text
    if max_length == 64:
        assert data.truncated == 0


@pytest.mark.parametrize("max_length", [8, 64])
@pytest.mark.parametrize("pairs", [None, PAIRS])
def test_probe_and_lens_ids_ignore_the_stored_padding(padded_dir, plain_dir, max_length, pairs):
    from analysis.probe.lens_training import Batches

    inputs = TextInputs(TEXTS, pairs)
    expected = encode(tiny_tokenizer(), inputs, max_length)
    loaded = load_model(ModelSpec(str(padded_dir), device="cpu"))
    got = encode(loaded.tokenizer, inputs, max_length)
    assert (got.input_ids, got.token_type_ids, got.truncated) == (expected.input_ids, expected.token_type_ids,
                                                                  expected.truncated)
    if pairs is None:
        lens_ids = Batches(loaded, list(TEXTS), 2, max_length, seed=0).encoded.input_ids
        assert lens_ids == encode(load_model(ModelSpec(str(plain_dir), device="cpu")).tokenizer, inputs,
                                  max_length).input_ids


def test_probe_and_fine_tuning_tokenise_alike(padded_dir):
    """The probe's ids are fine-tuning's with the head strategy (texts and pairs)."""
    loaded = load_model(ModelSpec(str(padded_dir), device="cpu"))
    for pairs in (None, PAIRS):
        probe_ids = encode(loaded.tokenizer, TextInputs(TEXTS, pairs), 8)
        ids, types, cut = encode_truncated(loaded.tokenizer, TEXTS, pairs, 8, "head")
        assert probe_ids.input_ids == ids and probe_ids.truncated == cut


def test_the_shared_tokenizer_is_not_changed_and_order_does_not_matter(padded_dir):
    """The cached tokenizer is shared: encoding never changes its stored settings, and what another caller did to
    them (transformers' __call__ with padding=True sets the backend's padding) never changes our ids."""
    tok = load_model(ModelSpec(str(padded_dir), device="cpu")).tokenizer
    before = encode_truncated(tok, TEXTS, None, 64, "head")
    encode(tok, TextInputs(TEXTS, PAIRS), 8)
    assert tok.backend_tokenizer.padding["length"] == 32 and tok.backend_tokenizer.truncation["max_length"] == 32
    tok(list(TEXTS), padding="max_length", max_length=40)  # another caller leaves padding set on the backend
    assert encode_truncated(tok, TEXTS, None, 64, "head") == before
