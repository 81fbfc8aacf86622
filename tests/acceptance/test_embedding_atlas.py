"""Embedding Atlas for the token map (ui/embedding_atlas.py, analysis/tokens/atlas_table.py): the table it serves
equals the engine's coordinates and tokens.parquet; one server process per table, reused and bounded; and, slow, the
real server in headless Chromium and a Streamlit page embedding it, with every request the browser makes recorded
and required to stay on 127.0.0.1 (no CDN), the no-WebGPU sentence where the map cannot render and the table view
when asked for anyway."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.tokens.atlas_table import atlas_table
from analysis.tokens.maps import pca_map
from tests.unit.tokens.test_tokens_search import planted

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("LAYERLENS_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
LOCAL = {"127.0.0.1", "localhost"}


@pytest.fixture(scope="module")
def tv(tmp_path_factory):
    return planted(tmp_path_factory.mktemp("vectors"), n_texts=30, per_text=10, hidden=12)


def test_table_is_the_engines_coordinates_beside_tokens_parquet(tv):
    path = atlas_table(tv, 1)
    assert path == tv.directory / "maps" / "layer01.pca2.atlas.parquet"
    table = pd.read_parquet(path)
    coords, _ = pca_map(tv, 1)
    np.testing.assert_array_equal(table["x"].to_numpy(), coords[:, 0])
    np.testing.assert_array_equal(table["y"].to_numpy(), coords[:, 1])
    tokens = tv.tokens()
    for c in ["row", "text_id", "position", "token", "word", "word_index", "first_subword", "upos", "deprel"]:
        assert table[c].tolist() == tokens[c].tolist(), c
    texts = tv.texts().set_index("text_id")["text"]
    assert table["text"].astype(str).tolist() == texts.loc[tokens["text_id"]].tolist()
    assert "label" not in table.columns and "shard" not in table.columns


def test_table_is_cached_and_rewritten_when_its_sources_are_newer(tv):
    path = atlas_table(tv, 0)
    first = path.stat().st_mtime_ns
    assert atlas_table(tv, 0) == path and path.stat().st_mtime_ns == first  # found, not rewritten
    coords_file = tv.directory / "maps" / "layer00.pca2.npy"
    later = first + 10**9
    os.utime(coords_file, ns=(later, later))
    atlas_table(tv, 0)
    assert path.stat().st_mtime_ns > first
    assert not list(path.parent.glob(".*.tmp"))
    plain = atlas_table(tv, 0, text=False)
    assert plain.name == "layer00.pca2.atlas-notext.parquet" and "text" not in pd.read_parquet(plain).columns


def test_table_refuses_coordinates_of_another_size(tv):
    from analysis.tokens.atlas_table import build_table

    with pytest.raises(ValueError, match="coordinates of shape"):
        build_table(tv, np.zeros((tv.rows - 1, 2), np.float32))


def test_servers_are_reused_per_table_and_bounded(tmp_path, monkeypatch):
    """server_for starts one process per table, hands back the same one on the next call, starts a new one when
    the table changes on disk (stopping the old), and stops the least recently used beyond MAX_SERVERS."""
    import ui.embedding_atlas as ea

    started = []

    def fake_start(table, text="text", duckdb="server", port=None):
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        server = ea.Server(Path(table), 10_000 + len(started), process, tmp_path / "log", time.monotonic())
        started.append(server)
        return server

    monkeypatch.setattr(ea, "start", fake_start)
    monkeypatch.setattr(ea.Server, "wait_ready", lambda self, timeout=0: self)
    monkeypatch.setattr(ea, "MAX_SERVERS", 2)
    tables = [tmp_path / f"t{i}.parquet" for i in range(3)]
    for t in tables:
        t.write_bytes(b"x")
    try:
        a = ea.server_for(tables[0])
        assert ea.server_for(tables[0]) is a and len(started) == 1
        b = ea.server_for(tables[1])
        ea.server_for(tables[0])  # a is now the most recently used
        c = ea.server_for(tables[2])
        assert len(started) == 3 and b.process.wait(10) is not None and a.alive() and c.alive()
        assert len(ea._servers) == 2
        later = tables[0].stat().st_mtime_ns + 10**9
        os.utime(tables[0], ns=(later, later))
        a2 = ea.server_for(tables[0])
        assert a2 is not a and a.process.wait(10) is not None and a2.alive()
        os.environ.pop("LAYERLENS_ATLAS_URL", None)
        assert a2.url == f"http://127.0.0.1:{a2.port}/"
        monkeypatch.setenv("LAYERLENS_ATLAS_URL", "http://gpu-box:{port}/")
        assert a2.url == f"http://gpu-box:{a2.port}/"
    finally:
        ea.stop_all()
    assert all(not s.alive() for s in started)


def test_a_new_server_never_takes_a_port_an_earlier_one_had(monkeypatch):
    """The system may hand a just-freed port out again; a frame still open on the stopped server would then reach
    the new one, its pings would answer and it would never say its map was stopped. free_port skips the ports this
    process gave servers before (start passes them)."""
    import socket

    import ui.embedding_atlas as ea

    offered = iter([5001, 5001, 5002])

    class FakeSocket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(socket, "socket", FakeSocket)
    assert ea.free_port() == 5001
    assert ea.free_port({5001}) == 5002


@pytest.mark.slow  # 4 s: the process imports embedding_atlas before it fails
def test_a_server_that_dies_says_why(tmp_path, monkeypatch):
    import ui.embedding_atlas as ea

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    bad = tmp_path / "not.parquet"
    bad.write_text("not parquet")
    with pytest.raises(RuntimeError, match="server stopped"):
        ea.server_for(bad, timeout=60)
    assert not ea._servers


# --- the real server, slow -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tv):
    import ui.embedding_atlas as ea

    server = ea.start(atlas_table(tv, 1))
    try:
        yield server.wait_ready(120)
    finally:
        server.stop()


@pytest.mark.slow
def test_the_server_serves_the_app_its_assets_and_the_table(served, tv):
    with urllib.request.urlopen(served.local, timeout=10) as r:
        html = r.read().decode()
    assert "Embedding Atlas" in html and "./assets/index-" in html  # the bundled app, relative asset URLs
    with urllib.request.urlopen(served.local + "data/metadata.json", timeout=10) as r:
        meta = r.read().decode()
    assert '"rest"' in meta and '"x"' in meta  # DuckDB in the server, the map's columns
    query = urllib.parse.quote('{"sql": "SELECT count(*) AS n, min(row) AS lo, max(row) AS hi FROM dataset", '
                               '"type": "json"}')
    with urllib.request.urlopen(served.local + "data/query?query=" + query, timeout=30) as r:
        assert r.read().decode() == f'[{{"n":{tv.rows},"lo":0,"hi":{tv.rows - 1}}}]'
    assert served.rss_bytes() and served.rss_bytes() < 2**30


def _chromium():
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}")
    return playwright


def _hosts(urls: list[str]) -> set[str]:
    return {urllib.parse.urlsplit(u).hostname for u in urls if urllib.parse.urlsplit(u).scheme in ("http", "https",
                                                                                                     "ws", "wss")}


@pytest.mark.slow
@pytest.mark.browser
def test_served_atlas_in_chromium_stays_on_this_machine(served, tv, tmp_path):
    playwright = _chromium()
    urls: list[str] = []
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.on("request", lambda r: urls.append(r.url))  # the context's: the page's, its frames' and workers'
        page = context.new_page()
        page.goto(served.local)
        count = f"{tv.rows:,} / {tv.rows:,} points"
        page.wait_for_function("c => document.body.innerText.includes(c)", arg=count, timeout=90_000)
        page.wait_for_function("() => document.body.innerText.includes('WebGPU is unavailable')", timeout=90_000)
        page.wait_for_function("() => document.querySelectorAll('svg rect').length > 5", timeout=90_000)
        time.sleep(1.0)
        body = page.inner_text("body")
        page.screenshot(path=str(tmp_path / "atlas.png"))
        shutil.copy(tmp_path / "atlas.png", "/tmp/layerlens-embedding-atlas.png")
        served_urls = list(urls)
        # the control: a worker's importScripts of a CDN (what embedding-atlas's Streamlit component does) is seen
        page.evaluate("""() => new Promise((done) => {
            const code = "try { importScripts('https://cdn.jsdelivr.net/npm/x@0/x.js') } catch (e) {} postMessage(1)";
            const w = new Worker(URL.createObjectURL(new Blob([code], {type: 'text/javascript'})));
            w.onmessage = () => done(); setTimeout(done, 10000); })""")
        browser.close()
    assert "token (VARCHAR)" in body and "deprel (VARCHAR)" in body  # the table view's schema
    assert len(served_urls) > 5 and _hosts(served_urls) <= LOCAL, sorted(u for u in served_urls
                                                                         if _hosts([u]) - LOCAL)
    # every request of the app (its assets, metadata, queries) went through the server's token prefix
    ours = [urllib.parse.urlsplit(u) for u in served_urls if urllib.parse.urlsplit(u).port == served.port]
    assert any(u.path.endswith("/data/query") for u in ours)
    assert all(u.path.startswith(f"/{served.token}/") for u in ours), [u.path for u in ours]
    assert "cdn.jsdelivr.net" in _hosts(urls)  # so the recorder would have caught the atlas calling a CDN


PAGE = """
import os
import streamlit as st
from ui.embedding_atlas import show_embedding_atlas

shown = show_embedding_atlas(os.environ["ATLAS_TABLE"], key="atlas", height=500,
                             anyway=st.query_params.get("anyway") == "1")
st.write(f"renderer: {shown.renderer}")
"""


@pytest.mark.slow
@pytest.mark.browser
def test_a_streamlit_page_embedding_it_stays_on_this_machine(tv, tmp_path):
    """A minimal page calling show_embedding_atlas: without WebGPU it shows the sentence and no iframe; asked
    for anyway it embeds the served atlas (table, histograms). Every request of the page and its frames is local."""
    from scripts.screenshot import wait_healthy
    from ui.embedding_atlas import free_port

    playwright = _chromium()
    script = tmp_path / "atlas_page.py"
    script.write_text(PAGE)
    port = free_port()
    env = {**os.environ, "ATLAS_TABLE": str(atlas_table(tv, 1)), "LAYERLENS_HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    app = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(script), "--server.port", str(port),
                            "--server.address", "127.0.0.1", "--server.headless", "true"], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    urls: list[str] = []
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 90)
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            context = browser.new_context(viewport={"width": 1300, "height": 1000})
            context.on("request", lambda r: urls.append(r.url))
            page = context.new_page()
            page.set_default_timeout(90_000)
            page.goto(url)
            page.get_by_text("renderer: none").wait_for()
            note = page.locator(".ll-atlas-note")
            assert "needs WebGPU with the shader-f16 feature" in note.inner_text()
            assert "density view below is shown instead" in note.inner_text()
            assert page.locator(".ll-atlas iframe").count() == 0
            page.screenshot(path=str(tmp_path / "page-none.png"))

            page.goto(url + "/?anyway=1")
            page.get_by_text("renderer: embedding-atlas-table").wait_for()
            frame = page.frame_locator(".ll-atlas iframe")
            frame.get_by_text(f"{tv.rows:,} / {tv.rows:,} points").first.wait_for()
            frame.get_by_text("WebGPU is unavailable").first.wait_for()
            assert "its table, histograms and search work" in page.locator(".ll-atlas-note").inner_text()
            time.sleep(1.5)
            page.screenshot(path=str(tmp_path / "page-anyway.png"))
            shutil.copy(tmp_path / "page-anyway.png", "/tmp/layerlens-embedding-atlas-page.png")
            browser.close()
    finally:
        app.terminate()
        app.wait(20)
    assert any(urllib.parse.urlsplit(u).port == port for u in urls)
    assert any("/data/query" in u for u in urls)  # the atlas's own requests were recorded too
    assert _hosts(urls) <= LOCAL, sorted(u for u in urls if _hosts([u]) - LOCAL)


def test_the_page_function_waits_for_the_browser_in_apptest(tv):
    """In AppTest (no browser, no JavaScript) the probe never answers: nothing starts, the page is told so."""
    from streamlit.testing.v1 import AppTest

    def app(table):
        import streamlit as st

        from ui.embedding_atlas import _servers, show_embedding_atlas

        shown = show_embedding_atlas(table, key="atlas")
        st.write(f"renderer: {shown.renderer} · servers: {len(_servers)}")

    at = AppTest.from_function(app, args=(str(atlas_table(tv, 1)),)).run(timeout=60)
    assert not at.exception
    assert [m.value for m in at.markdown] == ["renderer: probing · servers: 0"]


TWO_TABLES = """
import os
import streamlit as st
from ui.embedding_atlas import show_embedding_atlas

shown = show_embedding_atlas(os.environ["ATLAS_TABLE_" + st.query_params.get("t", "1")], key="atlas", height=450,
                             anyway=True)
st.write(f"renderer: {shown.renderer}")
"""


@pytest.mark.slow
@pytest.mark.browser
def test_a_frame_whose_server_was_stopped_for_another_map_says_so_and_reopens(tv, tmp_path):
    """Two browser tabs (two sessions) on two tables with room for one server: opening the second stops the first's
    server; the first tab's frame then says so and offers to reopen, and reopening brings its atlas back."""
    from scripts.screenshot import wait_healthy
    from ui.embedding_atlas import free_port

    playwright = _chromium()
    script = tmp_path / "two_tables.py"
    script.write_text(TWO_TABLES)
    port = free_port()
    env = {**os.environ, "ATLAS_TABLE_1": str(atlas_table(tv, 1)), "ATLAS_TABLE_2": str(atlas_table(tv, 0)),
           "LAYERLENS_ATLAS_SERVERS": "1", "LAYERLENS_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT),
           "HF_HUB_OFFLINE": "1"}
    app = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(script), "--server.port", str(port),
                            "--server.address", "127.0.0.1", "--server.headless", "true"], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    points = f"{tv.rows:,} / {tv.rows:,} points"
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 90)
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            context = browser.new_context(viewport={"width": 1300, "height": 900})
            first, second = context.new_page(), context.new_page()
            for page in (first, second):
                page.set_default_timeout(90_000)
            first.goto(url + "/?t=1")
            first.frame_locator(".ll-atlas iframe").get_by_text(points).first.wait_for()
            second.goto(url + "/?t=2")  # a second session, another table: the first's server is stopped
            second.frame_locator(".ll-atlas iframe").get_by_text(points).first.wait_for()
            note = first.locator(".ll-atlas-stopped")
            note.wait_for()
            assert "This map's server has stopped" in note.inner_text() and "at most 1" in note.inner_text()
            assert first.locator(".ll-atlas iframe").count() == 0
            first.screenshot(path=str(tmp_path / "stopped.png"))
            shutil.copy(tmp_path / "stopped.png", "/tmp/layerlens-embedding-atlas-stopped.png")
            first.locator(".ll-atlas-reopen").click()
            first.frame_locator(".ll-atlas iframe").get_by_text(points).first.wait_for()
            assert first.locator(".ll-atlas-stopped").count() == 0
            second.locator(".ll-atlas-stopped").wait_for()  # and now the second tab's server made way
            browser.close()
    finally:
        app.terminate()
        app.wait(20)
