"""One process-wide cache of loaded models, shared by every browser session, the CLI and notebooks.

Keyed by the resolved :class:`ModelSpec` (name, revision, device, dtype, pickle opt-in). Each device has a
memory budget; when a new model would push a device over it, the least recently used models on that device
are dropped. A model bigger than the whole budget is still served (alone on its device). Thread-safe: two
sessions asking for the same model load it once; different models load concurrently.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import logging
import os
import threading
from collections.abc import Callable

import torch

from models.loading import LoadedModel, ModelSpec, load_model

log = logging.getLogger(__name__)

DEFAULT_FRACTION = 0.5
FALLBACK_BYTES = 4 * 2**30


def free_bytes(device: str) -> int:
    """Free memory on ``device``: GPU memory for cuda, available RAM otherwise."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return FALLBACK_BYTES


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure: CUDA's ``OutOfMemoryError`` or the CPU allocator's error."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and ("can't allocate memory" in str(exc) or "not enough memory" in str(exc)))


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """What the sidebar shows about one cached model."""

    name: str
    device: str
    dtype: str
    nbytes: int
    family: str
    layers: int


class ModelCache:
    """LRU cache of :class:`LoadedModel` with a per-device byte budget.

    ``budget_bytes`` fixes the budget of every device; otherwise each device's budget is ``fraction`` of the
    memory free on it when the cache first loads a model there (env ``LAYERLENS_CACHE_FRACTION``).
    """

    def __init__(self, budget_bytes: int | None = None, fraction: float | None = None,
                 loader: Callable[[ModelSpec], LoadedModel] = load_model):
        if fraction is None:
            fraction = float(os.environ.get("LAYERLENS_CACHE_FRACTION", DEFAULT_FRACTION))
        if not 0 < fraction <= 1:
            raise ValueError(f"cache fraction must be in (0, 1], got {fraction}")
        if budget_bytes is None and os.environ.get("LAYERLENS_CACHE_BYTES"):
            budget_bytes = int(os.environ["LAYERLENS_CACHE_BYTES"])
        self._fixed_budget = budget_bytes
        self._fraction = fraction
        self._loader = loader
        self._budgets: dict[str, int] = {}
        self._items: collections.OrderedDict[ModelSpec, LoadedModel] = collections.OrderedDict()
        self._loading: dict[ModelSpec, threading.Lock] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def budget(self, device: str) -> int:
        """The byte budget of ``device`` (fixed at its first use)."""
        with self._lock:
            return self._budget_locked(device)

    def _budget_locked(self, device: str) -> int:
        if device not in self._budgets:
            self._budgets[device] = self._fixed_budget or int(free_bytes(device) * self._fraction)
        return self._budgets[device]

    def get(self, spec: ModelSpec) -> LoadedModel:
        """The loaded model for ``spec``, loading it (once, however many threads ask) if needed."""
        key = spec.resolved()
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]
            key_lock = self._loading.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._items:  # another thread loaded it while we waited
                    self._items.move_to_end(key)
                    self.hits += 1
                    return self._items[key]
            try:
                loaded = self._load_under_pressure(key)  # outside the global lock: other models stay available
            finally:
                with self._lock:
                    self._loading.pop(key, None)
            with self._lock:
                self.misses += 1
                self._items[key] = loaded
                evicted = self._evict_locked(key.device, keep=key)
        if evicted:
            self._release(key.device)
        return loaded

    def _load_under_pressure(self, key: ModelSpec) -> LoadedModel:
        """Load ``key``; if the device runs out of memory, drop every other cached model there and try once more."""
        try:
            return self._loader(key)
        except RuntimeError as exc:  # torch.OutOfMemoryError included
            if not is_out_of_memory(exc):
                raise
            with self._lock:
                victims = [k for k in self._items if k.device == key.device]
                for k in victims:
                    del self._items[k]
                self.evictions += len(victims)
            if not victims:
                raise
            log.warning("out of memory loading %s; evicted %d cached model(s) and retrying", key.name, len(victims))
            self._release(key.device)
            return self._loader(key)

    def _evict_locked(self, device: str, keep: ModelSpec) -> int:
        budget = self._budget_locked(device)
        evicted = 0
        while self._used_locked(device) > budget:
            victim = next((k for k in self._items if k.device == device and k != keep), None)
            if victim is None:
                log.warning("%s alone exceeds the %s budget of %d bytes", keep.name, device, budget)
                break
            log.info("evicting %s from %s", victim.name, device)
            del self._items[victim]
            evicted += 1
            self.evictions += 1
        return evicted

    @staticmethod
    def _release(device: str) -> None:
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()

    def used(self, device: str) -> int:
        """Bytes held by the cached models on ``device``."""
        with self._lock:
            return self._used_locked(device)

    def _used_locked(self, device: str) -> int:
        return sum(m.nbytes for k, m in self._items.items() if k.device == device)

    def entries(self) -> list[CacheEntry]:
        """Cached models, least recently used first."""
        with self._lock:
            return [CacheEntry(k.name, k.device, k.dtype, m.nbytes, m.anatomy.family, m.num_layers)
                    for k, m in self._items.items()]

    def budgets(self) -> dict[str, int]:
        with self._lock:
            return dict(self._budgets)

    def __contains__(self, spec: ModelSpec) -> bool:
        with self._lock:
            return spec.resolved() in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def clear(self) -> None:
        with self._lock:
            devices = {k.device for k in self._items}
            self._items.clear()
        for device in devices:
            self._release(device)


_shared: ModelCache | None = None
_shared_lock = threading.Lock()


def shared_cache() -> ModelCache:
    """The process-wide cache (the UI wraps this once in ``st.cache_resource``)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ModelCache()
        return _shared


def get(spec: ModelSpec) -> LoadedModel:
    """Shorthand for ``shared_cache().get(spec)``."""
    return shared_cache().get(spec)
