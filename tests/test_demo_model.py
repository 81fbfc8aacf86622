"""The committed demo model: loads offline with plain transformers, stays small, meets its quality bar."""

import json
import random
from pathlib import Path

import pytest
from transformers import AutoModelForMaskedLM, AutoTokenizer

from models.loading import DEMO_DIR, ModelSpec, load_model
from models.pretrain import evaluate, pack, read_documents

VALID = Path(__file__).resolve().parents[2] / "shared" / "data" / "english_corpus" / "valid.txt.gz"


def test_demo_loads_offline_with_plain_transformers():
    model = AutoModelForMaskedLM.from_pretrained(DEMO_DIR)
    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR)
    assert model.config.model_type == "bert"
    assert tokenizer.mask_token == "[MASK]"


def test_demo_is_what_the_loader_gives_by_default():
    loaded = load_model(ModelSpec(device="cpu"))
    assert loaded.spec.name == "demo" and loaded.anatomy.family == "bert"


def test_demo_is_at_most_20_mb():
    total = sum(f.stat().st_size for f in DEMO_DIR.iterdir() if f.is_file())
    assert total <= 20 * 2**20


@pytest.mark.skipif(not VALID.is_file(), reason="needs ../shared/data")
def test_demo_meets_its_quality_bar_on_held_out_text():
    """The model card's bar, re-measured on the first 200 held-out chunks: masked top-1 >= 0.20 and the last
    layer reconstructs >= 95% of unmasked input tokens."""
    info = json.loads((DEMO_DIR / "training_info.json").read_text())
    model = AutoModelForMaskedLM.from_pretrained(DEMO_DIR).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR)
    docs = read_documents(VALID)
    chunks = pack(docs, tokenizer, info["config"]["seq_len"], 0.0, random.Random(0))[:200]
    metrics = evaluate(model, tokenizer, chunks)
    assert metrics["masked_top1"] >= 0.20
    assert metrics["reconstruction_top1"] >= 0.95
