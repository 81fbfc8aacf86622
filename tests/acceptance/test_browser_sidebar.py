"""The sidebar's model in headless Chromium (Playwright) on the real server: a reload keeps it (the URL holds it),
changing it after a comparison starts nothing without a click, and the server watches no files.

Screenshots go to LAYERLENS_SCREENSHOTS when set, else the test's folder.
"""

import os
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from tests import browser_support as support
from tests.browser_support import assert_no_error, browser, playwright, server  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.browser]
SIDEBAR = "[data-testid='stSidebar']"


@pytest.fixture
def page(browser, server, tmp_path):
    p = browser.new_page(viewport={"width": 1400, "height": 1600})
    p.set_default_timeout(180_000)
    yield p
    p.close()


def shot(page, tmp_path, name: str) -> None:
    folder = Path(os.environ.get("LAYERLENS_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def settle(page, seconds=1.5):
    """Wait for the rerun a widget change started to finish (Streamlit shows a running indicator meanwhile)."""
    time.sleep(seconds)
    page.locator("[data-testid='stStatusWidget']").wait_for(state="detached", timeout=180_000)


def loaded_line(page) -> str:
    return page.locator(f"{SIDEBAR} [data-testid='stAlertContentSuccess']").first.inner_text()


def choose_model(page, name: str) -> None:
    """Type ``name`` as the sidebar's model (other: hub id or local path) and wait until it is loaded."""
    page.locator(SIDEBAR).get_by_label("Model", exact=True).click()
    page.get_by_role("option", name="other: hub id or local path…").click()
    box = page.locator(SIDEBAR).get_by_role("textbox", name="Hub id or local directory")
    box.fill(name)
    box.press("Enter")
    settle(page)
    page.locator(f"{SIDEBAR} [data-testid='stAlertContentSuccess']").wait_for()


def test_a_reload_keeps_the_sidebar_model_and_the_server_watches_no_files(page, server, tmp_path):
    support.open_page(page, server, "/Model_anatomy")
    choose_model(page, "random:demo")
    assert "random weights" in loaded_line(page)
    assert parse_qs(urlparse(page.url).query)["model"] == ["random:demo"]
    page.reload()
    page.wait_for_selector("h1")
    page.locator(f"{SIDEBAR} [data-testid='stAlertContentSuccess']").wait_for()
    settle(page)
    shot(page, tmp_path, "reloaded")
    assert "random weights" in loaded_line(page)
    assert page.locator(SIDEBAR).get_by_role("textbox", name="Hub id or local directory").input_value() == \
        "random:demo"
    assert_no_error(page)

    port = urlparse(server).port  # the server, found by its command line: no inotify watch open with a session on
    pid = next(int(p) for p in os.listdir("/proc") if p.isdigit() and "streamlit" in cmdline(p)
               and f"--server.port\0{port}\0" in cmdline(p))
    fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert not [fd for fd in fds if "inotify" in fd]


def cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def test_changing_the_model_after_a_comparison_starts_none(page, server, tmp_path):
    support.open_page(page, server, "/Compare_checkpoints")
    choose_model(page, "random:demo")  # A (typed first: choosing "other" empties the page's form meanwhile)
    page.get_by_text("Reconstruction accuracy", exact=True).click()  # CKA, probes and movers are enough here
    settle(page)
    box = page.get_by_role("textbox", name="Compare with (B)")
    box.fill("demo")
    box.press("Enter")
    settle(page)
    page.get_by_role("button", name="Compare", exact=True).click()
    page.wait_for_selector("[data-testid='stDataFrame']")
    settle(page)
    shot(page, tmp_path, "compared")
    assert_no_error(page)

    page.locator(SIDEBAR).get_by_label("Model", exact=True).click()  # A becomes the demo; B, the rows and the
    page.get_by_role("option", name="demo (bundled, offline)").click()  # options stay as they are
    settle(page, 3.0)
    shot(page, tmp_path, "model_changed")
    assert "random weights" not in loaded_line(page)
    assert page.get_by_role("textbox", name="Compare with (B)").input_value() == "demo"
    assert page.locator("[data-testid='stDataFrame']").count() == 0  # no result of another A shown ...
    assert page.locator("[data-testid='stProgress']").count() == 0  # ... and no comparison running
    assert page.get_by_text("Choose the rows and the checkpoint B, then compare.", exact=False).count() == 1
    assert_no_error(page)
