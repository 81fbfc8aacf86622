"""The slow layer: the real server driven by headless Chromium (Playwright), one scenario per user task.

Marked ``browser``; skipped with a reason when Playwright or Chromium is missing (``.ci/run`` installs both).
Screenshots go to the test's output folder (``pytest --basetemp`` decides where).
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("LAYERLENS_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
HOME: list[Path] = []  # the server's LAYERLENS_HOME
PAGES = ["/", "/Model_anatomy", "/Reconstruction", "/Layer_Atlas", "/Layer_Weights", "/Layer_Duplication",
         "/Fine_Tune_Jobs"]

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
if not shutil.which(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM}", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port), "--server.address",
         "127.0.0.1", "--server.headless", "true"], cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "LAYERLENS_HOME": str(home)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    HOME.append(home)
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the dashboard did not start")
    yield url
    proc.terminate()
    proc.wait(timeout=15)


@pytest.fixture(scope="module")
def browser(server):
    with playwright.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server, tmp_path):
    p = browser.new_page(viewport={"width": 1400, "height": 1800})
    p.set_default_timeout(120_000)
    yield p
    p.screenshot(path=str(tmp_path / "screenshot.png"), full_page=True)
    p.close()


def open_page(page, server, path):
    page.goto(server + path)
    page.wait_for_selector("h1")
    page.wait_for_selector("[data-testid='stSidebar'] [data-testid='stAlert']")  # the model loaded (or said why)
    time.sleep(1.0)


def assert_no_error(page):
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlertContentError']").count() == 0, \
        page.locator("[data-testid='stAlertContentError']").first.inner_text()


@pytest.mark.parametrize("path", PAGES)
def test_every_page_opens_without_an_error(page, server, path):
    open_page(page, server, path)
    assert_no_error(page)


def test_probe_the_prefilled_sentences(page, server):
    open_page(page, server, "/Reconstruction")
    page.get_by_role("button", name="Run the probe").click()
    page.wait_for_selector(".js-plotly-plot")
    page.wait_for_selector("[data-testid='stDataFrame']")
    assert_no_error(page)


def test_atlas_of_an_uploaded_tsv(page, server, tmp_path):
    rows = ["text\tlabel"] + [f"{'good fun film' if i % 2 else 'dull bad movie'} number {i}\t{i % 2}"
                              for i in range(60)]
    data = tmp_path / "rows.tsv"
    data.write_text("\n".join(rows) + "\n")
    open_page(page, server, "/Layer_Atlas")
    page.get_by_text("Upload a file").click()
    page.locator("input[type='file']").set_input_files(str(data))
    page.get_by_role("button", name="Draw the atlas").click()
    grid = page.locator(".js-plotly-plot").first
    grid.wait_for()
    # the demo model has 4 layers: the default "-6:" is all 5 hidden states (6 on a model with 5+ layers)
    assert grid.locator("g.cartesianlayer > g.subplot").count() == 5
    assert_no_error(page)


def test_duplication_preview(page, server):
    open_page(page, server, "/Layer_Duplication")
    page.get_by_role("button", name="Preview").click()
    page.wait_for_selector(".js-plotly-plot")
    assert page.locator(".js-plotly-plot").count() == 2
    assert_no_error(page)


def submit_demo_job(page, server, epochs: int) -> None:
    """The jobs page's default job (demo model, demo set, attention head) with ``epochs`` epochs."""
    open_page(page, server, "/Fine_Tune_Jobs")
    page.get_by_label("Epochs").fill(str(epochs))
    page.get_by_label("Epochs").press("Enter")
    time.sleep(1)
    page.get_by_role("button", name="Submit the job").click()


def test_fine_tune_then_layer_weights(page, server):
    submit_demo_job(page, server, epochs=1)
    page.get_by_text("Compare finished runs").wait_for(timeout=300_000)  # shown once a run has succeeded
    assert_no_error(page)
    open_page(page, server, "/Layer_Weights")
    page.wait_for_selector(".js-plotly-plot")
    assert page.get_by_text("Layer weights per example").count() >= 1
    assert_no_error(page)


def test_cancel_a_job(page, server):
    submit_demo_job(page, server, epochs=100)
    page.get_by_role("button", name="Cancel").wait_for(timeout=120_000)
    page.get_by_role("button", name="Cancel").click()
    page.get_by_role("button", name="Cancel").wait_for(state="detached", timeout=60_000)  # the job has ended
    from jobs.store import JobStore

    assert JobStore(HOME[-1] / "jobs").list()[0].status == "cancelled"
    assert_no_error(page)
