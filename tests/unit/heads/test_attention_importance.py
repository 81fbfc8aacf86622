"""Head gates and head importance (analysis.heads.model, analysis.heads.importance; Michel et al. 2019): masking every
head of a layer equals that layer computed by hand without its attention term, importance is Eq. 2 (the mean over
examples of each one's absolute gradient, each gradient a finite difference of that example's loss), the pruning
curve's bookkeeping, and one readable error per bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForMaskedLM, BertConfig, BertForSequenceClassification

from analysis.core.inputs import InputError, TextInputs
from analysis.heads.batches import classifier_batches, classifier_labels, mlm_batches
from analysis.heads.importance import (
    ScoredLogits,
    example_gradients,
    example_losses,
    head_importance,
    mean_loss,
    mlm_importance,
)
from analysis.heads.model import check_head, head_gates, head_shape
from models.loading import ModelSpec, load_model
from tests.support.models import tiny_tokenizer

TEXTS = TextInputs(("the film is good .", "i liked the movie and it was fun", "not very good , dull",
                    "it was a bad film !", "the movie is very fun and good"))


def states(model, ids, gates=None):
    with torch.no_grad():
        if gates is None:
            return model.base_model(input_ids=ids, output_hidden_states=True).hidden_states
        with head_gates(model, gates):
            return model.base_model(input_ids=ids, output_hidden_states=True).hidden_states


@pytest.mark.parametrize("family", ["bert", "albert", "roberta", "distilbert", "electra", "xlm-roberta"])
def test_gates_of_one_change_nothing_and_hooks_are_removed(tiny_dirs, family):
    model = load_model(ModelSpec(str(tiny_dirs[family]), device="cpu")).model
    ids = torch.randint(5, 99, (2, 9))
    plain = states(model, ids)
    gated = states(model, ids, torch.ones(head_shape(model)))
    for a, b in zip(plain, gated, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    hooks = [m for m in model.modules() if m._forward_pre_hooks]
    assert not hooks  # removed on exit


def hand_layer(family, layer, x):
    """One encoder layer computed by hand with its attention term removed: the attention block's output is the
    LayerNorm of the residual plus the output projection's bias (the projection of a zero context)."""
    if family == "bert":
        h = layer.attention.output.LayerNorm(x + layer.attention.output.dense.bias)
        inner = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(h))
        return layer.output.LayerNorm(layer.output.dense(inner) + h)
    if family == "distilbert":
        h = layer.sa_layer_norm(x + layer.attention.out_lin.bias)
        ffn = layer.ffn.lin2(layer.ffn.activation(layer.ffn.lin1(h)))
        return layer.output_layer_norm(ffn + h)
    inner = layer.albert_layers[0]  # albert
    h = inner.attention.LayerNorm(x + inner.attention.dense.bias)
    return inner.full_layer_layer_norm(inner.ffn_output(inner.activation(inner.ffn(h))) + h)


@pytest.mark.parametrize("family", ["bert", "distilbert", "albert"])
@pytest.mark.parametrize("masked", [1, 2])
def test_masking_every_head_of_a_layer_skips_its_attention_term(tiny_dirs, family, masked):
    loaded = load_model(ModelSpec(str(tiny_dirs[family]), device="cpu"))
    model = loaded.model
    ids = torch.randint(5, 99, (1, 7))
    gates = torch.ones(head_shape(model))
    gates[masked - 1] = 0
    plain, gated = states(model, ids), states(model, ids, gates)
    with torch.no_grad():
        expected = hand_layer(family, loaded.anatomy.layers[masked - 1], plain[masked - 1])
    torch.testing.assert_close(gated[masked], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gated[masked - 1], plain[masked - 1])  # the layers below are unchanged
    assert not torch.allclose(gated[masked], plain[masked], atol=1e-4)  # (the layer's attention did matter)


def test_a_head_mask_zeroes_exactly_that_heads_slice(tiny_dirs):
    model = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")).model
    seen = []
    module = model.bert.encoder.layer[1].attention.output.dense
    handle = module.register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))  # after the gate
    gates = torch.ones(head_shape(model))
    gates[1, 1] = 0
    try:
        states(model, torch.randint(5, 99, (1, 6)), gates)
    finally:
        handle.remove()
    context = seen[0]  # the projection's input as gated
    width = context.shape[-1] // 2
    assert torch.count_nonzero(context[..., width:]) == 0 and torch.count_nonzero(context[..., :width]) > 0


@pytest.mark.parametrize("family", ["bert", "albert", "roberta", "distilbert", "electra", "xlm-roberta"])
def test_the_logits_at_the_masked_positions_are_the_models_own_there(tiny_dirs, family):
    """mlm_importance reads the MLM head at the scored positions only: the same logits as the whole model's
    forward there, with heads gated or not, and the gradient reaches the gates the same way."""
    loaded = load_model(ModelSpec(str(tiny_dirs[family]), device="cpu"))
    scored = ScoredLogits(loaded)
    gates = torch.rand(head_shape(loaded.model), generator=torch.Generator().manual_seed(0))
    for batch in mlm_batches(loaded, TEXTS, batch_size=2, seed=1):
        where = batch.labels != -100
        with torch.no_grad(), head_gates(loaded.model, gates):
            whole = loaded.model(**batch.inputs).logits[where]
            part = scored(where, **batch.inputs)
        torch.testing.assert_close(part, whole, rtol=1e-5, atol=1e-5)
    plain = example_gradients(loaded.model, mlm_batches(loaded, TEXTS, seed=1))
    rows = [type(b)({**b.inputs, "scored": b.labels != -100}, b.labels[b.labels != -100])
            for b in mlm_batches(loaded, TEXTS, seed=1)]
    np.testing.assert_allclose(example_gradients(scored, rows, loaded.model), plain, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_importance_equals_a_finite_difference(tiny_dirs, family):
    loaded = load_model(ModelSpec(str(tiny_dirs[family]), device="cpu"))
    model = loaded.model.double()
    try:
        batches = mlm_batches(loaded, TEXTS, batch_size=2, seed=1)
        grad = example_gradients(model, batches[:1])  # the first batch's two examples, each its own gradient
        layers, heads = head_shape(model)
        eps = 1e-4
        for layer in range(layers):
            for head in range(heads):
                up, down = torch.ones(layers, heads, dtype=torch.float64), torch.ones(layers, heads,
                                                                                       dtype=torch.float64)
                up[layer, head] += eps
                down[layer, head] -= eps
                with torch.no_grad():
                    with head_gates(model, up):
                        high = example_losses(model, batches[0])[0]
                    with head_gates(model, down):
                        low = example_losses(model, batches[0])[0]
                numeric = ((high - low) / (2 * eps)).numpy()
                np.testing.assert_allclose(grad[:, layer, head], numeric, rtol=1e-4, atol=1e-8)
    finally:
        loaded.model.float()


def test_importance_is_normalised_per_layer_and_the_curve_is_whole(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    result = mlm_importance(loaded, TEXTS, steps=6, seeds=(0, 1, 2))
    table = result.importance
    assert list(table.columns) == ["layer", "head", "importance", "importance_low", "importance_high", "normalized",
                                   "order", "layer_prunable_share"]
    norms = table.groupby("layer")["normalized"].apply(lambda v: float(np.sqrt((v ** 2).sum())))
    np.testing.assert_allclose(norms.to_numpy(), 1.0)
    raw = table.pivot(index="layer", columns="head", values="importance").to_numpy()
    # the engine reads the head at the masked rows only; the whole model's logits give the same gradient
    np.testing.assert_allclose(raw, np.abs(example_gradients(loaded.model, mlm_batches(loaded, TEXTS))).mean(0),
                               rtol=1e-4, atol=1e-7)
    assert sorted(table["order"]) == list(range(len(table)))
    curve = result.pruning
    assert list(curve.columns) == ["order", "seed", "fraction", "masked", "accuracy"]
    assert set(curve["order"]) == {"importance", "random"} and set(curve["seed"].dropna()) == {0, 1, 2}
    assert curve.groupby(["order", "seed"], dropna=False).size().eq(len(curve[curve.order == "importance"])).all()
    layers, heads = head_shape(loaded.model)
    full = curve[curve.masked == layers * heads]["accuracy"]  # every head masked: one value whatever the order
    assert full.nunique() == 1
    base = mean_loss(loaded.model, mlm_batches(loaded, TEXTS), torch.ones(layers, heads))[1]
    assert (curve[curve.masked == 0]["accuracy"] == base).all()
    assert result.layers["prunable_share"].between(0, 1).all()


def test_the_pruning_order_is_increasing_importance(tiny_dirs, monkeypatch):
    """Planted importance: the curve masks the least important heads first, and each layer's prunable share
    stops at the first head whose masking costs more than a point."""
    import analysis.heads.importance as imp

    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    layers, heads = head_shape(loaded.model)
    planted = np.arange(layers * heads, dtype=float)[::-1].reshape(layers, heads) + 1
    monkeypatch.setattr(imp, "example_gradients", lambda *a, **k: planted[None])
    masked_sets = []
    real = imp.mean_loss

    def spy(model, batches, gates, encoder=None):
        masked_sets.append(frozenset(np.flatnonzero(gates.reshape(-1).numpy() == 0).tolist()))
        return real(model, batches, gates, encoder)

    monkeypatch.setattr(imp, "mean_loss", spy)
    result = imp.head_importance(loaded.model, mlm_batches(loaded, TEXTS), steps=layers * heads, seeds=(0,))
    order = result.importance.sort_values("order")
    normed = planted / np.linalg.norm(planted, axis=1, keepdims=True)
    assert np.all(np.diff(order["normalized"].to_numpy()) >= 0)
    np.testing.assert_allclose(result.importance["normalized"], normed.ravel())
    first = np.argsort(normed.ravel(), kind="stable")
    assert masked_sets[1] == {int(first[0])} and masked_sets[2] == {int(first[0]), int(first[1])}


def test_a_classifier_loss_and_its_labels(tmp_path):
    config = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, num_labels=2,
                        id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1},
                        architectures=["BertForSequenceClassification"])
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    tok = tiny_tokenizer()
    data = TextInputs(TEXTS.texts, labels=("pos", "pos", "neg", "neg", "pos"))
    batches = classifier_batches(tok, data, classifier_labels(model), 64, batch_size=2)
    result = head_importance(model, batches, steps=4, seeds=(0, 1, 2))
    assert result.info["targets"] == 5 and len(result.importance) == 4
    with pytest.raises(InputError, match="is not one of the classifier's classes"):
        classifier_batches(tok, TextInputs(TEXTS.texts, labels=("pos", "maybe", "neg", "neg", "pos")),
                           classifier_labels(model), 64)
    model.config.label2id = {}
    with pytest.raises(InputError, match="has no labels"):
        classifier_labels(model, "the checkpoint")


def test_bad_inputs_are_one_readable_line(tiny_dirs):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    layers, heads = head_shape(loaded.model)
    with pytest.raises(InputError, match=f"head {heads} is out of range") as err:
        check_head(loaded.model, 1, heads)
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="layer 0 is out of range"):
        check_head(loaded.model, 0, 0)
    with pytest.raises(InputError, match="corpus is empty"):
        mlm_importance(loaded, TextInputs(()))
    masked_lm = AutoModelForMaskedLM.from_config(loaded.model.config)
    with pytest.raises(InputError, match="no sequence-classification head"):
        classifier_labels(masked_lm, "the checkpoint")
    with pytest.raises(InputError, match="labelled set is empty"):
        classifier_batches(loaded.tokenizer, TextInputs(()), {"a": 0}, 64)
    with pytest.raises(InputError, match="head gates of shape"):
        with head_gates(loaded.model, torch.ones(layers + 1, heads)):
            pass


def test_a_stopped_importance_run_resumes_to_the_numbers_of_a_run_never_stopped(tiny_dirs, tmp_path):
    """Issue 36, "Jobs: ... cancel and resume": the gate gradient and every scored set of masked heads are kept in
    the checkpoint; a run stopped midway and started again scores only what is missing, and every table equals an
    uninterrupted run's exactly; the file is removed once complete; an unreadable one is ignored."""
    from analysis.heads.run import Stopped

    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    whole = mlm_importance(loaded, TEXTS, steps=4)
    checkpoint = tmp_path / "run.json"
    reports = []

    def cancel_at_third_pruning_step(stage, done, total):
        reports.append(stage)
        if stage == "pruning" and done == 3:
            raise KeyboardInterrupt  # a job's cancel, raised from its progress hook
    with pytest.raises(KeyboardInterrupt):
        mlm_importance(loaded, TEXTS, steps=4, progress=cancel_at_third_pruning_step, checkpoint=checkpoint)
    assert checkpoint.is_file()
    with pytest.raises(Stopped):
        mlm_importance(loaded, TEXTS, steps=4, should_stop=lambda: True, checkpoint=checkpoint)
    stages = []
    again = mlm_importance(loaded, TEXTS, steps=4, progress=lambda s, d, t: stages.append(s), checkpoint=checkpoint)
    assert "importance" not in stages  # the gate gradient was read back, not recomputed
    assert again.info["resumed_after"] == 1 + 3  # the gradient, then three scored sets (0% once for every order)
    for name in ("importance", "pruning", "layers"):
        pd.testing.assert_frame_equal(getattr(again, name), getattr(whole, name), check_exact=True, obj=name)
    assert not checkpoint.exists()
    checkpoint.write_text('{"gradient": [[0.1')  # cut short
    assert "resumed_after" not in mlm_importance(loaded, TEXTS, steps=4, checkpoint=checkpoint).info


def test_the_action_keys_its_checkpoint_by_model_rows_and_options(tiny_dirs, tmp_path):
    """What a heads importance job runs (analysis.heads.actions.importance with the job's resume folder): a
    cancelled run's checkpoint is found by the same options and not by others."""
    from analysis.heads import actions

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS.texts))
    spec = ModelSpec(str(tiny_dirs["bert"]), device="cpu")
    whole = actions.importance(spec, texts=texts, steps=2)

    def cancel(stage, done, total):
        if stage == "pruning" and done == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        actions.importance(spec, texts=texts, steps=2, progress=cancel, resume=tmp_path / "progress")
    other = actions.importance(spec, texts=texts, steps=2, seed=1, resume=tmp_path / "progress")  # another seed
    assert "resumed_after" not in other.info and len(list((tmp_path / "progress").glob("*.json"))) == 1
    again = actions.importance(spec, texts=texts, steps=2, resume=tmp_path / "progress")
    assert again.info["resumed_after"] == 3 and not list((tmp_path / "progress").glob("*.json"))
    for name in ("importance.csv", "pruning.csv"):
        pd.testing.assert_frame_equal(again.files[name], whole.files[name], check_exact=True)


def eq2_reference(model, loaded, texts, seed=1):
    """Michel et al. 2019 Eq. 2 computed plainly: one example at a time (mlm_batches of one text, the same masks
    as any batch size), its loss the mean cross-entropy over its masked tokens, one backward each, the absolute
    value per example, then the mean over examples. Returns (importance, per-example |gradient| array)."""
    per_example = []
    for batch in mlm_batches(loaded, texts, batch_size=1, seed=seed):
        gates = torch.ones(head_shape(model), dtype=next(model.parameters()).dtype, requires_grad=True)
        with head_gates(model, gates):
            logits = model(**batch.inputs).logits[0]
            torch.nn.functional.cross_entropy(logits, batch.labels[0], ignore_index=-100).backward()
        per_example.append(gates.grad.abs().double().numpy())
    per_example = np.stack(per_example)
    return per_example.mean(0), per_example


@pytest.mark.parametrize("family", ["bert", "albert", "distilbert"])
def test_importance_is_michel_eq2_the_mean_of_per_example_absolute_gradients(tiny_dirs, family):
    """Issue 43 item 5: I_h = E_x |dL(x)/dxi_h| (Eq. 2), not |E_x dL(x)/dxi_h|: the engine (batched, per-example
    gates, the MLM head read at the masked rows only) equals a plain loop of one backward per example, and its
    interval is Student's t over the examples' values (scipy)."""
    from scipy import stats

    loaded = load_model(ModelSpec(str(tiny_dirs[family]), device="cpu"))
    expected, per_example = eq2_reference(loaded.model, loaded, TEXTS)
    result = mlm_importance(loaded, TEXTS, batch_size=3, seed=1, steps=2, seeds=(0,))
    table = result.importance
    got = table.pivot(index="layer", columns="head", values="importance").to_numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)
    signed_mean = np.abs(np.mean([g for g in per_example], 0))  # what the paper's Eq. 2 is not (unless signs agree)
    assert not np.allclose(expected, signed_mean) or (per_example >= 0).all()
    flat = per_example.reshape(len(per_example), -1)
    low, high = stats.t.interval(0.95, len(flat) - 1, loc=flat.mean(0), scale=stats.sem(flat, axis=0))
    np.testing.assert_allclose(table["importance_low"], low, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(table["importance_high"], high, rtol=1e-4, atol=1e-7)
    assert (table["importance_low"] <= table["importance"]).all() and (table["importance"] <=
                                                                          table["importance_high"]).all()
    assert result.info["examples"] == len(TEXTS)
    assert "E_x |dL(x)/dxi_h|" in result.info["importance"]


@pytest.mark.parametrize(("steps", "orders"), [(4, 3), (2, 0), (6, 1)])
def test_the_pass_estimate_brackets_the_passes_made(tiny_dirs, monkeypatch, steps, orders):
    """Issue 43 item 4: the page's estimate before the click (pruning_passes) contains the passes a run makes,
    counted by a spy on mean_loss (one call = one pass) plus the gradient's three."""
    import analysis.heads.importance as imp

    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    layers, heads = head_shape(loaded.model)
    calls = []
    real = imp.mean_loss
    monkeypatch.setattr(imp, "mean_loss", lambda *a, **k: calls.append(1) or real(*a, **k))
    imp.mlm_importance(loaded, TEXTS, steps=steps, seeds=tuple(range(orders)))
    low, high = imp.pruning_passes(layers, heads, steps, orders)
    assert low <= 3 + len(calls) <= high, (low, 3 + len(calls), high)
