"""Start the dashboard, open pages in headless Chromium and save screenshots (for the README and for review).

    python scripts/screenshot.py --out screenshots [--page app.py --page pages/0_Model_anatomy.py]

Needs Playwright for Python and a Chromium (Debian: ``apt-get install chromium``; the default path below).
"""

import argparse
import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wait_healthy(url: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"error: the dashboard did not come up at {url}")


@contextlib.contextmanager
def dashboard(port: int, env: dict | None = None, timeout: float = 60):
    """``streamlit run app.py`` on 127.0.0.1:``port`` (offline), yielding its URL once it is healthy (within
    ``timeout`` seconds)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true"],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}, stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, timeout)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def main() -> None:
    from playwright.sync_api import sync_playwright

    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=ROOT / "screenshots")
    p.add_argument("--port", type=int, default=8599)
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--path", action="append", help="URL paths to open (default: home, model anatomy, probe)")
    p.add_argument("--click", default="Run the probe", help="button to press on the pages of --click-on")
    p.add_argument("--click-on", nargs="*", default=["/Reconstruction"])
    p.add_argument("--height", type=int, default=900, help="viewport height (Streamlit scrolls inside the page)")
    args = p.parse_args()
    paths = args.path or ["/", "/Model_anatomy", "/Reconstruction"]
    args.out.mkdir(parents=True, exist_ok=True)
    with dashboard(args.port) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium)
        page = browser.new_page(viewport={"width": 1400, "height": args.height})
        for path in paths:
            page.goto(url + path)
            page.wait_for_selector("h1", timeout=60000)
            page.wait_for_selector("[data-testid='stSidebar'] [data-testid='stAlert']", timeout=60000)
            if path in args.click_on:
                page.get_by_role("button", name=args.click).click()
                page.wait_for_selector(".js-plotly-plot", timeout=120000)
            time.sleep(3.0)
            name = "home" if path == "/" else path.strip("/").lower()
            page.screenshot(path=str(args.out / f"{name}.png"), full_page=True)
            print(f"wrote {args.out / f'{name}.png'}")
        browser.close()

if __name__ == "__main__":
    main()
