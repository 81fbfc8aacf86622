"""A task's page form, derived from its options schema (:mod:`analysis.core.task`): one widget per option
(:func:`ui.options.option_input`: label, bounds, choices and help from the schema), returned as the schema's
validated options."""

from __future__ import annotations

import streamlit as st

from analysis.core.inputs import InputError
from jobs.store import StoreJobs
from ui.options import option_input


def task_form(prefix: str, schema, names: list[str] | None = None, columns: int = 3):
    """The options of ``schema`` (its fields ``names``, default all) from a form of widgets, or None (with the
    schema's one-line message) when they are not valid."""
    names = names or list(schema.model_fields)
    slots = st.columns(columns)
    values = {name: option_input(slots[i % columns], name, prefix, options_schema=schema)
              for i, name in enumerate(names)}
    try:
        return schema(**values)
    except InputError as exc:
        st.error(str(exc))
        return None


class PageContext(StoreJobs):
    """A task's reports on a page (:class:`analysis.core.task.Context`): progress on the page's bar (``report``:
    fraction and text, as :func:`ui.results.shared_result` gives it), notes kept for the page to show. The page
    keeps the result in memory, so the task writes no folder; Stop reruns the page, which ends the run at its next
    progress report. Jobs are looked up in the user's job store."""

    def __init__(self, report, unit: str | None = None):
        self.report, self.notes, self.unit = report, [], unit  # unit: what the counts count ("text": "of 40 texts")

    def output(self):
        return None

    def log(self, message: str) -> None:
        self.notes.append(message)

    def progress(self, stage: str, done: int, total: int) -> None:
        plural = (self.unit + ("es" if self.unit.endswith("s") else "s")) if self.unit else ""
        unit = "" if not self.unit else f" {self.unit}" if total == 1 else f" {plural}"
        self.report(done / max(total, 1), f"{stage}: {done:,} of {total:,}{unit}")

    def should_stop(self) -> bool:
        return False

    def keep(self, name: str):
        return None


def page_options(task, spec, rows=None, source: str | None = None, **values):
    """``task``'s options for a run on a page: the model block from ``spec`` (the sidebar's model, or the one to
    compare with), the options naming the page's ``rows`` (:func:`source_values`; ``source``: the option for their
    file where it is not ``input`` or ``data``) and the page's ``values``, checked by the task's schema (an
    :class:`InputError` of one line)."""
    spec = spec.resolved()
    model = {"model": spec.name, "revision": spec.revision, "device": spec.device, "dtype": spec.dtype,
             "allow_pickle": spec.allow_pickle, "head_from": spec.head_from}
    named = source_values(task, rows, source) if rows is not None else {}
    return task.Options(**{k: v for k, v in model.items() if k in task.Options.model_fields}, **named, **values)


def source_values(task, data, source: str | None = None) -> dict:
    """The options of ``task`` that name its rows' source (its input file and columns), from what the page read
    (``data.source`` and ``data.columns``), so the page's ``run.json`` says where its rows came from."""
    fields = task.Options.model_fields
    text, pair, label = data.columns
    values = {source or ("input" if "input" in fields else "data"): data.source or "page rows",
              "column" if "column" in fields else "text_column": text, "pair_column": pair, "label_column": label}
    return {k: v for k, v in values.items() if k in fields and (v is not None or k == "pair_column")}


def task_key(task, options, data) -> str:
    """The shared store's key of ``task``'s run with ``options`` on the rows ``data`` (equal rows from another
    source share it)."""
    from ui.results import result_key

    return result_key(task.name, options.model_dump(mode="json", exclude={"input", "data"}), data.content_hash(),
                      data.ids)


def task_result(task, spec, data, options, label: str, key: str | None = None):
    """THE page's run of ``task``: :meth:`analysis.core.task.Task.compute` on the model ``spec`` names (the shared
    model cache: the sidebar's model is a hit) and the page's rows ``data``, on the page's progress bar, shared
    across sessions under ``key`` (default: the task, the options and the rows). ``data`` may be a function that
    reads them (with a ``key``: read only when the result is not stored yet, e.g. treebanks)."""
    from ui.results import shared_result
    from ui.sidebar import model_cache

    def compute(report):
        rows = data() if callable(data) else data
        return kept(task.compute(model_cache().get(spec), rows, options,
                                 PageContext(report, task.unit if task.unit != "it" else None)), options, rows)
    return shared_result(key or task_key(task, options, data), label, compute)


def kept(result, options, rows=None):
    """``result`` holding the ``options`` it ran with and the ``rows`` the page read, which its report writes beside
    its run.json (:func:`analysis.core.task.complete_record`): the report's command then reproduces it."""
    if result is not None:
        result.page_options = options
        result.page_rows = rows if hasattr(rows, "texts") else None
    return result


def run_on_page(runs: dict, what: str) -> None:
    """THE runner of a page's task: each ``key -> (label, run)`` whose result is not in the shared store yet is
    ``run(ctx)`` with a :class:`PageContext` on the page's progress bar, the Stop button shown meanwhile; bad input is
    its own one line, anything else one line too (the UI never shows a traceback)."""
    from ui.results import result_store, shared_result, stop_button

    stop_slot = stop_button(what)
    try:
        for key, (label, run) in runs.items():
            if result_store().get(key) is None:
                shared_result(key, label, lambda report, run=run: run(PageContext(report)))
    except InputError as exc:
        st.error(str(exc))
    except Exception as exc:  # never a traceback in the UI
        st.error(f"{what} failed: {type(exc).__name__}: {exc}")
    stop_slot.empty()
