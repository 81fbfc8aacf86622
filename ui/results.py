"""Results shared across sessions, keyed by (model, inputs, options): a small thread-safe LRU store."""

from __future__ import annotations

import collections
import hashlib
import json
import threading

import streamlit as st


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
