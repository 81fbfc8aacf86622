"""The integration tier: tests that run a door (the CLI's main, a job's process, a page under AppTest) or several
modules together on tiny models. Shared helpers are in tests/support; these are the tier's fixtures."""

import pytest


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A LAYERLENS_HOME of the test's own with no job worker started: its job store."""
    from jobs.store import JobStore

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    monkeypatch.setenv("LAYERLENS_JOBS_NO_WORKER", "1")
    return JobStore(tmp_path / "jobs")
