"""The HTML report (analysis.tasks.report) opened from disk in headless Chromium: every figure draws, no request
leaves the file (each one is recorded, anything but the file itself is blocked and counted), the page's
Content-Security-Policy is never violated, the console has no error, and the hostile labels of the run never run.
Skipped with the reason when Playwright or Chromium is missing (tests/browser_support.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.core.task import QuietContext, RunRecord
from tests.browser_support import ARGS, CHROMIUM, playwright
from tests.unit.report.test_report import VERSIONS, probe_run

WATCH = """
window.__alerts = []; window.alert = (m) => window.__alerts.push(String(m));
window.__violations = [];
document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective + ' '
                                                                                  + e.blockedURI));
"""
DRAWN = """() => Array.from(document.querySelectorAll('.plotly-graph-div')).filter(
    d => d.classList.contains('js-plotly-plot') && d.querySelector('.main-svg') && (d._fullData || []).length > 0
).length"""


def atlas_run(folder: Path) -> Path:
    """An atlas's run folder: separability.csv, cka.csv (layer names as its index), coords.csv, run.json."""
    folder.mkdir(parents=True)
    names = ["embeddings", "layer 1", "layer 2"]
    pd.DataFrame({"layer": [0, 1, 2], "probe_accuracy": [0.5, 0.7, 0.8], "probe_accuracy_std": 0.02,
                  "probe_macro_f1": [0.4, 0.6, 0.7], "probe_ci_low": [0.45, 0.65, 0.75],
                  "probe_ci_high": [0.55, 0.75, 0.85], "majority_baseline": 0.4, "silhouette": [0.0, 0.1, 0.2]}
                 ).to_csv(folder / "separability.csv", index=False)
    pd.DataFrame([[1.0, 0.8, 0.6], [0.8, 1.0, 0.9], [0.6, 0.9, 1.0]], index=names, columns=names
                 ).to_csv(folder / "cka.csv")
    pd.DataFrame({"layer": [0] * 4 + [2] * 4, "example_id": list(range(4)) * 2, "x": [0.0, 1, 2, 3] * 2,
                  "y": [1.0, 0, 1, 0] * 2, "label": ["<b>pos</b>", "neg"] * 4}).to_csv(folder / "coords.csv",
                                                                                     index=False)
    RunRecord("atlas", {"model": "demo", "layer_names": names, "fingerprint": "sha256:0f"},
              versions=VERSIONS).write(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("make", [probe_run, atlas_run], ids=["probe", "atlas"])
def test_the_report_draws_offline_in_chromium(tmp_path, make):
    from analysis.tasks.report import Report

    task = Report()
    options = task.Options(run_dir=make(tmp_path / "run"), out=tmp_path / "report.html")
    result = task.run(options, QuietContext())
    result.write_file(options.out)
    figures = result.html.count("Plotly.newPlot(")
    assert figures >= (2 if make is probe_run else 3)
    url = options.out.as_uri()
    requests, blocked, errors = [], [], []

    def route(request_route):
        if request_route.request.url == url:
            request_route.continue_()
        else:
            blocked.append(request_route.request.url)
            request_route.abort()

    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.route("**/*", route)
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.add_init_script(WATCH)
            page.goto(url)
            page.wait_for_function(f"({DRAWN})() >= {figures}", timeout=30_000)
            assert page.evaluate(DRAWN) == figures
            assert page.evaluate("document.querySelectorAll('.js-plotly-plot .main-svg').length") >= figures
            page.wait_for_timeout(500)  # anything a figure would fetch after drawing
            assert page.evaluate("window.__alerts") == []
            assert page.evaluate("window.__violations") == []
            assert page.locator("#report-size").inner_text().strip().endswith(
                f"({options.out.stat().st_size:,} bytes)")
        finally:
            browser.close()
    others = [u for u in requests if u != url and not u.startswith(("data:", "blob:"))]
    assert blocked == [] and others == [], (blocked, others)
    assert errors == []
