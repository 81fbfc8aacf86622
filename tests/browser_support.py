"""What the Chromium tests share: the browser's path and flags, and the module-scoped dashboard and browser fixtures
(``from tests.browser_support import browser, server``). A module without Playwright or Chromium is skipped with
the reason."""

import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from scripts.screenshot import dashboard

CHROMIUM = os.environ.get("LAYERLENS_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
HOME: list[Path] = []  # each module's server's LAYERLENS_HOME, the current one last

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
    HOME.append(home)
    with dashboard(free_port(), {"LAYERLENS_HOME": str(home)}, timeout=90) as url:
        yield url


@pytest.fixture(scope="module")
def browser(server):
    with playwright.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_page(page, server, path):
    """``path`` of the dashboard, once its sidebar says the model loaded (or why not)."""
    page.goto(server + path)
    page.wait_for_selector("h1")
    page.wait_for_selector("[data-testid='stSidebar'] [data-testid='stAlert']")  # the model loaded (or said why)
    time.sleep(1.0)


def assert_no_error(page):
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlertContentError']").count() == 0, \
        page.locator("[data-testid='stAlertContentError']").first.inner_text()
