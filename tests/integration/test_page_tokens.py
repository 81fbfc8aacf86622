"""AppTest of the Token atlas page: the map's points, the neighbour tables and the geometry are the engine's; the
density is datashader's count of every token; bad input is one message."""

import base64
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from analysis.core.activations import max_input_length
from analysis.tokens.corpus import read_corpus
from analysis.tokens.density import extent, map_figure, rasterise, sample_rows
from analysis.tokens.geometry import geometry
from analysis.tokens.maps import pca_map
from analysis.tokens.search import across_layers, find_rows, summary
from analysis.tokens.vectors import extract
from models.loading import ModelSpec, load_model
from tests.support.data import FIXTURES
from tests.support.pages import run_page

PAGE = "pages/8_Token_atlas.py"


@pytest.fixture
def corpus_root(tmp_path, monkeypatch):
    shutil.copy(FIXTURES / "ud_tiny_train.conllu", tmp_path / "tiny.conllu")
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(tmp_path))
    return tmp_path


def engine(model_dir, path):
    loaded = load_model(ModelSpec(str(model_dir), device="cpu"))
    corpus = read_corpus(loaded.tokenizer, path, max_input_length(loaded), limit=300)
    return extract(loaded, corpus)


def extracted(model_dir, root):
    at = run_page(PAGE, model=str(model_dir))
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.selectbox(key="tokens_file").set_value(root / "tiny.conllu").run()
    at.button(key="tokens_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    return at


def figure(at) -> dict:
    return json.loads(at.get("plotly_chart")[0].proto.spec)


def values(array) -> np.ndarray:
    """A Plotly JSON array: a list, or a typed array (``{"dtype": "f4", "bdata": base64}``)."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=np.dtype(array["dtype"]))
    return np.asarray(array)


def test_the_map_shows_the_engines_coordinates_and_every_token(tiny_dirs, corpus_root):
    at = extracted(tiny_dirs["bert"], corpus_root)
    tv = engine(tiny_dirs["bert"], corpus_root / "tiny.conllu")
    tokens = tv.tokens()
    assert any(f"{tv.rows:,} tokens" in c.value and "CoNLL" in c.value for c in at.caption)
    # the map: every sample point sits at the engine's PCA coordinates of its row; the density counts every token
    coords, _ = pca_map(tv, tv.layers[-1])
    spec = figure(at)
    traces = spec["data"]  # coloured by token: one trace per frequent token, then "other"
    rows = np.concatenate([values(t["customdata"]) for t in traces]).astype(np.int64)
    np.testing.assert_array_equal(np.sort(rows), sample_rows(tv.rows, 5000))
    np.testing.assert_allclose(np.concatenate([values(t["x"]) for t in traces]), coords[rows, 0], rtol=1e-6)
    np.testing.assert_allclose(np.concatenate([values(t["y"]) for t in traces]), coords[rows, 1], rtol=1e-6)
    assert [t["name"] for t in traces][:3] == tokens["token"].value_counts().index[:3].tolist()
    assert spec["layout"]["images"][0]["source"].startswith("data:image/png;base64,")  # inline: no request
    shown = next(c.value for c in at.caption if "Shown: Density (datashader)" in c.value)
    assert "Embedding Atlas needs WebGPU" in shown and f"{tv.rows:,} tokens counted" in shown
    # Embedding Atlas is offered first; a browser without WebGPU (or not yet probed, as here) gets the density view
    assert at.radio(key="tokens_renderer").options == ["Embedding Atlas (WebGPU)", "Density (datashader)"]
    assert at.radio(key="tokens_renderer").value == "Embedding Atlas (WebGPU)"
    # colour by UPOS: one trace per tag; a text search rings that word's tokens
    at.selectbox(key="tokens_colour").set_value("upos").run()
    names = {t["name"] for t in figure(at)["data"]}
    assert names <= set(tokens["upos"]) | {"other"} and len(names) > 2
    at.text_input(key="tokens_search").set_value("film").run()
    assert not at.exception and not at.error
    ring = figure(at)["data"][-1]
    assert ring["name"] == "search matches"
    assert sorted(values(ring["customdata"]).tolist()) == find_rows(tokens, word="film").tolist()


@pytest.mark.slow
def test_the_neighbour_tables_are_the_engines(tiny_dirs, corpus_root):
    at = extracted(tiny_dirs["bert"], corpus_root)
    tv = engine(tiny_dirs["bert"], corpus_root / "tiny.conllu")
    tokens = tv.tokens()
    at.radio(key="tokens_view").set_value("Neighbours").run()
    at.text_input(key="tokens_word").set_value("film").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    row = at.selectbox(key="tokens_occurrence").value
    assert row == find_rows(tokens, word="film")[0]
    want = across_layers(tv, row, 10)
    layer = tv.layers[-1]
    one = at.dataframe[0].value.reset_index(drop=True)
    expect = want[want["layer"] == layer].reset_index(drop=True)
    pd.testing.assert_frame_equal(one[["rank", "cosine", "token", "word", "text_id", "position"]],
                                  expect[["rank", "cosine", "token", "word", "text_id", "position"]])
    assert one["marked"].tolist() == expect["marked"].tolist()
    side = at.dataframe[1].value
    for x in tv.layers:
        part = want[want["layer"] == x]
        cells = [f"{t} ({c:.2f})" for t, c in zip(part["token"], part["cosine"], strict=True)]
        assert side[f"hidden state {x}"].tolist() == cells
    pd.testing.assert_frame_equal(at.dataframe[2].value.reset_index(drop=True), summary(tokens.iloc[row], want))
    assert len(at.get("plotly_chart")) == 2  # the UPOS and DEPREL histograms of the neighbours
    at.checkbox(key="tokens_standardize").check().run()
    assert not at.exception and not at.error
    std = across_layers(tv, row, 10, standardize=True)
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True)[["rank", "cosine", "token"]],
                                  std[std["layer"] == layer].reset_index(drop=True)[["rank", "cosine", "token"]])
    overlap = at.dataframe[3].value
    assert overlap["shared_with_raw"].between(0, 1).all() and len(overlap) == len(tv.layers)
    # by text id and position
    at.radio(key="tokens_query_by").set_value("text id and position").run()
    at.number_input(key="tokens_text_id").set_value(int(tokens["text_id"].iat[row])).run()
    at.number_input(key="tokens_position").set_value(int(tokens["position"].iat[row])).run()
    assert not at.exception and not at.error
    assert at.dataframe[0].value["cosine"].tolist() == std[std["layer"] == layer]["cosine"].tolist()


@pytest.mark.slow
def test_the_geometry_tables_are_the_engines(tiny_dirs, corpus_root):
    at = extracted(tiny_dirs["bert"], corpus_root)
    tv = engine(tiny_dirs["bert"], corpus_root / "tiny.conllu")
    at.radio(key="tokens_view").set_value("Geometry").run()
    at.button(key="tokens_geo_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    table, rogue = geometry(tv)
    pd.testing.assert_frame_equal(at.dataframe[0].value.reset_index(drop=True), table)
    pd.testing.assert_frame_equal(at.dataframe[1].value.reset_index(drop=True), rogue)
    assert len(at.get("plotly_chart")) == 1
    assert any("Anisotropy" in c.value and "adjusted" in c.value for c in at.caption)


@pytest.mark.slow
def test_a_corpus_without_tokens_and_words_not_in_it_are_one_message_each(tiny_dirs, corpus_root):
    (corpus_root / "specials.txt").write_text("[CLS] [SEP]\n[SEP]\n")
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.selectbox(key="tokens_file").set_value(corpus_root / "specials.txt").run()
    at.button(key="tokens_run").click().run()
    assert not at.exception and len(at.error) == 1 and "no counted token" in at.error[0].value
    at = extracted(tiny_dirs["bert"], corpus_root)
    at.text_input(key="tokens_search").set_value("zebra").run()
    assert not at.exception and len(at.error) == 1 and "zebra" in at.error[0].value
    assert len(at.get("plotly_chart")) == 1  # the map is still there
    at.radio(key="tokens_view").set_value("Neighbours").run()
    at.text_input(key="tokens_word").set_value("zebra").run()
    assert not at.exception and len(at.error) == 1 and "'zebra'" in at.error[0].value  # named, nearest spellings
    at.text_input(key="tokens_word").set_value("filmm").run()
    assert "nearest spellings present: film" in at.error[0].value
    at.radio(key="tokens_query_by").set_value("text id and position").run()
    at.number_input(key="tokens_text_id").set_value(10_000).run()
    assert not at.exception and len(at.error) == 1 and "no text 10000: text ids 0.." in at.error[0].value


def test_bad_layers_and_a_labelled_csv(tiny_dirs, corpus_root):
    rows = "id,sentence,label\n" + "".join(f"{i},the film is {'good' if i % 2 else 'bad'} .,{i % 2}\n"
                                            for i in range(12))
    (corpus_root / "labelled.csv").write_text(rows)
    at = run_page(PAGE, model=str(tiny_dirs["bert"]))
    at.selectbox(key="tokens_file").set_value(corpus_root / "labelled.csv").run()
    assert at.selectbox(key="tokens_column").value == "sentence" and at.selectbox(key="tokens_label").value == "label"
    at.text_input(key="tokens_layers").set_value("9").run()
    assert not at.exception and len(at.error) == 1 and "does not exist" in at.error[0].value
    at.text_input(key="tokens_layers").set_value("0,3").run()
    at.button(key="tokens_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.selectbox(key="tokens_map_layer").options == ["hidden state 0", "hidden state 3"]
    at.selectbox(key="tokens_colour").set_value("label").run()
    assert {t["name"] for t in figure(at)["data"]} == {"0", "1"}
    # the cached extraction is offered in the other mode
    at.radio(key="tokens_source").set_value("Open a cached extraction").run()
    assert not at.exception and not at.error
    assert any("12 texts" in o for o in at.selectbox(key="tokens_cached").options)


def test_the_density_counts_every_point_as_numpy_does():
    rng = np.random.default_rng(0)
    xy = np.concatenate([rng.normal(size=(20_000, 2)), rng.normal(3, 0.2, size=(2_000, 2))]).astype(np.float32)
    for how in ("log", "eq_hist"):
        d = rasterise(xy, width=64, height=48, how=how)
        counts, _, _ = np.histogram2d(xy[:, 1], xy[:, 0], bins=[48, 64], range=[d.y_range, d.x_range])
        np.testing.assert_array_equal(d.counts, counts)  # row 0 = lowest y
        assert d.points == len(xy) and d.image.size == (64, 48)
        image = np.asarray(d.image)
        (x0, x1), (y0, y1) = d.x_range, d.y_range
        i, j = int((y1 - 3) / (y1 - y0) * 48), int((3 - x0) / (x1 - x0) * 64)
        assert image[i, j, 3] > 0 and image[0, 0, 3] == 0  # the (3, 3) cluster drawn top right; empty is transparent
    (a, b), (c, e) = extent(np.array([[1.0, 2.0], [1.0, 2.0]]))
    assert a < 1 < b and c < 2 < e  # a single point still has an extent
    fig = map_figure(d, pd.DataFrame({"x": [0.0], "y": [0.0], "row": [7], "hover": ["<b>x</b>"], "c": ["a"]}), "c")
    assert fig.data[0].customdata.tolist() == [7] and fig.layout.images[0].layer == "below"


@pytest.mark.slow  # umap-learn's numba compilation: tens of seconds in a fresh process
def test_the_umap_map_shows_the_engines_coordinates(tiny_dirs, corpus_root):
    from analysis.tokens.maps import umap_map

    at = extracted(tiny_dirs["bert"], corpus_root)
    at.radio(key="tokens_method").set_value("umap").run()
    at.button(key="tokens_umap_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    tv = engine(tiny_dirs["bert"], corpus_root / "tiny.conllu")
    coords, meta = umap_map(tv, tv.layers[-1])
    traces = figure(at)["data"]
    rows = np.concatenate([values(t["customdata"]) for t in traces]).astype(np.int64)
    np.testing.assert_allclose(np.concatenate([values(t["x"]) for t in traces]), coords[rows, 0], rtol=1e-6)
    np.testing.assert_allclose(np.concatenate([values(t["y"]) for t in traces]), coords[rows, 1], rtol=1e-6)
    assert any("Axes: UMAP (cosine" in c.value for c in at.caption)


@pytest.mark.slow
def test_umap_waits_for_a_click_then_runs_under_its_own_progress_and_a_stop(tiny_dirs, corpus_root, monkeypatch):
    """UMAP is minutes at scale: it starts on a click (a cached map shows at once), and runs under a progress bar
    fed by its stages (the page passes a progress callback) with the Stop button already shown; a map from the
    cache needs neither. umap-learn itself is replaced here by the PCA map (its wiring, not its numbers)."""
    import streamlit as st

    import analysis.tokens.maps as maps

    calls = []

    def fake_umap(tv, layer, progress=None, **kw):
        calls.append((layer, progress is not None))
        if progress is not None:  # computed now: the Stop is on the page before the work starts
            assert "stop_UMAP map" in st.session_state
            for stage, done, n in [(maps.FIT_GRAPH, 0, 50), (maps.FIT_EPOCH, 37, 200), (maps.LAYOUT, 10, 40)]:
                progress(stage, done, n)
        coords, _ = pca_map(tv, layer)
        return coords, {"rows": tv.rows, "sample": 50, "seed": 0, "n_neighbors": 15, "transformed_rows": 40}

    monkeypatch.setattr(maps, "umap_map", fake_umap)
    import ui.results

    fresh = ui.results.ResultStore()  # neither the disk's nor the process's result cache (another test's UMAP)
    monkeypatch.setattr(ui.results, "result_store", lambda: fresh)
    monkeypatch.setattr(maps, "cached_umap", lambda *a, **k: None)
    at = extracted(tiny_dirs["bert"], corpus_root)
    at.radio(key="tokens_method").set_value("umap").run()
    assert not at.exception and not at.error and not calls and not at.get("plotly_chart")
    assert any("is not cached" in c.value and "Stop" in c.value for c in at.caption)
    at.button(key="tokens_umap_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert calls == [(at.selectbox(key="tokens_map_layer").value, True)] and at.get("plotly_chart")
    assert maps.progress_text(maps.FIT_EPOCH, 37, 200) == "UMAP fit: epoch 37 of 200"
    monkeypatch.setattr(maps, "cached_umap", lambda *a, **k: {"cached": True})  # from the cache: no click
    at.selectbox(key="tokens_map_layer").set_value(0).run()
    assert not at.exception and not at.error and at.get("plotly_chart")
    assert "tokens_umap_run" not in [b.key for b in at.button] and calls[-1] == (0, False)


def test_a_browser_with_webgpu_gets_embedding_atlas_over_the_layers_table(tiny_dirs, corpus_root, monkeypatch):
    """The browser's answer (WebGPU with shader-f16) is the component's state: the page writes the layer's atlas
    table (atlas_table: the engine's coordinates and tokens) and serves it, and says so instead of the density."""
    import ui.embedding_atlas as ea
    from analysis.tokens.atlas_table import atlas_table

    served = []
    monkeypatch.setattr(ea, "server_for", lambda table, text="text": served.append(table) or
                        type("S", (), {"url": "http://127.0.0.1:1/"})())
    monkeypatch.setattr(ea, "webgpu_support", lambda key: {"webgpu": True, "shader_f16": True})
    at = extracted(tiny_dirs["bert"], corpus_root)
    assert not at.exception and not at.error
    tv = engine(tiny_dirs["bert"], corpus_root / "tiny.conllu")
    layer = tv.layers[-1]
    assert [str(p) for p in served] == [str(atlas_table(tv, layer, "pca"))]
    assert any(f"Shown: Embedding Atlas (WebGPU)**, served from this machine: all {tv.rows:,} tokens" in c.value
               for c in at.caption)
    assert not at.get("plotly_chart")  # no density view beside it
    at.radio(key="tokens_renderer").set_value("Density (datashader)").run()
    assert any("Shown: Density (datashader)" in c.value for c in at.caption) and at.get("plotly_chart")
