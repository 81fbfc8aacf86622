"""Tiny randomly initialised models built from configs (no downloads anywhere in the tests), a tiny sequence
classifier and a series of checkpoints made by further pre-training."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import (
    AlbertConfig,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    BertConfig,
    BertTokenizerFast,
    DistilBertConfig,
    ElectraConfig,
    RobertaConfig,
    XLMRobertaConfig,
)

from analysis.core.inputs import read_file
from tests.support.data import DEMO_DATA

VOCAB = 99
COMMON = dict(vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0)


TINY_CONFIGS = {
    "bert": BertConfig(hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32, **COMMON),
    "albert": AlbertConfig(embedding_size=8, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                           intermediate_size=32, **COMMON),
    "roberta": RobertaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                             **{**COMMON, "pad_token_id": 1}),
    "xlm-roberta": XLMRobertaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=32, **{**COMMON, "pad_token_id": 1}),
    "distilbert": DistilBertConfig(dim=16, n_layers=2, n_heads=2, hidden_dim=32, **COMMON),
    "electra": ElectraConfig(embedding_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=32, **COMMON),
}


def tiny_tokenizer() -> BertTokenizerFast:
    """A WordPiece tokenizer over the first ``VOCAB`` ids of a tiny vocabulary (specials + common words)."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "film", "is", "good", "bad", "not", "very",
             "movie", "and", "it", "was", "i", "liked", "hated", ".", ",", "!", "?", "##s", "##ing", "fun", "dull"]
    words += [f"w{i}" for i in range(VOCAB - len(words))]
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True)


def save_tiny(family: str, directory: Path, seed: int = 0, copy_steps: int = 40) -> Path:
    """Save a tiny ``family`` masked LM and a tokenizer as a ``save_pretrained`` directory.

    The weights are random, then nudged for ``copy_steps`` Adam steps towards reconstructing their input, so
    that layer accuracies are neither all 0 nor all 1 and the probe's tests have something to compare.
    """
    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(TINY_CONFIGS[family])
    if copy_steps:
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(copy_steps):
            ids = torch.randint(5, VOCAB, (8, 12))
            logits = model(input_ids=ids).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
    model.eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def save_classifier(folder, names=("neg", "pos")):
    """A tiny random BertForSequenceClassification with classes ``names`` and the tiny tokenizer, saved."""
    torch.manual_seed(0)
    config = copy.deepcopy(TINY_CONFIGS["bert"])
    config.num_labels = len(names)
    config.id2label, config.label2id = dict(enumerate(names)), {n: i for i, n in enumerate(names)}
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def make_series(model: Path, out: Path, steps: int = 2) -> Path:
    """``steps`` of further pre-training of ``model`` saved at every step: ``out/steps/step-0..steps``."""
    from analysis.training.finetune import further_pretrain
    from models.spec import ModelSpec

    texts = read_file(DEMO_DATA).texts[:32]
    further_pretrain(ModelSpec(str(model), device="cpu"), texts, steps, out, batch_size=8, max_length=24,
                     save_every=1)
    return out / "steps"


