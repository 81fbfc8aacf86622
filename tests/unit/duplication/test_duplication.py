"""Layer duplication: views equal exports equal plain transformers; the cached model is never touched."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForMaskedLM

from analysis.core.cka import linear_cka
from analysis.core.inputs import InputError, TextInputs
from analysis.duplication.export import export
from analysis.duplication.plan import duplicate_first, duplicate_last, parse_plan, preview
from analysis.probe.reconstruction import probe
from analysis.tasks.duplication import sweep, token_states
from cli.main import main
from models.loading import ModelSpec, load_model

TEXTS = TextInputs(("the film is good .", "i hated it , very dull !", "fun and not bad"))


def loaded_of(path):
    return load_model(ModelSpec(str(path), device="cpu"))


def batch(loaded):
    return loaded.tokenizer(list(TEXTS.texts), padding=True, return_tensors="pt")


def plan_for(loaded, extra: int):
    if loaded.anatomy.family == "albert":
        return [0] * (loaded.num_layers + extra)
    return duplicate_first(loaded.num_layers, min(extra, loaded.num_layers))


@torch.no_grad()
def test_zero_duplications_are_bit_identical(tiny_dir):
    loaded = loaded_of(tiny_dir)
    enc = batch(loaded)
    ref = loaded.model(**enc, output_hidden_states=True)
    out = preview(loaded, plan_for(loaded, 0)).model(**enc, output_hidden_states=True)
    assert torch.equal(ref.logits, out.logits)
    assert len(out.hidden_states) == len(ref.hidden_states)
    assert all(torch.equal(a, b) for a, b in zip(ref.hidden_states, out.hidden_states, strict=True))


@torch.no_grad()
def test_export_computes_what_the_preview_computed(tiny_dir, tmp_path):
    loaded = loaded_of(tiny_dir)
    plan = plan_for(loaded, 2)
    enc = batch(loaded)
    view = preview(loaded, plan).model(**enc, output_hidden_states=True)
    exported = AutoModelForMaskedLM.from_pretrained(export(loaded, plan, tmp_path / "deeper")).eval()
    out = exported(**enc, output_hidden_states=True)
    assert exported.config.num_hidden_layers == len(plan) == len(view.hidden_states) - 1
    assert torch.equal(view.logits, out.logits)
    assert all(torch.equal(a, b) for a, b in zip(view.hidden_states, out.hidden_states, strict=True))


@torch.no_grad()
def test_duplicated_layers_really_repeat_their_source(tiny_dirs):
    loaded = loaded_of(tiny_dirs["bert"])  # 3 layers; plan 0,0,1,2
    enc = loaded.tokenizer(["the film is good ."], return_tensors="pt")  # one text: no padding, no mask needed
    states = preview(loaded, [0, 0, 1, 2]).model(**enc, output_hidden_states=True).hidden_states
    again = loaded.model.bert.encoder.layer[0](states[1])
    again = again[0] if isinstance(again, tuple) else again
    torch.testing.assert_close(states[2], again)  # the copy applies layer 0 to layer 0's output


@torch.no_grad()
def test_albert_depth_n_equals_loading_with_num_hidden_layers(tiny_dirs):
    path = tiny_dirs["albert"]
    loaded = loaded_of(path)
    enc = batch(loaded)
    for depth in (1, 5, 7):  # fewer than, and past, the trained depth of 3
        ref = AutoModelForMaskedLM.from_pretrained(path, num_hidden_layers=depth).eval()(**enc).logits
        assert torch.equal(preview(loaded, [0] * depth).model(**enc).logits, ref)


@torch.no_grad()
def test_the_cached_model_is_unchanged_by_a_preview(tiny_dir):
    loaded = loaded_of(tiny_dir)
    model = loaded.model
    enc = batch(loaded)
    before = model(**enc, output_hidden_states=True)  # its own first forward installs its output hooks
    params = {k: v.clone() for k, v in model.state_dict().items()}
    config = model.config.to_dict()
    modules = [(name, id(m), len(m._forward_hooks)) for name, m in model.named_modules()]
    view = preview(loaded, plan_for(loaded, 3))
    view.model(**enc, output_hidden_states=True)
    probe(view, TEXTS)
    after = model(**enc, output_hidden_states=True)
    assert model.config.to_dict() == config
    assert [(name, id(m), len(m._forward_hooks)) for name, m in model.named_modules()] == modules
    assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())
    assert len(after.hidden_states) == len(before.hidden_states)
    # to float32 rounding, not bitwise: with one thread (OMP_NUM_THREADS=1) the same weights' logits differed in the
    # last bits between two calls (ALBERT; a kernel choice), while a changed model moves them by far more
    torch.testing.assert_close(after.logits, before.logits, rtol=0, atol=1e-6)
    assert sum(p.numel() for p in view.model.parameters()) == sum(p.numel() for p in model.parameters())  # a view


def test_plans():
    assert duplicate_first(12, 3) == [0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert duplicate_first(4, 0) == [0, 1, 2, 3] and duplicate_last(4, 1) == [0, 1, 2, 3, 3]
    assert parse_plan("3, 2 1", 4) == [3, 2, 1]


@pytest.mark.parametrize("text, message", [("", "empty"), ("0,1,9", "9 do not exist"),
                                           ("0,-1", "do not exist"), ("a,b", "whole numbers")])
def test_plan_validation(text, message):
    with pytest.raises(InputError, match=message):
        parse_plan(text, 4)


def test_bad_duplicate_counts(tiny_dirs):
    with pytest.raises(InputError, match="0..3"):
        duplicate_first(3, 4)
    with pytest.raises(InputError, match="empty"):
        preview(loaded_of(tiny_dirs["bert"]), [])


def test_cka_against_the_identity_plan_is_the_model_with_itself(tiny_dirs):
    loaded = loaded_of(tiny_dirs["bert"])
    a = token_states(loaded, TEXTS)
    b = token_states(preview(loaded, [0, 1, 2]), TEXTS)
    np.testing.assert_allclose(linear_cka(a, b), linear_cka(a), atol=1e-5)


def test_sweep_starts_at_the_original_model(tiny_dirs):
    loaded = loaded_of(tiny_dirs["bert"])
    table = sweep(loaded, TEXTS)
    assert table["duplicated"].tolist() == [0, 1, 2, 3]
    assert table.final_layer_accuracy.iloc[0] == pytest.approx(probe(loaded, TEXTS).layers.accuracy.iloc[-1])


def test_cli_exports_previews_and_sweeps(tiny_dirs, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS.texts) + "\n")
    out = tmp_path / "deeper"
    assert main(["duplicate", "--model", str(tiny_dirs["bert"]), "--duplicate-first", "2", "--preview-input",
                 str(texts), "--sweep", "--out", str(out)]) == 0
    assert AutoModelForMaskedLM.from_pretrained(out).config.num_hidden_layers == 5
    layers = pd.read_csv(out / "preview" / "layers.csv")
    assert len(layers) == 6 and "accuracy" in layers.columns
    assert list(pd.read_csv(out / "sweep.csv").columns) == ["duplicated", "final_layer_accuracy"]
    assert json.loads((out / "duplication.json").read_text())["plan"] == [0, 0, 1, 1, 2]


@pytest.mark.parametrize("args, message", [(["--depth", "5"], "--depth is for ALBERT"),
                                           (["--plan", "0,7"], "do not exist"),
                                           (["--sweep"], "--sweep needs --preview-input")])
def test_cli_bad_input(tiny_dirs, tmp_path, capsys, args, message):
    assert main(["duplicate", "--model", str(tiny_dirs["bert"]), "--out", str(tmp_path / "o"), *args]) == 2
    assert message in capsys.readouterr().err


def test_export_is_saved_in_the_source_checkpoints_dtype_not_the_caches(tiny_dirs, tmp_path):
    """A float32 checkpoint shown in bfloat16 (as on a GPU) exports float32 by default, from the checkpoint's
    own values; the dtype is recorded in duplication.json and can be chosen."""
    from safetensors.torch import load_file

    path = tiny_dirs["bert"]
    shown = load_model(ModelSpec(str(path), device="cpu", dtype="bfloat16"))
    plan = plan_for(shown, 1)
    out = export(shown, plan, tmp_path / "default")
    saved = load_file(out / "model.safetensors")
    assert {v.dtype for v in saved.values()} == {torch.float32}
    assert json.loads((out / "duplication.json").read_text())["dtype"] == "float32"
    exact = export(loaded_of(path), plan, tmp_path / "from_float32")  # the same as exporting the float32 model
    assert all(torch.equal(v, load_file(exact / "model.safetensors")[k]) for k, v in saved.items())
    half = export(shown, plan, tmp_path / "bf16", dtype="bfloat16")
    assert {v.dtype for v in load_file(half / "model.safetensors").values()} == {torch.bfloat16}
    assert json.loads((half / "duplication.json").read_text())["dtype"] == "bfloat16"


def test_a_deeper_model_names_its_layers_by_source_through_export_and_fine_tuning(tiny_dirs, tmp_path):
    """'5 ← 3' on the preview, the export, a second duplication of the export and a fine-tuned export."""
    from analysis.probe.plots import accuracy_curve
    from analysis.training.finetune import Splits, run_finetune
    from analysis.training.train import FinetuneConfig
    from tests.support.data import synthetic

    loaded = loaded_of(tiny_dirs["bert"])  # 3 layers
    plan = [0, 0, 1, 2]
    names = ["embeddings", "1 ← 1", "2 ← 1", "3 ← 2", "4 ← 3"]
    assert preview(loaded, plan).anatomy.layer_names() == names
    exported = export(loaded, plan, tmp_path / "deeper")
    again = loaded_of(exported)
    assert again.anatomy.layer_names() == names
    assert preview(again, [0, 1, 1, 2, 3]).anatomy.layer_names()[1:4] == ["1 ← 1", "2 ← 1", "3 ← 1"]  # composed
    run_finetune(ModelSpec(str(exported), device="cpu"), Splits(synthetic(16), synthetic(8, seed=1)),
                 FinetuneConfig(epochs=1, batch_size=8), tmp_path / "run")
    tuned = load_model(ModelSpec(str(tmp_path / "run" / "checkpoint" / "encoder"), device="cpu",
                                 head_from=str(exported)))
    assert tuned.anatomy.layer_names() == names
    fig = accuracy_curve({"original": probe(loaded, TextInputs(("a film .", "it was good ."))).layers,
                          "deeper": probe(again, TextInputs(("a film .", "it was good ."))).layers},
                         {"original": loaded.anatomy.layer_names(), "deeper": names})
    assert fig.layout.xaxis.ticktext is None  # two models of different depth: each at its own indices
    assert [c[0] for c in fig.data[-1].customdata] == names  # the deeper model's own names, in its hover


def test_the_original_layers_sit_at_their_last_copy_on_the_deeper_axis():
    from analysis.duplication.plan import aligned_positions
    from analysis.probe.plots import accuracy_curve

    assert aligned_positions([0, 0, 1, 1, 2, 3], 4, "bert") == [0, 2, 4, 5, 6]  # the paper's k = 2 on 4 layers
    assert aligned_positions([0, 2], 3, "bert") == [0, 1, None, 2]  # a dropped layer has no place
    layers = pd.DataFrame({"layer": range(5), "tokens": 1, "correct": 1, "accuracy": 1.0, "sentence_mean": 1.0,
                           "ci_low": 1.0, "ci_high": 1.0})
    fig = accuracy_curve({"original": layers}, positions={"original": [0, 2, 4, 5, 6]})
    assert list(fig.data[-1].x) == [0, 2, 4, 5, 6]


@pytest.mark.parametrize("model", ["/tmp/_x/model", "./.hidden", "org/name", "_tmp_pytest_model", "demo",
                                   "/", "..", "~/my model (v2)", "a" * 300, "/tmp/x/-weird..name.."])
def test_the_default_export_name_passes_the_exports_own_rule(model):
    from analysis.duplication.export import check_export_name, default_export_name

    name = default_export_name(model, [0, 0, 1, 2])
    assert check_export_name(name) == name
    assert name.endswith("-4L-" + default_export_name("x", [0, 0, 1, 2]).rsplit("-", 1)[1])


def test_a_refused_export_name_states_the_rule():
    from analysis.duplication.export import check_export_name

    for bad in ("_x", ".hidden", "a/b", "a..b", "", "é"):
        with pytest.raises(InputError, match="starts with a letter or digit") as info:
            check_export_name(bad)
        assert "letters, digits, dot, dash and underscore" in str(info.value) and "100" in str(info.value)


def test_the_page_offers_a_default_name_it_accepts(tiny_dirs, tmp_path):
    import shutil

    from tests.support.pages import run_page

    path = tmp_path / "_tmp_x" / "model"
    shutil.copytree(tiny_dirs["bert"], path)
    at = run_page("pages/4_Layer_Duplication.py", model=str(path))
    assert not at.exception
    at.button(key="dup_export").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.session_state["dup_exported"][0].endswith(at.text_input(key="dup_target").value)
