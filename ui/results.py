"""What the analysis pages share once they have a result: the cross-session result store (keyed by model,
inputs and options), charts with a download icon, and the Stop button of a long run."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable

import streamlit as st

from analysis.core.csvout import safe
from analysis.core.dataroots import browser_model
from analysis.core.inputs import InputError
from models.loading import LoadedModel, ModelLoadError, ModelSpec


class ResultStore:
    """Least recently used results, at most ``max_entries``. Stored results are shared: never mutate them."""

    def __init__(self, max_entries: int = 32):
        self.max_entries = max_entries
        self._items: collections.OrderedDict[str, object] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            return None

    def put(self, key: str, value) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)


def result_key(*parts) -> str:
    """A stable key for JSON-serialisable parts (model spec dicts, texts, option dicts)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


@st.cache_resource
def result_store() -> ResultStore:
    return ResultStore()


def shared_result(key: str, label: str, compute: Callable[[Callable[[float, str], None]], object]):
    """The result under ``key`` in the shared store; else ``compute(report)`` under a progress bar
    (``report(fraction, text)``), stored for every session."""
    store = result_store()
    if (result := store.get(key)) is None:
        bar = st.progress(0.0, text=f"{label}…")
        try:
            result = compute(bar.progress)
        finally:
            bar.empty()  # a failed run leaves its message, not a half-full bar
        store.put(key, result)
    return result


SIDEBAR_SPEC = "ll_sidebar_spec"  # the spec of the model the sidebar loaded in this run (None: none loaded)


def wait_for_run(request_key: str, clicked: bool, request, hint: str) -> None:
    """Stop the page with ``hint`` until a run of ``request`` (the inputs and options) is asked for: by
    ``clicked`` now, or earlier with the same request (so the result stays while other widgets change).

    The remembered request is the page's ``request`` together with the sidebar's model (its resolved spec: name,
    revision, device, precision, lent head; :data:`SIDEBAR_SPEC`, set by ``ui.sidebar.sidebar``), so choosing
    another model in the sidebar never starts a run on its own: the page shows ``hint`` until the next click,
    and going back to the model of the last run shows its result again."""
    request = (st.session_state.get(SIDEBAR_SPEC), request)
    if clicked:
        st.session_state[request_key] = request
    if st.session_state.get(request_key) != request:
        st.caption(hint)
        st.stop()


CHART_FORMAT, STOPPED = "ll_chart_format", "ll_stopped"


def chart(fig, name: str, where=st, key: str | None = None, select: tuple[str, ...] | None = None):
    """Draw a Plotly figure; its camera icon saves ``layerlens_<name>`` in the sidebar's image format.
    ``select`` (e.g. ``("box", "lasso")``): a selection reruns the page, and the selection event is returned."""
    fmt = st.session_state.get(CHART_FORMAT, "png")
    config = {"displaylogo": False,
              "toImageButtonOptions": {"format": fmt, "filename": f"layerlens_{name}", "scale": 2}}
    if select:
        return where.plotly_chart(fig, key=key, on_select="rerun", selection_mode=select, config=config)
    return where.plotly_chart(fig, key=key, config=config)


def stop_button(what: str, request_key: str | None = None):
    """A Stop button shown while ``what`` runs; returns its placeholder (``.empty()`` it when the run ends).

    A click reruns the page, which interrupts the running script at its next progress update; the callback
    drops ``request_key`` (so the run does not start again) and leaves a note that :func:`stopped_note` shows.
    """
    def stop() -> None:
        if request_key:
            st.session_state.pop(request_key, None)
        st.session_state[STOPPED] = what

    slot = st.empty()
    slot.button("Stop", key=f"stop_{what}", on_click=stop, help="Interrupts the run; nothing is kept from it.")
    return slot


def stopped_note() -> None:
    """After a Stop: say what was stopped (once)."""
    if what := st.session_state.pop(STOPPED, None):
        st.info(f"{what} stopped; nothing was kept from it.")


COMPARE_HELP = ("a hub id or local directory; job:N (job N's fine-tuned layers, read by the MLM head it started "
                "from); or random: the sidebar model's architecture with random weights (seed 0), the control a "
                "reviewer asks for")


def find_job(job_id: int, missing_ok: bool = False):
    """Job ``job_id`` of the job store (every page's one lookup by id): an :class:`InputError` when the store cannot
    be read, or when there is no such job (None with ``missing_ok``)."""
    from jobs.store import JobStore, StoreError

    try:
        job = JobStore().get(job_id)
    except StoreError as exc:
        raise InputError(str(exc)) from None
    if job is None and not missing_ok:
        raise InputError(f"job #{job_id} no longer exists")
    return job


def compared_model(compare: str, base: str) -> tuple[str, str | None, str]:
    """(what to load, whose MLM head reads it, how to label it) for a comparison field next to the sidebar's
    model ``base``: ``job:N`` is job N's fine-tuned encoder read by the pre-trained MLM head of the model it
    started from, labelled ``job #N (head, model)``; ``random`` is ``random:<base>`` (its architecture with
    seeded random weights, head included); anything else is a model name labelled as itself, with its own head.
    Every model it names passes :func:`analysis.core.dataroots.browser_model`, a job's recorded base (its lent head,
    which a job submitted from the CLI may have named anywhere) and its checkpoint included."""
    from analysis.tasks.modelref import resolve

    ref = resolve(compare, base, lambda job_id: find_job(job_id, missing_ok=True), allowed=browser_model,
                  need_head=True)
    return ref.name, ref.head_from, ref.label


def for_each_model(what: str, request_key: str, loaded: LoadedModel, compare: str,
                   compute: Callable[[ModelSpec, str], object]) -> dict:
    """``{label: compute(spec, label)}`` for the sidebar's model and, when ``compare`` names one, a second model
    (same device and precision), with a Stop button meanwhile; the sidebar's model first. Labels are short names
    (:func:`models.spec.short_name`: never the server's absolute path). Failures are messages; the page stops when
    the sidebar's model has no result."""
    from models.spec import short_name

    stop_slot = stop_button(what, request_key)
    results = {}
    first = short_name(loaded.spec.name)
    try:
        results[first] = compute(loaded.spec, first)
        if compare:
            name, head_from, label = compared_model(compare, loaded.spec.name)
            label = short_name(label)
            if label == first:  # the model against itself: shown as a second model (every change 0)
                label = f"{label} (again)"
            results[label] = compute(dataclasses.replace(loaded.spec, name=name, revision=None, head_from=head_from),
                                     label)
    except (ModelLoadError, InputError) as exc:
        st.error(f"Second model: {exc}" if results else str(exc))
    except Exception as exc:  # never a traceback in the UI
        st.error(f"{what} failed: {type(exc).__name__}: {exc}")
    stop_slot.empty()
    if first not in results:
        st.stop()
    return results


def table(frame, headers: dict[str, tuple[str, str]], container=None, **kwargs) -> None:
    """A dataframe whose columns carry the analysis' own header names and help (``headers``: column -> (header, help)),
    numbers to 4 decimals, layer indices as whole numbers (text columns as text). Text cells are shown formula-
    neutralised (:func:`analysis.core.csvout.safe`), so the download in Streamlit's table toolbar is as safe as
    our own CSV files. A value that is not defined (a layer left out, a score with no rows) is drawn as a dash, not as
    Streamlit's grey "None"."""
    from pandas.api.types import is_numeric_dtype

    def layer_like(col: str) -> bool:  # a layer index, even where a missing pair made the column float
        return col == "layer" or col.startswith("layer_") or col.endswith("_layer")

    config = {col: st.column_config.NumberColumn(name, help=text, format="%d" if layer_like(col) else "%.4f")
              if is_numeric_dtype(frame[col]) else st.column_config.TextColumn(name, help=text)
              for col, (name, text) in headers.items() if col in frame.columns}
    kwargs.setdefault("placeholder", "—")
    (container or st).dataframe(safe(frame), hide_index=True, width="stretch", column_config=config, **kwargs)


def md_plain(text) -> str:
    """Text from the data or the user inside a Streamlit caption or message (markdown): markdown and HTML
    characters escaped, so a label such as ``[click](http://x)`` or ``**x**`` is shown as typed; controls and
    bidirectional overrides written out as in charts (:func:`analysis.core.figures.visible`)."""
    import re

    from analysis.core.figures import visible

    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~$:])", r"\\\1", visible(text))
