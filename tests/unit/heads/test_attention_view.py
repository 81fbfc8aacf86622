"""The head view (analysis.heads.view) against plain transformers, two models side by side and their tokenizer
check, and the numbers in every attention-heads figure (analysis.heads.plots) against the engine's arrays."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from analysis.core.inputs import InputError, TextInputs
from analysis.core.treebank import read_conllu
from analysis.heads import plots
from analysis.heads.model import load_eager
from analysis.heads.run import analyse
from analysis.heads.view import compare_views, head_rows, head_view, same_tokens
from models.loading import ModelSpec, load_model
from tests.support.data import FIXTURES
from tests.unit.structure.test_structure_words import families  # noqa: F401  (fixture)

SENTENCE = "the film is good , the film is fun ."


@pytest.fixture(scope="module")
def bert(tiny_dirs):
    return load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))


@pytest.fixture(scope="module")
def view(bert):
    return head_view(bert, SENTENCE)


@pytest.mark.parametrize("family", ["bert", "roberta", "albert"])
def test_the_view_equals_plain_transformers(tiny_dirs, family):
    directory = tiny_dirs[family]
    got = head_view(load_eager(ModelSpec(str(directory), device="cpu")), SENTENCE)
    tok = AutoTokenizer.from_pretrained(directory)
    enc = tok(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        maps = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()(
            **enc, output_attentions=True).attentions
    assert got.ids == enc["input_ids"][0].tolist() and got.tokens == tok.convert_ids_to_tokens(got.ids)
    np.testing.assert_allclose(got.attention, torch.stack([a[0] for a in maps]).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.attention.sum(-1), 1, atol=1e-5)


def test_the_default_path_is_refused_and_bad_sentences_are_one_line(tiny_dirs, bert, view):
    with pytest.raises(InputError, match="attention path"):
        head_view(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")), SENTENCE)
    with pytest.raises(InputError, match="no sentence"):
        head_view(bert, "   ")
    with pytest.raises(InputError, match="over the model's limit of 64"):
        head_view(bert, "word " * 80)
    with pytest.raises(InputError, match="head 9 is out of range: each layer has heads 0 to 1"):
        view.head(1, 9)
    with pytest.raises(InputError, match="layer 0 is out of range"):
        head_rows(view, 0)


def test_two_models_side_by_side_and_their_difference(tiny_dirs, bert):
    twin = load_eager(ModelSpec(f"random:{tiny_dirs['bert']}", device="cpu"))
    both = compare_views(bert, twin, SENTENCE)
    assert both.a.tokens == both.b.tokens
    np.testing.assert_allclose(both.difference, head_view(twin, SENTENCE).attention - both.a.attention, atol=1e-6)
    fig = plots.compared_heads(both.a, both.b, 2, 1)
    np.testing.assert_allclose(fig.data[0].z, both.a.attention[1, 1])
    np.testing.assert_allclose(fig.data[1].z, both.b.attention[1, 1])
    np.testing.assert_allclose(fig.data[2].z, both.difference[1, 1], atol=1e-7)


def test_different_tokenizers_or_shapes_are_one_line(tiny_dirs, families, bert):  # noqa: F811
    bpe = load_eager(ModelSpec(str(families["bpe"]), device="cpu"))
    with pytest.raises(InputError, match="tokenise the sentence differently .* token 0 is '\\[CLS\\]' \\(id \\d+\\) "
                       "for .* and '<s>' \\(id \\d+\\) for"):
        compare_views(bert, bpe, SENTENCE)
    roberta = load_eager(ModelSpec(str(tiny_dirs["roberta"]), device="cpu"))  # the same WordPiece, 2 layers
    with pytest.raises(InputError, match="3 layers x 2 heads and .* 2 x 2: their heads cannot be compared"):
        compare_views(bert, roberta, SENTENCE)
    with pytest.raises(InputError, match="token 2 is 'b' \\(id 3\\) for A and 'c' \\(id 4\\) for B"):
        same_tokens(("A", [1, 2, 3], ["x", "a", "b"]), ("B", [1, 2, 4], ["x", "a", "c"]))
    with pytest.raises(InputError, match="token 2 is past the end for A"):
        same_tokens(("A", [1, 2], ["x", "a"]), ("B", [1, 2, 4], ["x", "a", "c"]))
    with pytest.raises(InputError, match="token 2 is 'the' \\(id 3\\) for A and 'the' \\(id 9\\) for B"):
        same_tokens(("A", [1, 2, 3], ["x", "a", "the"]), ("B", [1, 2, 9], ["x", "a", "the"]))  # spelt alike


def test_head_and_layer_figures_draw_the_views_numbers(view):
    fig = plots.head_heatmap(view, 2, 1)
    np.testing.assert_array_equal(fig.data[0].z, view.attention[1, 1])
    assert list(fig.layout.xaxis.ticktext) == view.tokens and list(fig.layout.xaxis.tickvals) == \
        list(range(len(view.tokens)))  # repeated tokens ("the", "film") keep their own columns
    fig = plots.layer_heads(view, 1)
    assert len(fig.data) == view.heads
    for h, trace in enumerate(fig.data):
        np.testing.assert_array_equal(trace.z, view.attention[0, h])
    rows = pd.DataFrame(head_rows(view, 1, 1))
    assert len(rows) == len(view.tokens) ** 2
    np.testing.assert_allclose(rows["weight"].to_numpy().reshape(len(view.tokens), -1), view.attention[0, 1])


@pytest.fixture(scope="module")
def result(bert):
    return analyse(bert, read_conllu(FIXTURES / "ud_tiny_train.conllu"), min_count=1)


def test_statistic_heatmaps_and_the_head_map_draw_the_tables(result):
    heads = result.heads
    for statistic in ("entropy", "previous", "sep"):
        fig = plots.statistic_heatmap(heads, statistic)
        z = np.asarray(fig.data[0].z)
        for row in heads.itertuples():
            assert z[row.layer - 1, row.head] == pytest.approx(getattr(row, statistic))
            low, high = fig.data[0].customdata[row.layer - 1][row.head]
            assert (low, high) == pytest.approx((getattr(row, f"{statistic}_low"), getattr(row, f"{statistic}_high")))
    fig = plots.head_map(result.clusters)
    np.testing.assert_allclose(fig.data[0].x, result.clusters["x"])
    np.testing.assert_allclose(fig.data[0].y, result.clusters["y"])
    assert list(fig.data[0].marker.color) == list(result.clusters["layer"])
    assert fig.data[0].text[5] == f"L{result.clusters.layer[5]}-H{result.clusters['head'][5]}"


def test_the_relations_figure_draws_best_heads_intervals_and_baselines(result):
    table = result.relations
    fig = plots.relations_figure(table, "head_to_dependent")
    rows = table[table.direction == "head_to_dependent"].sort_values("accuracy")
    assert len(rows)
    best, selection, base = fig.data
    assert list(best.y) == list(rows.relation) and list(base.y) == list(rows.relation)
    np.testing.assert_allclose(selection.x, rows.selection_accuracy)  # where the head was chosen, hollow
    np.testing.assert_allclose(best.x, rows.accuracy)
    np.testing.assert_allclose(np.asarray(best.x) - np.asarray(best.error_x.arrayminus), rows.low)
    np.testing.assert_allclose(np.asarray(best.x) + np.asarray(best.error_x.array), rows.high)
    np.testing.assert_allclose(base.x, rows.baseline_accuracy)
    assert list(base.customdata) == list(rows.baseline_offset)


def test_importance_and_the_pruning_curve(tiny_dirs):
    from analysis.heads.importance import mlm_importance

    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    got = mlm_importance(loaded, TextInputs(("the film is good .", "i liked the movie , and it was fun !",
                                             "not very good at all")), steps=4)
    fig = plots.importance_heatmap(got.importance)
    z = np.asarray(fig.data[0].z)
    for row in got.importance.itertuples():
        assert z[row.layer - 1, row.head] == pytest.approx(row.normalized)
    fig = plots.pruning_curve(got.pruning)
    band, mean, ordered = fig.data
    random = got.pruning[got.pruning.order == "random"].groupby("fraction").accuracy
    np.testing.assert_allclose(mean.y, random.mean())
    np.testing.assert_allclose(band.y, list(random.max()) + list(random.min())[::-1])
    mine = got.pruning[got.pruning.order == "importance"]
    np.testing.assert_allclose(ordered.x, mine.fraction)
    np.testing.assert_allclose(ordered.y, mine.accuracy)


def test_one_head_and_the_small_multiples_share_one_colour_scale(bert):
    """Issue 43 (low): the single-head map scaled to its own maximum while the small multiples used 0..1."""
    view = head_view(bert, "the film is good .")
    one = plots.head_heatmap(view, 1, 0).data[0]
    many = plots.layer_heads(view, 1).layout.coloraxis
    assert (one.zmin, one.zmax) == (many.cmin, many.cmax) == (0, 1) and one.colorscale == many.colorscale
