import gzip
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer, DataCollatorForLanguageModeling

from models.loading import ModelSpec, load_model
from models.pretrain import (
    PRESETS,
    PretrainConfig,
    evaluate,
    masked_lm_loss,
    pack,
    read_documents,
    train,
    train_tokenizer,
)
from models.pretrain import main as pretrain_main
from tests.support.data import FIXTURES

CORPUS = FIXTURES / "english_valid_400.txt.gz"  # the first 400 lines of the held-out corpus


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    """The first 400 lines of the held-out corpus, with its document breaks, as a .gz file."""
    with gzip.open(CORPUS, "rt") as f:
        lines = [next(f) for _ in range(400)]
    path = tmp_path_factory.mktemp("corpus") / "small.txt.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(lines)
    return path


@pytest.fixture(scope="module")
def trained(small_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_a")
    info = train(PRESETS["tiny"], small_corpus, out, valid=small_corpus, progress=False)
    return out, info


def test_read_documents_splits_on_empty_lines(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a b\nc\n\n\nd e\n")
    assert read_documents(path) == [["a b", "c"], ["d e"]]


def test_pack_keeps_every_token_in_order_and_respects_the_length(small_corpus):
    docs = read_documents(small_corpus)
    tok = train_tokenizer([line for d in docs for line in d], 300)
    chunks = pack(docs, tok, seq_len=16, short_seq_prob=0.3, rng=random.Random(0))
    assert all(len(c) <= 16 and c[0] == tok.cls_token_id and c[-1] == tok.sep_token_id for c in chunks)
    flat = [i for c in chunks for i in c[1:-1]]
    expected = [i for d in docs for ids in tok(d, add_special_tokens=False)["input_ids"] for i in ids]
    assert flat == expected
    assert min(len(c) for c in chunks) < 10  # short chunks exist, so [SEP] is seen at many positions


def test_masked_only_loss_equals_the_full_models_loss(trained):
    out, _ = trained
    model = AutoModelForMaskedLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, seed=3)
    batch = collator([{"input_ids": tok("the president said that the film was good .")["input_ids"]}] * 4)
    with torch.no_grad():
        ours, _, _ = masked_lm_loss(model, batch)
        full = model(**batch).loss
    torch.testing.assert_close(ours, full)


def test_evaluate_matches_a_plain_loop(trained):
    out, _ = trained
    model = AutoModelForMaskedLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    texts = ["the film was good .", "my fellow citizens , the state of the union is strong ."]
    rows = [tok(t)["input_ids"] for t in texts]
    metrics = evaluate(model, tok, rows, batch_size=1)
    hit = n = 0
    with torch.no_grad():
        for ids in rows:
            pred = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
            for p, t in zip(pred[1:-1], ids[1:-1], strict=True):
                hit, n = hit + (p == t), n + 1
    assert metrics["reconstruction_tokens"] == n
    assert metrics["reconstruction_top1"] == pytest.approx(hit / n)


def test_training_writes_a_loadable_model_and_is_deterministic(trained, small_corpus, tmp_path):
    out, info = trained
    assert {"masked_top1", "reconstruction_top1", "train_seconds"} <= set(info["metrics"])
    again = train(PRESETS["tiny"], small_corpus, tmp_path, progress=False, tokenizer_dir=out)
    assert again["tokenizer"] == "reused"
    assert again["metrics"]["train_loss_last"] == info["metrics"]["train_loss_last"]
    a = AutoModelForMaskedLM.from_pretrained(out).state_dict()
    b = AutoModelForMaskedLM.from_pretrained(tmp_path).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    loaded = load_model(ModelSpec(str(out), device="cpu"))
    assert loaded.anatomy.num_layers == PRESETS["tiny"].num_layers


def test_cli_rejects_a_missing_corpus(tmp_path, capsys):
    assert pretrain_main(["--corpus", str(tmp_path / "none.txt"), "--out", str(tmp_path / "o")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_presets_are_validated_schemas(small_corpus, tmp_path, capsys):
    cfg = PretrainConfig.model_validate({**PRESETS["small"].model_dump(), "steps": 5})
    assert cfg.model_dump()["steps"] == 5 and PRESETS["small"].steps != 5
    assert list(cfg.model_dump())[:3] == ["vocab_size", "hidden_size", "num_layers"]  # the model card's order
    assert pretrain_main(["--corpus", str(small_corpus), "--out", str(tmp_path / "o"), "--steps", "0"]) == 2
    assert "error: --steps: input should be greater than or equal to 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_tokenizer_trainings_agree_on_almost_every_token(small_corpus):
    """tokenizers breaks frequency ties in hash order; after renumbering only rare tied subwords may differ."""
    lines = [line for d in read_documents(small_corpus) for line in d]
    a, b = train_tokenizer(lines, 300).get_vocab(), train_tokenizer(lines, 300).get_vocab()
    assert all(a[t] == i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    assert len(set(a) ^ set(b)) <= 0.02 * len(a)
