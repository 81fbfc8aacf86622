"""Work the browser can ask for is bounded (issue 43, item 13): one setting caps what a page runs in the server
process (``LAYERLENS_MAX_SERVER_TEXTS``), and a job submitted from the browser may not exceed its options'
browser bounds (``browser_max`` in the schema), with one line saying so and pointing to the CLI."""

from __future__ import annotations

import pytest

from analysis.core.inputs import InputError
from analysis.core.options import browser_bounds, max_server_texts
from analysis.heads.options import HeadsJobOptions
from jobs.submit import browser_checked


def test_the_server_cap_is_one_setting(monkeypatch):
    monkeypatch.delenv("LAYERLENS_MAX_SERVER_TEXTS", raising=False)
    assert max_server_texts() == 2000
    monkeypatch.setenv("LAYERLENS_MAX_SERVER_TEXTS", "50")
    assert max_server_texts() == 50
    monkeypatch.setenv("LAYERLENS_MAX_SERVER_TEXTS", "many")
    with pytest.raises(InputError, match="LAYERLENS_MAX_SERVER_TEXTS"):
        max_server_texts()


@pytest.mark.parametrize(("field", "value"), [("cluster_tokens", 1_000_000), ("batch_size", 4096), ("steps", 1000),
                                              ("limit", 10_000_000)])
def test_browser_jobs_are_capped(field, value, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERLENS_DATA_DIRS", str(tmp_path))
    (tmp_path / "t.txt").write_text("a text\n")
    options = HeadsJobOptions(action="stats", model="demo", input=str(tmp_path / "t.txt"), **{field: value})
    high = browser_bounds(field, HeadsJobOptions)[1]
    assert high is not None and high < value
    with pytest.raises(InputError, match=f"{field}.*{high:,}.*CLI"):
        browser_checked(options)
    ok = HeadsJobOptions(action="stats", model="demo", input=str(tmp_path / "t.txt"), **{field: high})
    assert getattr(browser_checked(ok), field) == high
