"""The committed demo model: loads offline with plain transformers, stays small, and its model card is true."""

import json
import os
import random

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from models.loading import DEMO_DIR, ModelSpec, load_model
from models.pretrain import evaluate, pack, read_documents
from tests.support.data import shared_file

pytestmark = pytest.mark.slow  # every test here takes more than ~5 s

INFO = json.loads((DEMO_DIR / "training_info.json").read_text())


def test_demo_loads_offline_with_plain_transformers():
    model = AutoModelForMaskedLM.from_pretrained(DEMO_DIR)
    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR)
    assert model.config.model_type == "bert" and tokenizer.mask_token == "[MASK]"
    assert tokenizer.model_max_length == model.config.max_position_embeddings


def test_demo_is_what_the_loader_gives_by_default():
    loaded = load_model(ModelSpec(device="cpu"))
    assert loaded.spec.name == "demo" and loaded.anatomy.family == "bert"


def test_demo_is_at_most_20_mb():
    total = sum(f.stat().st_size for f in DEMO_DIR.iterdir() if f.is_file())
    assert total <= 20 * 10**6


@pytest.fixture(scope="module")
def held_out_metrics():
    model = AutoModelForMaskedLM.from_pretrained(DEMO_DIR).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR)
    valid = shared_file("english_corpus/valid.txt.gz")  # the whole held-out file: skipped without it, not in CI
    chunks = pack(read_documents(valid), tokenizer, INFO["config"]["seq_len"], 0.0, random.Random(0))
    # every core, even in a pytest-xdist worker given one: the longest test of the suite, and compute only (238 s on
    # one thread in a two-process run, 2026-11-26)
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        return evaluate(model, tokenizer, chunks)
    finally:
        torch.set_num_threads(threads)


def test_model_card_numbers_are_reproduced(held_out_metrics):
    """Re-measure on the whole held-out file: the numbers in training_info.json (and the card) are these."""
    for key in ["masked_top1", "reconstruction_top1", "masked_tokens", "reconstruction_tokens"]:
        assert held_out_metrics[key] == pytest.approx(INFO["metrics"][key], abs=1e-6), key
    card = (DEMO_DIR / "README.md").read_text()
    assert f"{INFO['metrics']['masked_top1']:.3f}" in card and f"{INFO['metrics']['reconstruction_top1']:.3f}" in card


@pytest.mark.xfail(INFO["metrics"]["masked_top1"] < 0.20, strict=True,
                   reason="issue 2 is open: the committed demo model does not reach masked top-1 0.20 yet")
def test_demo_meets_its_quality_bar(held_out_metrics):
    """Issue 2's bar: masked-token top-1 >= 0.20 and the last layer reconstructs >= 95% of input tokens."""
    assert held_out_metrics["reconstruction_top1"] >= 0.95
    assert held_out_metrics["masked_top1"] >= 0.20
