"""The report button of a page with a finished result: the run as one self-contained HTML file (the ``report`` task,
:mod:`analysis.tasks.report`), offered as a download. A result held in memory is first written as the CLI writes it
(:meth:`analysis.core.task.Result.write`) into a temporary folder, so the report is the one ``layerlens report``
makes of the same run."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import streamlit as st

from analysis.core.task import Result, complete_record


def report_html(run_dir: Path) -> bytes:
    """The report of the finished run in ``run_dir``, as ``layerlens report`` makes it."""
    from analysis.core.task import QuietContext
    from analysis.tasks.report import Report, ReportOptions

    return Report().run(ReportOptions(run_dir=run_dir, out=Path(run_dir).parent / "report.html"),
                        QuietContext()).html.encode("utf-8")


def _button(make: Callable[[], bytes], key: str, container=None) -> None:
    box = container or st
    if box.button("Make a report to share (HTML)", key=f"{key}_report", help="one self-contained HTML file: the "
                  "figures (interactive, offline), the tables, the files for download, the model, the options and "
                  "the command that reproduces the run"):
        try:
            st.session_state[f"{key}_report_html"] = make()
        except Exception as exc:  # never a traceback in the UI
            box.error(f"The report could not be made: {type(exc).__name__}: {exc}")
            return
    data = st.session_state.get(f"{key}_report_html")
    if data is not None:
        box.download_button(f"Download the report ({len(data) / 1e6:.1f} MB)", data, "report.html", "text/html",
                            key=f"{key}_report_download")


def report_button(run_dir: Path, key: str, container=None) -> None:
    """A button that makes the report of the finished run in ``run_dir`` and offers it for download (a caption
    instead when the folder has no ``run.json``: a run from before the record existed)."""
    if not (Path(run_dir) / "run.json").is_file():
        (container or st).caption("No report: this run's folder has no run.json (it predates the run record).")
        return
    _button(lambda: report_html(Path(run_dir)), key, container)


def result_report_button(result: Result, key: str, container=None) -> None:
    """:func:`report_button` for a result held in memory: written into a temporary folder when asked for."""
    def make() -> bytes:
        folder = Path(tempfile.mkdtemp(prefix="layerlens-run-"))
        try:
            run = folder / "from the dashboard"  # the report's title: "probe run from the dashboard"
            run.mkdir()
            result.write(run)
            complete_record(run, getattr(result, "page_options", None), getattr(result, "page_rows", None))
            return report_html(run)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if st.session_state.get(f"{key}_report_of") != id(result):  # a new result: the last one's report is stale
        st.session_state.pop(f"{key}_report_html", None)
        st.session_state[f"{key}_report_of"] = id(result)
    _button(make, key, container)
