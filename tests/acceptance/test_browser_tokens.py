"""The Token atlas page in headless Chromium (Playwright) on the demo model: the density map, a search, a selection,
a neighbour query and the geometry, with every request the page makes recorded: none may leave the machine.

Also the load time of a 1,000,000-token map (a synthetic extraction in the server's cache). Screenshots go to
LAYERLENS_SCREENSHOTS when set, else the test's folder.
"""

import os
import re
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pandas as pd
import pytest

from tests import browser_support as support
from tests.browser_support import HOME, assert_no_error, browser, playwright, server  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.browser]
LOCAL = {"127.0.0.1", "localhost"}


@pytest.fixture
def requests():
    return []


@pytest.fixture
def page(browser, server, tmp_path, requests):
    p = browser.new_page(viewport={"width": 1400, "height": 2400})
    p.set_default_timeout(180_000)
    p.on("request", lambda r: requests.append(r.url))
    yield p
    p.screenshot(path=str(tmp_path / "screenshot.png"), full_page=True)
    p.close()


def shots(tmp_path) -> Path:
    return Path(os.environ.get("LAYERLENS_SCREENSHOTS") or tmp_path)


def open_page(page, server, path="/Token_atlas"):
    support.open_page(page, server, path)


def assert_local(requests):
    """Every request went to this machine (data: and blob: URLs never leave the page)."""
    assert requests, "no request recorded"
    away = [u for u in requests if urlparse(u).scheme not in ("data", "blob", "about")
            and urlparse(u).hostname not in LOCAL]
    assert not away, f"requests leaving the machine: {away[:5]}"


def settle(page, seconds=1.5):
    """Wait for the rerun a widget change started to finish (Streamlit shows a running indicator meanwhile)."""
    time.sleep(seconds)
    page.locator("[data-testid='stStatusWidget']").wait_for(state="detached", timeout=180_000)


def fill(page, label: str, value: str) -> None:
    box = page.get_by_role("textbox", name=label, exact=True)
    box.fill(value)
    box.press("Enter")
    settle(page)


def test_map_search_selection_neighbours_and_geometry_with_no_request_leaving(page, server, tmp_path, requests):
    out = shots(tmp_path)
    open_page(page, server)
    page.get_by_label("Max texts", exact=True).fill("120")
    page.get_by_label("Max texts", exact=True).press("Enter")
    settle(page)
    page.get_by_role("button", name="Extract token vectors").click()
    page.get_by_text("Shown: Density (datashader)").wait_for()
    plot = page.locator(".js-plotly-plot").first
    plot.wait_for()
    assert plot.locator("image").count() == 1  # the density: an inline image under the points
    assert page.get_by_text("Embedding Atlas needs WebGPU").count() == 1
    assert_no_error(page)
    page.screenshot(path=str(out / "tokens_map.png"), full_page=True)

    fill(page, "Search by text", "the")
    page.get_by_text("ringed in orange").wait_for()
    page.locator(".js-plotly-plot .legendtext", has_text="search matches").wait_for()
    settle(page)
    # a box over the plot's middle: the selected tokens come back to the page with their sentences
    for attempt in range(3):  # a drag that lands while the chart is redrawn is lost: drag again
        box = page.locator(".js-plotly-plot g.draglayer .nsewdrag").first.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] * 0.2)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.7, steps=12)
        page.mouse.up()
        try:
            page.get_by_text("Selected:").wait_for(timeout=45_000)
            break
        except playwright.TimeoutError:
            if attempt == 2:
                raise
    page.locator("[data-testid='stDataFrame']").first.wait_for()  # the selected tokens with their sentences
    time.sleep(2.0)
    assert_no_error(page)
    page.screenshot(path=str(out / "tokens_map_selected.png"), full_page=True)

    page.get_by_role("radiogroup").get_by_text("Neighbours", exact=True).click()
    settle(page)
    fill(page, "Word", "the")
    page.get_by_text("Across layers").wait_for()
    page.get_by_text("The 10 nearest tokens at hidden state 4").wait_for()
    assert_no_error(page)
    page.screenshot(path=str(out / "tokens_neighbours.png"), full_page=True)

    page.get_by_role("radiogroup").get_by_text("Geometry", exact=True).click()
    settle(page)
    page.get_by_role("button", name="Compute the geometry").click()
    page.get_by_role("heading", name="Rogue dimensions").wait_for()
    assert page.locator(".js-plotly-plot").count() == 1
    assert_no_error(page)
    page.screenshot(path=str(out / "tokens_geometry.png"), full_page=True)
    assert_local(requests)


def test_an_uploaded_treebank_is_extracted_and_mapped(page, server, tmp_path, requests):
    from tests.support.data import FIXTURES

    open_page(page, server)
    page.get_by_text("Upload a corpus").click()
    page.locator("input[type='file']").set_input_files(str(FIXTURES / "ud_tiny_train.conllu"))
    settle(page)
    corpus = page.locator("[data-testid='stSelectbox']").filter(has_text="Corpus").first
    for _ in range(60):  # saved under the uploads folder and chosen as the corpus
        if re.search(r"uploads/[0-9a-f]{16}\.conllu", corpus.inner_html()):
            break
        time.sleep(1.0)
    assert re.search(r"uploads/[0-9a-f]{16}\.conllu", corpus.inner_html()), corpus.inner_html()
    page.get_by_role("button", name="Extract token vectors").click()
    page.get_by_text("Shown: Density (datashader)").wait_for()
    assert page.get_by_text(re.compile(r"CoNLL-U · 33 texts")).count() >= 1
    assert_no_error(page)
    assert_local(requests)


def synthetic_extraction(home: Path, rows: int = 1_000_000, per_text: int = 20, hidden: int = 32) -> Path:
    """A 1M-token extraction in the server's cache (two hidden states of clustered random vectors)."""
    from analysis.tokens.vectors import KIND, write_arrays

    rng = np.random.default_rng(0)
    n_texts = rows // per_text
    words = np.array([f"w{i}" for i in range(5000)])
    ids = np.minimum(rng.zipf(1.3, size=rows) - 1, len(words) - 1)
    centres = rng.normal(size=(len(words), hidden)).astype(np.float32)
    vectors = np.stack([centres[ids] + rng.normal(scale=s, size=(rows, hidden)).astype(np.float32)
                        for s in (0.3, 1.0)]).astype(np.float16)
    text_id = np.repeat(np.arange(n_texts), per_text)
    position = np.tile(np.arange(1, per_text + 1), n_texts)
    tokens = pd.DataFrame({"row": np.arange(rows), "text_id": text_id, "position": position, "token_id": ids,
                           "token": words[ids], "word_index": position - 1, "word": words[ids],
                           "first_subword": True, "start": -1, "end": -1})
    texts = pd.DataFrame({"text_id": np.arange(n_texts), "source_row": np.arange(n_texts),
                          "text": [f"synthetic text {i}" for i in range(n_texts)]})
    return write_arrays(home / "cache" / KIND / "synthetic-1m", vectors, tokens, texts, model="synthetic 1M",
                        shard_rows=262_144).directory


def test_a_million_token_map_loads_in_the_browser(page, server, tmp_path, requests):
    directory = synthetic_extraction(HOME[-1])
    times = {}
    for attempt in ("cold", "warm"):  # cold: the server reads the table, runs the PCA and rasterises for the first time
        open_page(page, server)
        page.get_by_role("radiogroup").get_by_text("Open a cached extraction", exact=True).click()
        start = time.perf_counter()
        page.get_by_text("1,000,000 tokens counted").wait_for(timeout=300_000)
        page.locator(".js-plotly-plot image").first.wait_for()
        page.locator(".js-plotly-plot .scatterlayer, .js-plotly-plot canvas").first.wait_for()
        times[attempt] = time.perf_counter() - start
        assert_no_error(page)
    page.screenshot(path=str(shots(tmp_path) / "tokens_map_1m.png"), full_page=True)
    (shots(tmp_path) / "tokens_map_1m_seconds.txt").write_text(f"{times}\n")
    print(f"1M-token map in Chromium: {times}")
    assert (directory / "maps" / "layer01.pca2.npy").is_file()  # the times are reported, never asserted
    assert_local(requests)
