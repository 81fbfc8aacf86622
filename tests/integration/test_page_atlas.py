"""AppTest of the layer atlas page: the numbers it shows are the engine's; bad input is a message."""

import pandas as pd
import pytest

from analysis.atlas.atlas import AtlasConfig, atlas
from analysis.core.inputs import read_file
from models.loading import ModelSpec, load_model
from models.spec import short_name
from tests.support.pages import run_page
from ui.inputs import DEMO_LABELLED

PAGE = "pages/2_Layer_Atlas.py"


@pytest.mark.slow
def test_atlas_page_shows_the_engine_numbers(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    assert not at.exception and not at.error
    at.button(key="atlas_run").click().run()
    assert not at.exception and not at.error
    expected = atlas(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")),
                     read_file(DEMO_LABELLED, label_column="label"), AtlasConfig())
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True), expected.separability)
    assert len(at.get("plotly_chart")) == 3  # small multiples, separability curve, CKA
    assert "[CLS] is just its token and position embedding" in at.info[0].value


@pytest.mark.slow
def test_pairs_mean_pooling_and_a_second_model(tiny_dirs):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.checkbox(key="atlas_demo_pair").check().run()
    at.radio(key="atlas_pool").set_value("mean").run()
    at.text_input(key="atlas_layers").set_value("all").run()
    at.text_input(key="atlas_compare").set_value(str(tiny_dirs["roberta"])).run()
    at.button(key="atlas_run").click().run()
    assert not at.exception and not at.error
    assert len(at.get("plotly_chart")) == 4  # two grids, one curve, one CKA
    assert at.radio(key="atlas_cka").options == ["bert", "roberta"]  # short names, never the server's path
    expected = atlas(load_model(ModelSpec(str(tiny_dirs["roberta"]), device="cpu")),
                     read_file(DEMO_LABELLED, pair_column="aspect", label_column="label"),
                     AtlasConfig(pooling="mean", layers="all"))
    pd.testing.assert_frame_equal(at.dataframe[1].value.reset_index(drop=True), expected.separability)


def test_bad_layers_and_missing_model_are_messages(tiny_dirs, tmp_path):
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_input(key="atlas_layers").set_value("9").run()
    assert not at.exception and "does not exist" in at.error[0].value
    at.text_input(key="atlas_layers").set_value("-2:").run()
    at.text_input(key="atlas_compare").set_value(str(tmp_path / "missing")).run()
    at.button(key="atlas_run").click().run()
    assert not at.exception
    assert "Second model" in at.error[0].value and len(at.get("plotly_chart")) == 3


def test_more_rows_than_the_limit_needs_an_explicit_sample(tiny_dirs, monkeypatch):
    monkeypatch.setenv("LAYERLENS_ATLAS_MAX_ROWS", "100")
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    assert not at.exception and "more than this page's limit of 100" in at.warning[0].value
    assert "atlas_run" not in [b.key for b in at.button]  # nothing runs until the sample is chosen
    at.checkbox(key="atlas_sample").check().run()
    at.button(key="atlas_run").click().run()
    assert not at.exception and not at.error
    assert any(c.value.startswith("100 rows") for c in at.caption)


def figure(element) -> dict:
    """A Plotly chart shown by the page, as the figure's JSON."""
    import json

    return json.loads(element.proto.spec)


def deeper_export(tiny_dirs, tmp_path_factory):
    """A 5-layer duplication export of the 3-layer tiny BERT, made as the duplication page makes it."""
    from analysis.duplication.export import export

    out = tmp_path_factory.mktemp("deeper") / "bert_deeper"
    if not out.is_dir():
        export(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")), [0, 0, 1, 1, 2], out)
    return out


@pytest.mark.slow
def test_a_second_model_of_another_depth_keeps_its_own_layers(tiny_dirs, tmp_path_factory):
    """Issue 24.2: comparing with a deeper model (a duplication export) crashed; each grid is titled with its
    own model's layer names, each curve sits at its own indices, and relative depth puts layer i of L at i / L."""
    deeper = deeper_export(tiny_dirs, tmp_path_factory)
    own = {short_name(str(tiny_dirs["bert"])): load_model(ModelSpec(str(tiny_dirs["bert"]),
                                                                   device="cpu")).anatomy.layer_names(),
           short_name(str(deeper)): load_model(ModelSpec(str(deeper), device="cpu")).anatomy.layer_names()}
    assert own[short_name(str(deeper))][3] == "3 ← 2"
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.text_input(key="atlas_layers").set_value("all").run()
    at.text_input(key="atlas_compare").set_value(str(deeper)).run()
    at.button(key="atlas_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    charts = [figure(c) for c in at.get("plotly_chart")]
    for grid, names in zip(charts[:2], own.values(), strict=True):
        assert [a["text"] for a in grid["layout"]["annotations"]] == names
    curve = charts[2]
    for label, names in own.items():
        probe = [t for t in curve["data"] if t.get("legendgroup") == label and t.get("customdata")]
        assert probe and all(t["x"] == list(range(len(names))) for t in probe)
        assert all([c[0] for c in t["customdata"]] == names for t in probe)
    at.radio(key="atlas_cka").set_value(short_name(str(deeper))).run()
    assert figure(at.get("plotly_chart")[3])["data"][0]["y"] == own[short_name(str(deeper))]  # its CKA, its own names
    at.checkbox(key="atlas_relative").check().run()
    assert not at.exception
    curve = figure(at.get("plotly_chart")[2])
    assert "relative depth" in curve["layout"]["xaxis2"]["title"]["text"]
    for label, names in own.items():
        for t in (t for t in curve["data"] if t.get("legendgroup") == label and t.get("customdata")):
            assert t["x"] == pytest.approx([i / (len(names) - 1) for i in range(len(names))])


@pytest.mark.slow
def test_titles_name_the_pooling_and_the_pca_variance_and_the_times_are_split(tiny_dirs):
    """Issue 24.10: the title names the pooling used, each PCA panel says its axes' share of the variance (the
    engine's numbers), and the caption says which stage took the time."""
    import re

    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.radio(key="atlas_pool").set_value("mean").run()
    at.button(key="atlas_run").click().run()
    assert not at.exception and not at.error
    expected = atlas(load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu")),
                     read_file(DEMO_LABELLED, label_column="label"), AtlasConfig(pooling="mean"))
    grid = figure(at.get("plotly_chart")[0])
    assert grid["layout"]["title"]["text"].endswith("PCA of the mean of the text's tokens")
    for n, ratio in enumerate(expected.info["explained_variance"]):
        suffix = "" if n == 0 else str(n + 1)
        assert grid["layout"][f"xaxis{suffix}"]["title"]["text"] == f"PC1 ({100 * ratio[0]:.1f}%)"
        assert grid["layout"][f"yaxis{suffix}"]["title"]["text"] == f"PC2 ({100 * ratio[1]:.1f}%)"
    times = [c.value for c in at.caption if "scoring" in c.value]
    assert times and re.search(r"vectors (read from the disk cache|computed in [\d.]+ s) · scoring [\d.]+ s · "
                               r"projection \(PCA\) [\d.]+ s", times[0])


@pytest.mark.slow
def test_the_random_weights_control_is_a_second_model():
    """'random' in Compare with: the sidebar model's architecture with seeded random weights, labelled so."""
    at = run_page(PAGE)
    at.text_input(key="atlas_compare").set_value("random").run()
    at.button(key="atlas_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.radio(key="atlas_cka").options == ["demo", "demo with random weights"]


def test_the_word_order_demo_set_is_balanced_bigram_shift():
    """The bundled word-order set: 500 original and 500 swapped sentences, each from a different treebank
    sentence."""
    from analysis.core.inputs import DEMO_WORDORDER

    frame = pd.read_csv(DEMO_WORDORDER, keep_default_na=False)
    assert list(frame.columns) == ["text", "label", "sent_id"] and frame["sent_id"].is_unique
    assert frame["label"].value_counts().to_dict() == {"original": 500, "swapped": 500}


def test_the_word_order_demo_set_is_what_its_script_writes_from_the_treebank(tmp_path):
    """Rebuilt from UD English-EWT dev (shared data): the same bytes; every swapped row is its treebank sentence
    with two adjacent words exchanged (the same words, one pair in the other order)."""
    from analysis.core.inputs import DEMO_WORDORDER
    from scripts.make_demo_wordorder import main, sentences, text_of
    from tests.support.data import shared_file

    source = shared_file("ud_english_ewt/en_ewt-ud-dev.conllu.gz")
    main(source, tmp_path / "again.csv")
    assert (tmp_path / "again.csv").read_bytes() == DEMO_WORDORDER.read_bytes()
    original = {i: (w, s) for i, w, s in sentences(source)}
    frame = pd.read_csv(DEMO_WORDORDER, keep_default_na=False)
    for row in frame.itertuples():
        words, spaces = original[row.sent_id]
        if row.label == "original":
            assert row.text == text_of(words, spaces)
            continue
        swaps = [k for k in range(len(words) - 1)
                 if row.text == text_of([*words[:k], words[k + 1], words[k], *words[k + 2:]], spaces)]
        assert len(swaps) == 1 and words[swaps[0]] != words[swaps[0] + 1], row


def test_the_word_order_set_is_offered_and_says_what_it_is():
    at = run_page(PAGE)
    at.radio(key="atlas_source").set_value("Demo word-order set").run()
    assert not at.exception
    assert any("bigram shift" in c.value for c in at.caption)
    at.radio(key="atlas_source").set_value("Demo sentiment set").run()
    assert any("Lexically easy" in c.value for c in at.caption)


def test_a_sentence_encoder_defaults_to_its_own_pooling(tiny_dirs, tmp_path):
    """Issue 53 item 17: for a model that pools by mean (MiniLM), the atlas's vector is the model's own pooling by
    default, not [CLS]; a masked LM keeps [CLS]."""
    from tests.unit.models.test_any_checkpoint import sentence_transformers_dir

    encoder = sentence_transformers_dir(tiny_dirs["bert"], tmp_path / "st", mode="mean")
    at = run_page(PAGE, model=str(encoder))
    assert not at.exception, at.exception
    assert at.radio(key="atlas_pool").value == "model"
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    assert at.radio(key="atlas_pool").value == "cls"
