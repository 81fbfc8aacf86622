"""The probe against a straightforward reference written with plain transformers, on tiny models."""


import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from analysis.core.inputs import TextInputs
from analysis.probe.reconstruction import (
    LAYER_COLUMNS,
    ProbeConfig,
    Stopped,
    layer_table,
    mask_groups,
    probe,
    score_rows,
)
from analysis.probe.token_sink import TokenSink
from models.loading import ModelSpec, load_model
from tests.unit.core.test_attention_half import layers_of

TEXTS = ["the film is good .", "i hated it , very dull !", "not a movie", "fun", "the the the the a a a",
         "i liked the film and it was very good fun !"]


def reference(path, texts, include_special=False, attention_halves=False):
    """The paper's probe as a user would write it: full model, all hidden states, head per layer, argmax. With
    ``attention_halves`` each layer's attention half (what its feed-forward block receives, caught by a pre-hook
    there) comes before its output, as issue 36 defines the states."""
    model = AutoModelForMaskedLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    heads = {
        "bert": lambda m: m.cls, "albert": lambda m: m.predictions, "roberta": lambda m: m.lm_head,
        "xlm-roberta": lambda m: m.lm_head,
        "distilbert": lambda m: lambda h: m.vocab_projector(m.vocab_layer_norm(m.activation(m.vocab_transform(h)))),
        "electra": lambda m: lambda h: m.generator_lm_head(m.generator_predictions(h)),
    }
    head = heads[model.config.model_type](model)
    per_text = []  # (layers, positions) correct, probs of the input token, predicted ids
    with torch.no_grad():
        for text in texts:
            enc = tok(text, return_tensors="pt")
            entries, handles = [], []
            if attention_halves:
                modules = {id(ffn): ffn for _, ffn, _ in layers_of(model)}.values()
                handles = [m.register_forward_pre_hook(lambda m, args, entries=entries: entries.append(args[0]))
                           for m in modules]
            try:
                states = model(**enc, output_hidden_states=True).hidden_states
            finally:
                for handle in handles:
                    handle.remove()
            if attention_halves:
                states = [states[0]] + [s for pair in zip(entries, states[1:], strict=True) for s in pair]
            ids = enc["input_ids"][0]
            keep = torch.ones_like(ids, dtype=torch.bool)
            if not include_special:
                keep = ~torch.isin(ids, torch.tensor(tok.all_special_ids))
            logits = torch.stack([head(s[0]) for s in states])[:, keep]  # (layers, positions, vocab)
            target = ids[keep]
            per_text.append({
                "correct": (logits.argmax(-1) == target).numpy(),
                "prob": logits.softmax(-1).gather(2, target[None, :, None].expand(len(states), -1, 1))[..., 0].numpy(),
                "rank": ((logits > logits.gather(2, target[None, :, None].expand(len(states), -1, 1))).sum(-1) + 1)
                .numpy(),
                "pred": logits.argmax(-1).numpy(),
            })
    return per_text


@pytest.fixture(params=["bert", "albert", "roberta", "distilbert", "electra"])
def family_dir(request, tiny_dirs):
    return tiny_dirs[request.param]


def test_the_attention_halves_are_probed_as_the_reference_reads_them(family_dir, tmp_path):
    """--half attention: two rows per layer (its attention half first), each equal to the reference's head read of
    the state its feed-forward block receives; the output rows equal a plain run's; the token rows say their
    half; the streamed Parquet equals the in-memory table."""
    loaded = load_model(ModelSpec(str(family_dir), device="cpu"))
    config = ProbeConfig(batch_size=4, top_k=3, half="attention")
    result = probe(loaded, TextInputs(tuple(TEXTS)), config)
    plain = probe(loaded, TextInputs(tuple(TEXTS)), ProbeConfig(batch_size=4, top_k=3))
    ref = reference(family_dir, TEXTS, attention_halves=True)
    L = loaded.num_layers
    layers = result.layers
    assert list(layers.columns) == ["layer", "half", *LAYER_COLUMNS[1:]]
    assert layers["layer"].tolist() == [0] + [layer for layer in range(1, L + 1) for _ in range(2)]
    assert layers["half"].tolist() == ["output"] + ["attention", "output"] * L
    tokens = sum(r["correct"].shape[1] for r in ref)
    for state in range(2 * L + 1):
        assert layers.iloc[state]["correct"] == sum(int(r["correct"][state].sum()) for r in ref)
        assert layers.iloc[state]["tokens"] == tokens
    outputs = layers[layers["half"] == "output"].drop(columns="half").reset_index(drop=True)
    pd.testing.assert_frame_equal(outputs, plain.layers)
    assert len(result.layer_names) == 2 * L + 1 and result.layer_names[1].endswith("attention half")
    assert set(result.decoded["half"]) == {"attention", "output"}
    assert result.tokens.columns[:3].tolist() == ["text_id", "layer", "half"]
    first = result.tokens[result.tokens["text_id"] == 0]
    assert first[["layer", "half"]].drop_duplicates().apply(tuple, axis=1).tolist() == \
        [(0, "output")] + [(layer, h) for layer in range(1, L + 1) for h in ("attention", "output")]
    streamed = probe(loaded, TextInputs(tuple(TEXTS)), config,
                     sink=TokenSink(loaded.tokenizer, 3, tmp_path / "tokens.parquet", halves=True))
    assert streamed.tokens is None
    on_disk = pd.read_parquet(tmp_path / "tokens.parquet").sort_values(["text_id", "layer", "half", "position"])
    pd.testing.assert_frame_equal(on_disk.reset_index(drop=True), result.tokens.reset_index(drop=True),
                                  check_dtype=False, check_categorical=False)


def test_the_attention_halves_are_refused_with_a_lens_of_the_outputs_only(tiny_dirs):
    from analysis.core.inputs import InputError
    from analysis.probe.lens import TunedLens

    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    outputs_only = TunedLens(loaded.num_layers, loaded.anatomy.hidden_size)
    with pytest.raises(InputError, match="trained on the layer outputs only"):
        probe(loaded, TextInputs(("a film",)), ProbeConfig(half="attention"), lens=outputs_only)
    with pytest.raises(ValueError, match="half: must be one of"):
        ProbeConfig(half="ffn")
    assert "half" not in ProbeConfig().to_dict() and ProbeConfig(half="attention").to_dict()["half"] == "attention"


def test_unmasked_probe_matches_the_reference_for_every_family(family_dir):
    loaded = load_model(ModelSpec(str(family_dir), device="cpu"))
    result = probe(loaded, TextInputs(tuple(TEXTS)), ProbeConfig(batch_size=4, top_k=3, precision="float32"))
    ref = reference(family_dir, TEXTS)
    n_layers = loaded.anatomy.num_layers + 1
    assert list(result.layers.columns) == LAYER_COLUMNS
    assert result.layers["layer"].tolist() == list(range(n_layers))
    tokens = sum(r["correct"].shape[1] for r in ref)
    for layer in range(n_layers):
        correct = sum(int(r["correct"][layer].sum()) for r in ref)
        row = result.layers.iloc[layer]
        assert row["tokens"] == tokens and row["correct"] == correct
        assert row["accuracy"] == pytest.approx(correct / tokens)
        per_sentence = [r["correct"][layer].mean() for r in ref]
        assert row["sentence_mean"] == pytest.approx(np.mean(per_sentence))
        low, high = plain_bootstrap(np.array(per_sentence))
        assert row["ci_low"] == pytest.approx(low) and row["ci_high"] == pytest.approx(high)
    # per-token rows, in text / layer / position order
    t = result.tokens
    for text_id, r in enumerate(ref):
        for layer in range(n_layers):
            rows = t[(t.text_id == text_id) & (t.layer == layer)]
            assert rows["correct"].tolist() == r["correct"][layer].tolist()
            np.testing.assert_allclose(rows["prob"].to_numpy(), r["prob"][layer], rtol=1e-4, atol=1e-6)
            assert rows["rank"].tolist() == r["rank"][layer].tolist()
            tok = loaded.tokenizer
            assert rows["predicted_token"].tolist() == tok.convert_ids_to_tokens(r["pred"][layer].tolist())
    assert all(len(x) == 3 for x in t["top_tokens"])
    assert (t.loc[t["rank"] == 1, "correct"]).all()


def test_include_special_counts_cls_and_sep(tiny_dirs):
    path = tiny_dirs["bert"]
    loaded = load_model(ModelSpec(str(path), device="cpu"))
    result = probe(loaded, TextInputs(tuple(TEXTS)), ProbeConfig(include_special=True))
    ref = reference(path, TEXTS, include_special=True)
    assert result.layers["tokens"].iloc[0] == sum(r["correct"].shape[1] for r in ref)
    assert result.layers["correct"].tolist() == [sum(int(r["correct"][i].sum()) for r in ref)
                                                 for i in range(len(result.layers))]


def test_batching_does_not_change_results(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["roberta"]), device="cpu"))
    a = probe(loaded, TextInputs(tuple(TEXTS)), ProbeConfig(batch_size=1))
    b = probe(loaded, TextInputs(tuple(TEXTS)), ProbeConfig(batch_size=64))
    pd.testing.assert_frame_equal(a.layers, b.layers)
    pd.testing.assert_frame_equal(a.decoded, b.decoded)


def test_decoded_text_joins_word_pieces(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    result = probe(loaded, TextInputs(("the film is good .",)))
    ref = reference(tiny_dirs["bert"], ["the film is good ."])[0]
    for layer, text in zip(result.decoded["layer"], result.decoded["text"], strict=True):
        tokens = loaded.tokenizer.convert_ids_to_tokens(ref["pred"][layer].tolist())
        assert text == loaded.tokenizer.convert_tokens_to_string(tokens)


def test_text_pairs_use_segment_ids(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    pairs = TextInputs(("the film", "it was"), ("is good", "very dull"))
    result = probe(loaded, pairs)
    model, tok = AutoModelForMaskedLM.from_pretrained(tiny_dirs["bert"]).eval(), loaded.tokenizer
    enc = tok(list(pairs.texts), list(pairs.pairs), return_tensors="pt", padding=True)
    with torch.no_grad():
        pred = model(**enc).logits.argmax(-1)
    keep = enc["attention_mask"].bool() & ~torch.isin(enc["input_ids"], torch.tensor(tok.all_special_ids))
    assert result.layers["correct"].iloc[-1] == int((pred == enc["input_ids"])[keep].sum())


def test_masked_mode_masks_every_counted_position_once(tiny_dirs):
    path = tiny_dirs["bert"]
    loaded = load_model(ModelSpec(str(path), device="cpu"))
    cfg = ProbeConfig(mode="masked", mask_fraction=0.3, seed=7)
    result = probe(loaded, TextInputs(tuple(TEXTS)), cfg)
    t = result.tokens
    last = t[t.layer == loaded.anatomy.num_layers]
    assert not last.duplicated(["text_id", "position"]).any()
    assert len(last) == result.layers["tokens"].iloc[0]
    # reference: rebuild the same groups, mask each group, predict with the plain model
    model, tok = AutoModelForMaskedLM.from_pretrained(path).eval(), loaded.tokenizer
    correct, ranks = 0, {}
    with torch.no_grad():
        for text_id, text in enumerate(TEXTS):
            ids = tok(text, return_tensors="pt")["input_ids"]
            counted = ~torch.isin(ids, torch.tensor(tok.all_special_ids))
            groups = mask_groups(counted.numpy(), [text_id], 0.3, 7)[0]
            for g in range(int(groups.max()) + 1):
                sel = torch.from_numpy(groups == g)
                masked = ids.clone()
                masked[0, sel] = tok.mask_token_id
                logits = model(input_ids=masked).logits[0]
                correct += int((logits.argmax(-1)[sel] == ids[0, sel]).sum())
                for pos in sel.nonzero()[:, 0].tolist():
                    ranks[(text_id, pos)] = int((logits[pos] > logits[pos, ids[0, pos]]).sum()) + 1
    assert result.layers["correct"].iloc[-1] == correct
    assert {(r.text_id, r.position): r.rank for r in last.itertuples()} == ranks
    assert len(set(ranks.values())) > 3  # the comparison is not between constants


def test_mask_groups_are_non_overlapping_and_about_the_fraction():
    counted = np.zeros((2, 30), dtype=bool)
    counted[0, 1:21] = True
    counted[1, 1:4] = True
    groups = mask_groups(counted, [0, 1], 0.15, seed=0)
    assert (groups[~counted] == -1).all()
    sizes = np.bincount(groups[0][counted[0]])
    assert sizes.tolist() == [3] * 6 + [2]  # 20 positions, groups of round(0.15 * 20) = 3
    assert np.bincount(groups[1][counted[1]]).tolist() == [1, 1, 1]
    again = mask_groups(counted[1:], [1], 0.15, seed=0)
    assert np.array_equal(again[0], groups[1])  # a text's groups do not depend on its batch


def test_score_rows_chunks_agree_with_one_block():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50)
    stacked, targets = torch.randn(3, 37, 8), torch.randint(0, 50, (37,))  # 3 layers x 37 positions
    a, (kl_a, agree_a) = score_rows(head, stacked, targets, 4, rows_per_chunk=5, divergence=True)
    b, (kl_b, agree_b) = score_rows(head, stacked, targets, 4, rows_per_chunk=1000, divergence=True)
    for name in ["pred", "rank", "top_ids"]:
        assert torch.equal(getattr(a, name), getattr(b, name))
    torch.testing.assert_close(a.prob, b.prob)
    logits = head(stacked.flatten(0, 1))  # rows layer by layer
    torch.testing.assert_close(a.prob, logits.softmax(-1)[torch.arange(3 * 37), targets.repeat(3)])
    torch.testing.assert_close(kl_a, kl_b)
    assert torch.equal(agree_a, agree_b)
    logp = logits.log_softmax(-1).unflatten(0, (3, 37))
    expected = torch.nn.functional.kl_div(logp, logp[-1].expand_as(logp), log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(kl_a, expected.clamp(min=0))
    assert torch.equal(agree_a, (logp.argmax(-1) == logp[-1].argmax(-1)).long())
    assert score_rows(head, stacked, targets, 4, rows_per_chunk=5)[1] is None


def test_truncation_is_counted(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    result = probe(loaded, TextInputs(("the film is good and fun and very good .", "fun")), ProbeConfig(max_length=6))
    assert result.truncated == 1
    assert result.layers["tokens"].iloc[0] == 4 + 1  # 6 minus [CLS] and [SEP]; "fun"


def test_streaming_to_parquet_gives_the_same_rows(tiny_dirs, tmp_path):
    loaded = load_model(ModelSpec(str(tiny_dirs["electra"]), device="cpu"))
    inputs = TextInputs(tuple(TEXTS))
    in_memory = probe(loaded, inputs).tokens
    path = tmp_path / "tokens.parquet"
    streamed = probe(loaded, inputs, sink=TokenSink(loaded.tokenizer, 5, path))
    assert streamed.tokens is None
    back = pd.read_parquet(path).sort_values(["text_id", "layer", "position"]).reset_index(drop=True)
    assert back[["text_id", "layer", "position", "correct"]].equals(in_memory[["text_id", "layer", "position",
                                                                              "correct"]])
    assert back["input_token"].astype(str).tolist() == in_memory["input_token"].astype(str).tolist()


def test_progress_and_stop(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    seen = []
    probe(loaded, TextInputs(tuple(TEXTS)), ProbeConfig(batch_size=2), progress=lambda d, n: seen.append((d, n)))
    assert seen[-1] == (len(TEXTS), len(TEXTS)) and len(seen) == 3
    with pytest.raises(Stopped):
        probe(loaded, TextInputs(tuple(TEXTS)), ProbeConfig(batch_size=2), should_stop=lambda: len(seen) > 3,
              progress=lambda d, n: seen.append((d, n)))


def test_model_is_not_mutated(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["albert"]), device="cpu"))
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    probe(loaded, TextInputs(tuple(TEXTS)), ProbeConfig(mode="masked"))
    after = loaded.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("kwargs", [{"mode": "both"}, {"top_k": 0}, {"batch_size": 0}, {"max_length": 1},
                                    {"mask_fraction": 0}])
def test_bad_options(kwargs):
    with pytest.raises(ValueError):
        ProbeConfig(**kwargs)


def plain_bootstrap(values: np.ndarray, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile bootstrap of the mean, written out: resample sentences with replacement."""
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


@pytest.mark.parametrize("per_sentence", [[1.0, 0.5], [1.0, 1.0, 0.9], [0.0, 0.05], [1.0], [0.0, 1.0],
                                          [1.0] * 30 + [0.2], [0.02, 0.0, 0.0, 0.01]])
def test_sentence_mean_intervals_stay_in_0_1(per_sentence):
    """A t-interval over few sentences reached 1.33; the bootstrap stays within the sentences' own range."""
    counted = np.full(len(per_sentence), 20)
    correct = np.round(np.array(per_sentence) * 20)[:, None].repeat(2, 1)
    row = layer_table(correct, counted).iloc[0]
    if len(per_sentence) == 1:  # one sentence: no interval
        assert np.isnan(row["ci_low"]) and np.isnan(row["ci_high"])
    else:
        assert 0 <= row["ci_low"] <= row["sentence_mean"] <= row["ci_high"] <= 1
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(plain_bootstrap(correct[:, 0] / counted))


def test_sentence_mean_intervals_of_random_tables_stay_in_0_1():
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 12))
        counted = rng.integers(0, 6, n)
        correct = np.minimum(rng.integers(0, 6, (n, 3)), counted[:, None])
        table = layer_table(correct, counted)
        finite = table.dropna(subset=["ci_low"])
        assert ((finite.ci_low >= 0) & (finite.ci_high <= 1) & (finite.ci_low <= finite.sentence_mean)
                & (finite.sentence_mean <= finite.ci_high)).all()


def test_a_full_disk_under_the_background_writer_is_one_line_and_leaves_no_output(tiny_dirs, tmp_path, monkeypatch,
                                                                                  capsys):
    """Issue 44 item 4: tokens.parquet is written by a thread; its error (a full disk) reaches the command, which
    says so in one line and leaves no --out folder."""
    import errno

    import pyarrow.parquet as pq

    from cli.main import main

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS * 3) + "\n")
    out = tmp_path / "out"
    assert main(["probe", "--model", str(tiny_dirs["bert"]), "--input", str(texts), "--out", str(out),
                 "--batch-size", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: no space left on device") and "Traceback" not in "\n".join(err), err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["texts.txt"]
