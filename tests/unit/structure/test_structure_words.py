"""Word vectors from subwords (analysis.structure.words, activations.encode_words): the alignment equals
transformers' ``is_split_into_words`` word ids for WordPiece, SentencePiece (ALBERT) and byte-level BPE (RoBERTa,
read with add_prefix_space=True), and the vectors equal a plain forward pass, first subword or mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AlbertConfig, AutoModel, AutoModelForMaskedLM, AutoTokenizer, RobertaConfig

from analysis.core.activations import encode_words
from analysis.core.store import ArrayStore
from analysis.core.treebank import read_conllu
from analysis.structure.words import extract
from models.loading import ModelSpec, load_model
from tests.support.data import FIXTURES

CORPUS = ["the film is good .", "unbelievable things happen , don't they ?", "i liked the movie and it was fun"] * 20
SENTENCES = [list(s.words) for s in read_conllu(FIXTURES / "ud_tiny_train.conllu").sentences[:6]]
SENTENCES.append(["Unbelievable", "filmmaking", ",", "naïve", "isn't", "it", "?"])


def _save(directory, tokenizer, config):
    torch.manual_seed(0)
    AutoModelForMaskedLM.from_config(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def families(tiny_dirs, tmp_path_factory) -> dict:
    """wordpiece: the tiny BERT; bpe: RoBERTa with a byte-level BPE (saved as roberta-base is: no prefix space);
    sentencepiece: ALBERT with a Unigram/Metaspace tokenizer."""
    root = tmp_path_factory.mktemp("structure_tokenizers")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>",
                            "<mask>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), add_prefix_space=False)
    roberta = transformers.RobertaTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                                                sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                                                pad_token="<pad>", mask_token="<mask>")
    uni = Tokenizer(models.Unigram())
    uni.pre_tokenizer = pre_tokenizers.Metaspace()
    uni.decoder = decoders.Metaspace()
    uni.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=90, special_tokens=["<pad>", "<unk>", "[CLS]",
                            "[SEP]", "[MASK]"], unk_token="<unk>"))
    uni.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    albert = transformers.AlbertTokenizerFast(tokenizer_object=uni, unk_token="<unk>", pad_token="<pad>",
                                              cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    small = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    return {"wordpiece": tiny_dirs["bert"],
            "bpe": _save(root / "bpe", roberta, RobertaConfig(vocab_size=len(roberta), max_position_embeddings=80,
                                                              pad_token_id=1, **small)),
            "sentencepiece": _save(root / "sp", albert, AlbertConfig(vocab_size=len(albert), embedding_size=8,
                                                                     max_position_embeddings=80, pad_token_id=0,
                                                                     **small))}


def reference_tokenizer(directory):
    """transformers' own tokenizer for pre-split words (RoBERTa's needs add_prefix_space=True)."""
    tok = AutoTokenizer.from_pretrained(directory)
    if "roberta" in type(tok).__name__.lower():
        tok = AutoTokenizer.from_pretrained(directory, add_prefix_space=True)
    return tok


@pytest.mark.parametrize("family", ["wordpiece", "sentencepiece", "bpe"])
def test_alignment_equals_transformers_split_into_words(families, family):
    loaded = load_model(ModelSpec(str(families[family]), device="cpu"))
    ours = encode_words(loaded.tokenizer, SENTENCES, 1000)
    ref = reference_tokenizer(families[family])
    for s, words in enumerate(SENTENCES):
        enc = ref(words, is_split_into_words=True)
        assert ours.input_ids[s] == enc["input_ids"] and ours.word_ids[s] == enc.word_ids()
    if family == "bpe":  # every word, the first included, is read after a space (Ġ), as in running text
        tokens = ref.convert_ids_to_tokens(ours.input_ids[0])
        firsts = [tokens[t] for t, w in enumerate(ours.word_ids[0]) if w is not None and
                  (t == 0 or ours.word_ids[0][t - 1] != w)]
        assert all(t.startswith("Ġ") for t in firsts)
        assert not loaded.tokenizer.backend_tokenizer.pre_tokenizer.add_prefix_space  # the shared one untouched


def plain_word_vectors(directory, sentences, pooling):
    """Per sentence, transformers' forward pass alone: (L + 1, words, hidden) by word_ids()."""
    tok, model = reference_tokenizer(directory), AutoModel.from_pretrained(directory).eval()
    out = []
    for words in sentences:
        enc = tok(words, is_split_into_words=True, return_tensors="pt")
        with torch.no_grad():
            states = torch.stack(model(**enc, output_hidden_states=True).hidden_states)[:, 0]
        ids = enc.word_ids()
        vec = []
        for w in range(len(words)):
            positions = [t for t, i in enumerate(ids) if i == w]
            vec.append(states[:, positions[0]] if pooling == "first" else states[:, positions].mean(1))
        out.append(torch.stack(vec, 1).numpy())
    return np.concatenate(out, 1)


@pytest.mark.parametrize("family", ["wordpiece", "sentencepiece", "bpe"])
@pytest.mark.parametrize("pooling", ["first", "mean"])
def test_word_vectors_equal_a_plain_forward_pass(families, family, pooling, tmp_path):
    loaded = load_model(ModelSpec(str(families[family]), device="cpu"))
    got = extract(loaded, SENTENCES, pooling, batch_size=3, store=ArrayStore(tmp_path))
    assert got.kept == list(range(len(SENTENCES))) and got.vectors.shape[1] == sum(map(len, SENTENCES))
    np.testing.assert_allclose(got.vectors, plain_word_vectors(families[family], SENTENCES, pooling), atol=2e-5)


def test_long_sentences_are_dropped_and_counted_never_cut(tiny_dirs, tmp_path):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))  # 64 positions
    sentences = [["the", "film"], ["good"] * 63, ["it", "was", "fun"], ["\u200b", "film"]]  # 65 tokens; "\u200b": none
    got = extract(loaded, sentences, store=ArrayStore(tmp_path))
    assert got.too_long == [1] and got.no_subword == [3] and got.kept == [0, 2]
    assert got.vectors.shape[1] == 5 and got.info()["dropped_too_long"] == 1
    np.testing.assert_allclose(got.vectors, plain_word_vectors(tiny_dirs["bert"], [sentences[0], sentences[2]],
                                                               "first"), atol=2e-5)


def test_word_vectors_are_cached_by_model_words_and_pooling(tiny_dirs, tmp_path):
    loaded, store = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")), ArrayStore(tmp_path)
    first = extract(loaded, SENTENCES, "first", store=store)
    again = extract(loaded, SENTENCES, "first", store=store)
    assert not first.cache_hit and again.cache_hit
    assert isinstance(first.vectors, np.memmap)  # written in place and read back mapped: never all in memory
    for layer in range(first.vectors.shape[0]):  # a layer read through its own map: the same numbers
        got = first.layer(layer)
        assert not isinstance(got, np.memmap)
        np.testing.assert_array_equal(got, np.asarray(first.vectors[layer]))
    np.testing.assert_array_equal(first.vectors, again.vectors)
    assert not extract(loaded, SENTENCES, "mean", store=store).cache_hit
    assert not extract(loaded, SENTENCES[:-1], "first", store=store).cache_hit
