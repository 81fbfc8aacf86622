"""A new user's fine-tune in a real browser: open the jobs page, submit the default job (demo model, demo set,
attention head), wait until it succeeds, then open the Layer weights page. Saves screenshots.

    python scripts/browser_jobs_flow.py --out shots [--timeout 600]

Uses a fresh ``LAYERLENS_HOME`` (a temporary directory) unless one is set. Needs Playwright and Chromium.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
from screenshot import ROOT, dashboard  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=ROOT / "screenshots")
    p.add_argument("--port", type=int, default=8598)
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    home = os.environ.get("LAYERLENS_HOME") or tempfile.mkdtemp(prefix="layerlens-flow-")
    with dashboard(args.port, {"LAYERLENS_HOME": home}) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium)
        page = browser.new_page(viewport={"width": 1400, "height": 2000})
        page.goto(url + "/Fine_Tune_Jobs")
        page.wait_for_selector("[data-testid='stSidebar'] [data-testid='stAlert']", timeout=60000)
        page.get_by_role("button", name="Submit the job").click()
        page.get_by_text("queued: it starts").wait_for(timeout=60000)
        start = time.time()
        while time.time() - start < args.timeout:
            if page.get_by_text("Compare finished runs").count():
                break
            if page.get_by_text("failed", exact=True).count():
                raise SystemExit("error: the job failed (see the screenshot)")
            time.sleep(2)
        else:
            raise SystemExit(f"error: the job did not finish in {args.timeout:.0f} s")
        print(f"the job finished in about {time.time() - start:.0f} s")
        time.sleep(3)
        page.screenshot(path=str(args.out / "flow_jobs.png"), full_page=True)
        page.goto(url + "/Layer_Weights")
        page.wait_for_selector(".js-plotly-plot", timeout=60000)
        time.sleep(3)
        page.screenshot(path=str(args.out / "flow_layer_weights.png"), full_page=True)
        print(f"wrote {args.out / 'flow_jobs.png'}, {args.out / 'flow_layer_weights.png'}")
        browser.close()


if __name__ == "__main__":
    main()
