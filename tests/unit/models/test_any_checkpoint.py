"""Any BERT-family checkpoint loads as an encoder: masked LMs, bare encoders, task models, ELECTRA
discriminators and sentence-transformers directories; a borrowed MLM head reads layers exactly as the donor's
own head does; what a model has (MLM head, task head, pooling) is said, and what it lacks is explained."""

import json

import numpy as np
import pytest
import torch
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    ElectraForPreTraining,
)

from analysis.core.inputs import InputError, TextInputs
from analysis.probe.reconstruction import probe
from models.loading import ModelLoadError, ModelSpec, load_model
from tests.support.models import TINY_CONFIGS, tiny_tokenizer

TEXTS = TextInputs(("the film is good .", "a very dull movie !", "it was not bad"))
TASKS = {"sequence": AutoModelForSequenceClassification, "token": AutoModelForTokenClassification,
         "qa": AutoModelForQuestionAnswering, "choice": AutoModelForMultipleChoice, "bare": AutoModel}


def save_as(mlm_dir, cls, out, **config_changes):
    """The encoder of the tiny masked LM in ``mlm_dir`` saved as ``cls`` (its task head random)."""
    torch.manual_seed(1)
    model = cls.from_pretrained(mlm_dir, **config_changes)
    model.save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_family_saved_as_every_class_loads_as_an_encoder(tiny_dirs, tmp_path, family, task):
    path = save_as(tiny_dirs[family], TASKS[task], tmp_path / task,
                   **({"num_labels": 3, "id2label": {0: "neg", 1: "neu", 2: "pos"}} if task == "sequence" else {}))
    loaded = load_model(ModelSpec(str(path), device="cpu"))
    assert loaded.mlm_head is None
    own = load_model(ModelSpec(str(tiny_dirs[family]), device="cpu"))
    assert own.mlm_head == "own"
    for name, p in own.model.base_model.named_parameters():  # the same encoder weights were read
        assert torch.equal(p, dict(loaded.model.base_model.named_parameters())[name]), name
    if task == "sequence":
        assert loaded.task == "SequenceClassification" and loaded.labels == ["neg", "neu", "pos"]
    with pytest.raises(InputError, match="has no MLM head of its own.*head-from"):
        probe(loaded, TEXTS)


def test_an_electra_discriminator_loads_as_an_encoder(tiny_dirs, tmp_path):
    path = save_as(tiny_dirs["electra"], ElectraForPreTraining, tmp_path / "disc")
    loaded = load_model(ModelSpec(str(path), device="cpu"))
    assert loaded.mlm_head is None and loaded.task == "PreTraining"


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_a_classifier_read_by_its_base_models_head_gives_the_base_models_probe(tiny_dirs, tmp_path, family):
    """Kao et al. Fig. 2's comparison for a hub classifier: made from a tiny MLM's encoder, probed with that MLM's
    head, the tables equal the MLM's own probe exactly."""
    path = save_as(tiny_dirs[family], AutoModelForSequenceClassification, tmp_path / "clf")
    borrowed = load_model(ModelSpec(str(path), device="cpu", head_from=str(tiny_dirs[family])))
    assert borrowed.mlm_head == f"from {tiny_dirs[family]}"
    ours = probe(borrowed, TEXTS)
    ref = probe(load_model(ModelSpec(str(tiny_dirs[family]), device="cpu")), TEXTS)
    assert ours.layers.equals(ref.layers) and ours.decoded.equals(ref.decoded)


def test_a_mismatched_head_is_one_line_naming_what_differs(tiny_dirs, tmp_path):
    bigger = AutoModelForMaskedLM.from_config(TINY_CONFIGS["bert"].__class__(
        **{**TINY_CONFIGS["bert"].to_dict(), "hidden_size": 32, "vocab_size": 120}))
    bigger.save_pretrained(tmp_path / "big")
    tiny_tokenizer().save_pretrained(tmp_path / "big")
    with pytest.raises(ModelLoadError) as info:
        load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu", head_from=str(tmp_path / "big")))
    message = str(info.value)
    assert "\n" not in message and "hidden size 16 vs 32" in message and "vocabulary 99 vs 120" in message
    with pytest.raises(ModelLoadError, match="family roberta vs bert"):
        load_model(ModelSpec(str(tiny_dirs["roberta"]), device="cpu", head_from=str(tiny_dirs["bert"])))


def test_missing_encoder_weights_are_named(tiny_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_as(tiny_dirs["bert"], AutoModel, tmp_path / "bare")
    weights = load_file(path / "model.safetensors")
    gone = next(k for k in weights if "encoder.layer.1." in k)
    save_file({k: v for k, v in weights.items() if k != gone}, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"encoder weights are missing.*layer\.1\."):
        load_model(ModelSpec(str(path), device="cpu"))


def sentence_transformers_dir(mlm_dir, out, mode="mean", normalize=False):
    """What a sentence-transformers model directory holds, written by hand (no sentence-transformers code):
    all-MiniLM-L6-v2's layout with ``normalize`` (a ``BertModel``, ``modules.json``, ``1_Pooling/``,
    ``2_Normalize/``, ``sentence_bert_config.json``, ``config_sentence_transformers.json``)."""
    save_as(mlm_dir, AutoModel, out)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out / "2_Normalize").mkdir()
        (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32, "do_lower_case": False}))
        (out / "config_sentence_transformers.json").write_text(json.dumps({
            "__version__": {"sentence_transformers": "2.0.0"}, "prompts": {}, "similarity_fn_name": "cosine"}))
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 16, "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": mode == "max"}))
    return out


@pytest.mark.parametrize("mode", ["cls", "mean", "max"])
def test_a_sentence_encoders_normalize_module_is_applied(tiny_dirs, tmp_path, mode):
    """sentence-transformers' 2_Normalize is part of the model's pooling: the pooled vector, L2-normalised."""
    from analysis.core.store import ArrayStore
    from analysis.core.vectors import representations

    path = sentence_transformers_dir(tiny_dirs["bert"], tmp_path / "st", mode=mode, normalize=True)
    loaded = load_model(ModelSpec(str(path), device="cpu"))
    assert loaded.pooling == f"{mode}+normalize" and loaded.summary()["pooling"] == f"{mode}+normalize"
    reps, _ = representations(loaded, TEXTS, "model", store=ArrayStore(tmp_path / "store"))
    plain, tok = AutoModel.from_pretrained(path).eval(), tiny_tokenizer()
    for i, text in enumerate(TEXTS.texts):
        with torch.no_grad():
            states = plain(**tok(text, return_tensors="pt"), output_hidden_states=True).hidden_states
        for layer, h in enumerate(states):
            pooled = {"cls": h[0, 0], "mean": h[0].mean(0), "max": h[0].max(0).values}[mode]
            expected = torch.nn.functional.normalize(pooled, dim=-1).numpy()
            np.testing.assert_allclose(reps[layer, i], expected, atol=2e-6)
            assert np.linalg.norm(reps[layer, i]) == pytest.approx(1, abs=1e-5)
    unnormalised = sentence_transformers_dir(tiny_dirs["bert"], tmp_path / "plain", mode=mode)
    other, _ = representations(load_model(ModelSpec(str(unnormalised), device="cpu")), TEXTS, "model",
                               store=ArrayStore(tmp_path / "store"))
    assert not np.allclose(other, reps)  # not served the other's cached vectors


def test_a_sentence_encoders_own_pooling_is_read_and_used(tiny_dirs, tmp_path):
    from analysis.core.store import ArrayStore
    from analysis.core.vectors import representations

    path = sentence_transformers_dir(tiny_dirs["bert"], tmp_path / "st")
    loaded = load_model(ModelSpec(str(path), device="cpu"))
    assert loaded.pooling == "mean" and loaded.mlm_head is None
    reps, _ = representations(loaded, TEXTS, "model", store=ArrayStore(tmp_path / "store"))
    plain, tok = AutoModel.from_pretrained(path).eval(), tiny_tokenizer()
    for i, text in enumerate(TEXTS.texts):
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            states = plain(**enc, output_hidden_states=True).hidden_states
        for layer, h in enumerate(states):  # sentence-transformers' mean: every token the mask keeps
            np.testing.assert_allclose(reps[layer, i], h[0].mean(0).numpy(), atol=2e-5)
    with pytest.raises(InputError, match="no pooling of its own"):
        representations(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")), TEXTS, "model",
                        store=ArrayStore(tmp_path / "store"))


def test_cli_probe_with_head_from_and_its_errors(tiny_dirs, tmp_path, capsys):
    import pandas as pd

    from cli.main import main

    clf = save_as(tiny_dirs["bert"], AutoModelForSequenceClassification, tmp_path / "clf")
    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(TEXTS.texts))
    capsys.readouterr()  # what saving the checkpoint printed
    assert main(["probe", "--model", str(clf), "--input", str(texts), "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no MLM head of its own" in err[0] and "--head-from" in err[0]
    assert main(["probe", "--model", str(clf), "--head-from", str(tiny_dirs["bert"]), "--input", str(texts),
                 "--out", str(tmp_path / "a")]) == 0
    assert main(["probe", "--model", str(tiny_dirs["bert"]), "--input", str(texts), "--out", str(tmp_path / "b")]) == 0
    assert pd.read_csv(tmp_path / "a" / "layers.csv").equals(pd.read_csv(tmp_path / "b" / "layers.csv"))
    capsys.readouterr()
    assert main(["probe", "--model", str(clf), "--head-from", str(tiny_dirs["albert"]), "--input", str(texts),
                 "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "family bert vs albert" in err[0]


def test_fine_tuning_a_classifier_replaces_its_task_head_and_says_so(tiny_dirs, tmp_path):
    from analysis.training.finetune import run_options
    from analysis.training.options import resolve

    clf = save_as(tiny_dirs["bert"], AutoModelForSequenceClassification, tmp_path / "clf")
    run_options(resolve({"model": str(clf), "train": "demo", "epochs": 1, "max_steps": 2, "head": "attention"}),
                tmp_path / "run")
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["replaced_task_head"] == "BertForSequenceClassification"


def test_pages_say_what_a_classifier_has_and_read_it_with_a_borrowed_head(tiny_dirs, tmp_path):
    from tests.support.pages import run_page
    from ui.sidebar import KEY_HEAD_FROM

    clf = save_as(tiny_dirs["bert"], AutoModelForSequenceClassification, tmp_path / "clf", num_labels=2,
                  id2label={0: "neg", 1: "pos"})
    at = run_page("pages/0_Model_anatomy.py", model=str(clf))
    assert not at.exception
    assert "MLM head: none" in at.sidebar.success[0].value and "SequenceClassification (neg, pos)" in \
        at.sidebar.success[0].value
    assert any("Task head" in m.value for m in at.markdown)
    at = run_page("pages/1_Reconstruction.py", model=str(clf))
    at.button(key="probe_run").click().run()
    assert not at.exception and "no MLM head of its own" in at.error[0].value
    at.session_state[KEY_HEAD_FROM] = str(tiny_dirs["bert"])  # as run_page sets the model (persisted widgets)
    at.run()
    at.button(key="probe_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert f"MLM head: from {tiny_dirs['bert']}" in at.sidebar.success[0].value


def test_the_atlas_colours_a_classifier_by_its_own_predictions(tiny_dirs, tmp_path):
    from analysis.atlas.atlas import AtlasConfig, atlas
    from analysis.core.store import ArrayStore

    clf = save_as(tiny_dirs["bert"], AutoModelForSequenceClassification, tmp_path / "clf", num_labels=2,
                  id2label={0: "neg", 1: "pos"})
    texts = [f"the film {i} is {'good' if i % 2 else 'bad'} ." for i in range(20)]
    inputs = TextInputs(tuple(texts), labels=tuple("pos" if i % 2 else "neg" for i in range(20)))
    loaded = load_model(ModelSpec(str(clf), device="cpu"))
    result = atlas(loaded, inputs, AtlasConfig(layers="-1:", folds=2, color_by="prediction"),
                   store=ArrayStore(tmp_path / "store"))
    plain, tok = AutoModelForSequenceClassification.from_pretrained(clf).eval(), tiny_tokenizer()
    with torch.no_grad():
        logits = plain(**tok(texts, padding=True, return_tensors="pt")).logits
    expected = [["neg", "pos"][i] for i in logits.argmax(-1).tolist()]
    assert result.coords.prediction.tolist() == expected
    assert result.coords.correct.tolist() == [p == y for p, y in zip(expected, inputs.labels, strict=True)]
    np.testing.assert_allclose(result.coords.probability, logits.softmax(-1).max(-1).values.numpy(), atol=1e-5)
    with pytest.raises(InputError, match="no classification head of its own"):
        atlas(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")), inputs,
              AtlasConfig(layers="-1:", folds=2, color_by="correct"), store=ArrayStore(tmp_path / "store"))


def test_duplicating_a_bare_encoder_exports_an_encoder(tiny_dirs, tmp_path):
    from analysis.duplication.export import export

    bare = save_as(tiny_dirs["bert"], AutoModel, tmp_path / "bare")
    out = export(load_model(ModelSpec(str(bare), device="cpu")), [0, 0, 1, 2], tmp_path / "deeper")
    again = load_model(ModelSpec(str(out), device="cpu"))
    assert again.mlm_head is None and again.num_layers == 4  # no placeholder head passed off as pre-trained
    assert json.loads((out / "duplication.json").read_text())["mlm_head"] is None


def test_a_headless_checkpoint_is_described_as_saved(tiny_dirs, tmp_path, capsys):
    """all-MiniLM-L6-v2's case: a BertModel (pooler, no MLM head) is reported as a BertModel with its own
    parameters, pooler included, not as the BertForMaskedLM it is read through with a placeholder head."""
    from cli.main import main
    from tests.support.pages import run_page

    path = sentence_transformers_dir(tiny_dirs["bert"], tmp_path / "st", normalize=True)
    plain = AutoModel.from_pretrained(path)
    own = sum(p.numel() for p in plain.parameters())
    pooler = sum(p.numel() for p in plain.pooler.parameters())
    summary = load_model(ModelSpec(str(path), device="cpu")).summary()
    assert summary["class"] == "BertModel" and summary["parameters"] == own and summary["pooler"] == pooler
    assert summary["mlm_head"] == "none"
    capsys.readouterr()
    assert main(["info", "--model", str(path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "BertModel" in out and "ForMaskedLM" not in out and f"  {own}\n" in out
    borrowed = load_model(ModelSpec(str(path), device="cpu", head_from=str(tiny_dirs["bert"]))).summary()
    assert borrowed["parameters"] == own and borrowed["mlm_head"] == f"from {tiny_dirs['bert']}"
    mlm = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    assert mlm.summary()["class"] == "BertForMaskedLM" and mlm.summary()["pooler"] == 0
    assert mlm.summary()["parameters"] == sum(p.numel() for p in AutoModelForMaskedLM.from_pretrained(
        tiny_dirs["bert"]).parameters())
    at = run_page("pages/0_Model_anatomy.py", model=str(path))
    assert not at.exception
    assert at.metric[4].value == f"{own:,}"
    text = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
    assert "BertModel" in text and "ForMaskedLM" not in text and f"{pooler:,}" in text


def test_duplicating_a_sentence_encoder_keeps_its_class_pooler_and_files(tiny_dirs, tmp_path, capsys):
    from transformers import BertModel

    from analysis.duplication.export import export
    from analysis.duplication.plan import preview
    from cli.main import main

    path = sentence_transformers_dir(tiny_dirs["bert"], tmp_path / "st", normalize=True)
    loaded = load_model(ModelSpec(str(path), device="cpu"))
    plan = [0, 0, 1, 2]
    out = export(loaded, plan, tmp_path / "deeper")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    source = BertModel.from_pretrained(path)
    deeper, info = BertModel.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert deeper.config.num_hidden_layers == 4
    for name, p in source.pooler.state_dict().items():  # the checkpoint's own pooler, not a random one
        assert torch.equal(deeper.pooler.state_dict()[name], p)
    for new, src in enumerate(plan):
        for name, p in source.encoder.layer[src].state_dict().items():
            assert torch.equal(deeper.encoder.layer[new].state_dict()[name], p)
    for name in ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json",
                 "config_sentence_transformers.json"):
        assert json.loads((out / name).read_text()) == json.loads((path / name).read_text()), name
    assert (out / "2_Normalize").is_dir()
    again = load_model(ModelSpec(str(out), device="cpu"))
    assert again.pooling == "mean+normalize" and again.mlm_head is None and again.summary()["class"] == "BertModel"
    enc = tiny_tokenizer()(list(TEXTS.texts), padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = preview(loaded, plan).model.base_model(**enc, output_hidden_states=True).hidden_states
        theirs = deeper.eval()(**enc, output_hidden_states=True).hidden_states
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    capsys.readouterr()
    assert main(["duplicate", "--model", str(path), "--device", "cpu", "--duplicate-first", "1",
                 "--out", str(tmp_path / "cli")]) == 0
    err = capsys.readouterr().err
    assert "BertModel" in err and "AutoModelForMaskedLM" not in err
    assert (tmp_path / "cli" / "2_Normalize").is_dir() and (tmp_path / "cli" / "modules.json").is_file()
