"""Token vectors (analysis.tokens.corpus, analysis.tokens.vectors): one metadata row per counted token whose word
is the tokenizer's (WordPiece, SentencePiece, byte-level BPE; plain text and CoNLL-U, with UPOS/DEPREL), vectors
equal to a plain forward pass (float16), cached by model/data/layers, shards whole or absent under SIGKILL and a
resumed extraction equal to an uninterrupted one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel

from analysis.core.activations import max_input_length
from analysis.core.inputs import InputError, TextInputs
from analysis.core.store import ArrayStore
from analysis.core.treebank import read_conllu
from analysis.tokens.corpus import from_texts, from_treebank, read_corpus
from analysis.tokens.vectors import TokenVectors, extract
from models.loading import ModelSpec, load_model
from tests.support.data import FIXTURES
from tests.unit.structure.test_structure_words import CORPUS, families, reference_tokenizer  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[3]
WORDS = ["the", "a", "film", "is", "good", "bad", "not", "very", "movie", "and", "it", "was", "i", "liked", "fun"]


def texts(n=120, seed=0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(2, 14))) + rng.choice([" .", "!", " films"]) for _ in range(n)]


@pytest.fixture(scope="module")
def bert(tiny_dirs):
    return load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))


@pytest.mark.parametrize("family", ["wordpiece", "sentencepiece", "bpe"])
def test_plain_text_words_are_the_tokenizers_words(families, family):  # noqa: F811
    loaded = load_model(ModelSpec(str(families[family]), device="cpu"))
    sample = CORPUS[:3] + ["Unbelievable films, naïve isn't it?"]
    corpus = from_texts(loaded.tokenizer, TextInputs(tuple(sample)), 1000)
    ref = AutoTokenizer_for(families[family])
    special = set(ref.all_special_ids)
    rows = corpus.tokens
    for t, text in enumerate(sample):
        enc = ref(text, return_offsets_mapping=True)
        assert corpus.encoded.input_ids[t] == enc["input_ids"]
        counted = [p for p, i in enumerate(enc["input_ids"]) if i not in special]
        mine = rows[rows["text_id"] == t]
        assert mine["position"].tolist() == counted
        assert mine["token"].tolist() == ref.convert_ids_to_tokens([enc["input_ids"][p] for p in counted])
        wids = enc.word_ids()
        spans = {}
        for p, w in enumerate(wids):
            if w is not None:
                a, b = enc["offset_mapping"][p]
                lo, hi = spans.get(w, (a, b))
                spans[w] = (min(lo, a), max(hi, b))
        assert mine["word"].tolist() == [text[slice(*spans[wids[p]])] for p in counted]
        firsts = [wids[p] != (wids[p - 1] if p else None) for p in counted]
        assert mine["first_subword"].tolist() == firsts
    assert corpus.counts.sum() == len(rows) and rows["row"].tolist() == list(range(len(rows)))


def AutoTokenizer_for(directory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def test_wordpiece_continuations_carry_their_whole_word(bert):
    corpus = from_texts(bert.tokenizer, TextInputs(("the films was fun",)), 64)
    rows = corpus.tokens
    assert rows["token"].tolist() == ["the", "film", "##s", "was", "fun"]
    assert rows["word"].tolist() == ["the", "films", "films", "was", "fun"]
    assert rows["word_index"].tolist() == [0, 1, 1, 2, 3]
    assert rows["first_subword"].tolist() == [True, True, False, True, True]
    assert rows["position"].tolist() == [1, 2, 3, 4, 5]  # [CLS] is position 0 and not counted
    spelled = [("the films was fun")[s:e] for s, e in zip(rows["start"], rows["end"], strict=True)]
    assert spelled == ["the", "film", "s", "was", "fun"]


@pytest.mark.parametrize("family", ["wordpiece", "sentencepiece", "bpe"])
def test_conllu_tokens_carry_their_words_upos_and_deprel(families, family):  # noqa: F811
    loaded = load_model(ModelSpec(str(families[family]), device="cpu"))
    bank = read_conllu(FIXTURES / "ud_tiny_train.conllu")
    corpus = from_treebank(loaded.tokenizer, bank, 1000)
    ref = reference_tokenizer(families[family])
    special = set(ref.all_special_ids)
    for t, sentence in enumerate(bank.sentences):
        enc = ref(list(sentence.words), is_split_into_words=True)
        wids = enc.word_ids()
        counted = [p for p, i in enumerate(enc["input_ids"]) if i not in special]
        mine = corpus.tokens[corpus.tokens["text_id"] == t]
        assert mine["position"].tolist() == counted
        assert mine["word"].tolist() == [sentence.words[wids[p]] for p in counted]
        assert mine["upos"].tolist() == [sentence.upos[wids[p]] for p in counted]
        assert mine["deprel"].tolist() == [sentence.deprels[wids[p]] for p in counted]
        text = corpus.texts.loc[t, "text"]
        assert [text[s:e] for s, e in zip(mine["start"], mine["end"], strict=True)] == mine["word"].tolist()
    assert corpus.texts["sent_id"].tolist() == [s.sent_id for s in bank.sentences]


def plain_vectors(directory, sample, layers):
    tok, model = AutoTokenizer_for(directory), AutoModel.from_pretrained(directory).eval()
    out = []
    for text in sample:
        enc = tok(text, return_tensors="pt", truncation=True, max_length=64)
        with torch.no_grad():
            states = torch.stack(model(**enc, output_hidden_states=True).hidden_states)[layers, 0]
        keep = ~torch.isin(enc["input_ids"][0], torch.tensor(tok.all_special_ids))
        out.append(states[:, keep].numpy())
    return np.concatenate(out, 1)


def test_vectors_equal_a_plain_forward_pass_and_are_cached(bert, tiny_dirs, tmp_path):
    sample = texts(40)
    corpus = from_texts(bert.tokenizer, TextInputs(tuple(sample)), max_input_length(bert))
    store = ArrayStore(tmp_path)
    written = []
    tv = extract(bert, corpus, [0, 2, 3], batch_size=7, shard_rows=80, store=store, after_shard=written.append)
    assert tv.layers == [0, 2, 3] and tv.rows == corpus.n_rows and len(tv.manifest["shards"]) > 2
    assert written == list(range(len(tv.manifest["shards"])))
    want = plain_vectors(tiny_dirs["bert"], sample, [0, 2, 3])
    for slot, layer in enumerate([0, 2, 3]):
        got = np.concatenate([b for _, b in tv.layer_blocks(layer)])
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), want[slot], rtol=2e-3, atol=2e-3)
    assert isinstance(tv.shard(0), np.memmap)
    again = []
    assert extract(bert, corpus, [0, 2, 3], shard_rows=80, store=store, after_shard=again.append).directory == \
        tv.directory and again == []  # cached: nothing computed
    other = extract(bert, corpus, [3], batch_size=7, shard_rows=80, store=store)
    assert other.directory != tv.directory  # layers are part of the key
    (tv.directory / tv.manifest["shards"][1]["file"]).unlink()
    with pytest.raises(InputError, match="incomplete"):
        TokenVectors.open(tv.directory)
    resumed = []
    extract(bert, corpus, [0, 2, 3], batch_size=7, shard_rows=80, store=store, after_shard=resumed.append)
    assert resumed == [1]  # only the missing shard is computed again
    np.testing.assert_array_equal(np.concatenate([b for _, b in TokenVectors.open(tv.directory).layer_blocks(3)]),
                                  np.concatenate([b for _, b in other.layer_blocks(3)]))


def test_read_corpus_reads_text_files_and_treebanks(bert, tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("the film\n\nit was fun\n")
    corpus = read_corpus(bert.tokenizer, path, 64)
    assert corpus.texts["text"].tolist() == ["the film", "it was fun"] and corpus.n_rows == 5
    bank = read_corpus(bert.tokenizer, FIXTURES / "ud_tiny_train.conllu", 64)
    assert "upos" in bank.tokens and bank.source["kind"] == "conllu"
    with pytest.raises(InputError):
        read_corpus(bert.tokenizer, tmp_path / "missing.txt", 64)


KILLED = textwrap.dedent("""
    import os, signal, sys
    from analysis.core.inputs import TextInputs
    from analysis.core.store import ArrayStore
    from analysis.tokens.corpus import from_texts
    from analysis.tokens.vectors import extract
    from models.loading import ModelSpec, load_model
    from tests.unit.tokens.test_tokens_vectors import texts
    loaded = load_model(ModelSpec(sys.argv[1], device="cpu"))
    corpus = from_texts(loaded.tokenizer, TextInputs(tuple(texts(200))), 64)
    kill_at = int(sys.argv[3])
    def progress(stage, done, total):
        if done >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    extract(loaded, corpus, batch_size=4, shard_rows=300, store=ArrayStore(sys.argv[2]), progress=progress)
""")


@pytest.mark.slow
def test_a_killed_extraction_leaves_whole_shards_and_resumes_to_the_same_vectors(bert, tiny_dirs, tmp_path):
    """SIGKILL in the middle of the third shard: the first two are whole, the third absent (its temporary file
    left behind and removed by the next run), and the resumed extraction equals an uninterrupted one."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run([sys.executable, "-c", KILLED, str(tiny_dirs["bert"]), str(tmp_path / "a"), "700"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    corpus = from_texts(bert.tokenizer, TextInputs(tuple(texts(200))), 64)
    (directory,) = (tmp_path / "a" / "token_vectors").iterdir()
    manifest_shards = __import__("json").loads((directory / "manifest.json").read_text())["shards"]
    present = sorted(p.name for p in directory.glob("shard_*.npy"))
    assert present == [s["file"] for s in manifest_shards[:2]]
    assert list(directory.glob(".shard_00002.npy.*.tmp"))  # the half-written shard never took the name
    reference = extract(bert, corpus, batch_size=4, shard_rows=300, store=ArrayStore(tmp_path / "b"))
    for name in present:  # whole: the bytes of an uninterrupted run
        np.testing.assert_array_equal(np.load(directory / name), np.load(reference.directory / name))
    resumed = []
    tv = extract(bert, corpus, batch_size=4, shard_rows=300, store=ArrayStore(tmp_path / "a"),
                 after_shard=resumed.append)
    assert resumed == list(range(2, len(manifest_shards)))
    assert not list(directory.glob("*.tmp"))
    for layer in tv.layers:
        np.testing.assert_array_equal(np.concatenate([b for _, b in tv.layer_blocks(layer)]),
                                      np.concatenate([b for _, b in reference.layer_blocks(layer)]))
