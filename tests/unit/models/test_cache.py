import threading
import time
from types import SimpleNamespace

import pytest
import torch

from models.cache import ModelCache, free_bytes
from models.loading import ModelLoadError, ModelSpec


class CountingLoader:
    """Stands in for load_model: objects of a given size, counting calls per spec."""

    def __init__(self, sizes: dict[str, int], delay: float = 0.0):
        self.sizes, self.delay, self.calls = sizes, delay, []
        self._lock = threading.Lock()

    def __call__(self, spec):
        with self._lock:
            self.calls.append(spec.name)
        time.sleep(self.delay)
        if self.sizes[spec.name] < 0:
            raise ModelLoadError(f"cannot load {spec.name}")
        return SimpleNamespace(spec=spec, nbytes=self.sizes[spec.name], num_layers=2,
                               anatomy=SimpleNamespace(family="bert"))


def spec(name):
    return ModelSpec(name, device="cpu")


def test_hit_returns_the_same_object_and_loads_once():
    loader = CountingLoader({"a": 10})
    cache = ModelCache(budget_bytes=100, loader=loader)
    assert cache.get(spec("a")) is cache.get(spec("a"))
    assert loader.calls == ["a"] and cache.hits == 1 and cache.misses == 1


@pytest.mark.slow
def test_lru_eviction_under_budget():
    loader = CountingLoader({"a": 40, "b": 40, "c": 40})
    cache = ModelCache(budget_bytes=100, loader=loader)
    cache.get(spec("a"))
    cache.get(spec("b"))
    cache.get(spec("a"))  # a is now most recently used
    cache.get(spec("c"))  # 120 > 100: evict the least recently used, b
    assert [e.name for e in cache.entries()] == ["a", "c"]
    assert cache.used("cpu") == 80 and cache.evictions == 1
    cache.get(spec("b"))
    assert loader.calls == ["a", "b", "c", "b"]


def test_model_larger_than_budget_is_still_served_alone():
    cache = ModelCache(budget_bytes=100, loader=CountingLoader({"a": 40, "huge": 500}))
    cache.get(spec("a"))
    assert cache.get(spec("huge")).nbytes == 500
    assert [e.name for e in cache.entries()] == ["huge"]


def test_key_includes_dtype_and_revision():
    loader = CountingLoader({"a": 1})
    cache = ModelCache(budget_bytes=100, loader=loader)
    cache.get(ModelSpec("a", device="cpu", dtype="float32"))
    cache.get(ModelSpec("a", device="cpu", dtype="bfloat16"))
    cache.get(ModelSpec("a", device="cpu", dtype="float32", revision="v2"))
    cache.get(ModelSpec("a", device="cpu", dtype="auto"))  # resolves to float32 on cpu: a hit
    assert len(loader.calls) == 3 and len(cache) == 3


def test_failed_load_is_not_cached_and_raises_each_time():
    loader = CountingLoader({"bad": -1})
    cache = ModelCache(budget_bytes=100, loader=loader)
    for _ in range(2):
        with pytest.raises(ModelLoadError):
            cache.get(spec("bad"))
    assert len(cache) == 0 and loader.calls == ["bad", "bad"]


def test_concurrent_requests_for_one_model_load_it_once():
    loader = CountingLoader({"a": 10}, delay=0.2)
    cache = ModelCache(budget_bytes=100, loader=loader)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get(spec("a")))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loader.calls == ["a"]
    assert len(results) == 8 and all(r is results[0] for r in results)


def test_different_models_load_concurrently():
    loader = CountingLoader({f"m{i}": 1 for i in range(4)}, delay=0.3)
    cache = ModelCache(budget_bytes=100, loader=loader)
    threads = [threading.Thread(target=cache.get, args=(spec(f"m{i}"),)) for i in range(4)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # serial loading would take 4 x 0.3 s; a generous bound that still fails if loads are serialised
    assert time.perf_counter() - start < 1.0
    assert sorted(loader.calls) == ["m0", "m1", "m2", "m3"] and len(cache) == 4


@pytest.mark.slow
def test_concurrent_mixed_traffic_keeps_budget():
    sizes = {f"m{i}": 30 for i in range(6)}
    cache = ModelCache(budget_bytes=100, loader=CountingLoader(sizes))
    errors = []

    def work(seed):
        try:
            for j in range(15):  # 6 threads x 15 gets of 6 models, room for 3: evictions throughout (each a gc pass)
                cache.get(spec(f"m{(seed + j) % 6}"))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cache.used("cpu") <= 100 and len(cache) <= 3


def test_default_budget_is_a_fraction_of_free_memory():
    cache = ModelCache(fraction=0.25, loader=CountingLoader({}))
    assert 0 < cache.budget("cpu") <= free_bytes("cpu") * 0.25 * 1.1
    with pytest.raises(ValueError):
        ModelCache(fraction=0)


def test_real_models_evicted_by_size(tiny_dirs):
    first = ModelCache(budget_bytes=10**9).get(spec(str(tiny_dirs["bert"])))
    cache = ModelCache(budget_bytes=first.nbytes + 1)  # room for one tiny BERT only
    cache.get(spec(str(tiny_dirs["bert"])))
    cache.get(spec(str(tiny_dirs["distilbert"])))
    assert [e.name for e in cache.entries()] == [str(tiny_dirs["distilbert"])]
    assert cache.entries()[0].family == "distilbert"


CPU_OOM = RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 1000 bytes.")


def test_out_of_memory_while_loading_evicts_the_others_and_retries():
    class TightLoader(CountingLoader):  # "big" fits only once the cache is empty
        def __call__(self, spec):
            if spec.name == "big" and cache.used("cpu") > 0:
                super().__call__(spec)
                raise CPU_OOM
            return super().__call__(spec)

    loader = TightLoader({"a": 10, "b": 10, "big": 50})
    cache = ModelCache(budget_bytes=1000, loader=loader)
    cache.get(spec("a"))
    cache.get(spec("b"))
    assert cache.get(spec("big")).nbytes == 50
    assert [e.name for e in cache.entries()] == ["big"] and cache.evictions == 2
    assert loader.calls == ["a", "b", "big", "big"]


def test_out_of_memory_with_nothing_to_evict_and_other_errors_propagate():
    class Failing(CountingLoader):
        def __call__(self, spec):
            raise CPU_OOM if spec.name == "oom" else RuntimeError("some other failure")

    cache = ModelCache(budget_bytes=1000, loader=Failing({}))
    with pytest.raises(RuntimeError, match="can't allocate"):
        cache.get(spec("oom"))
    with pytest.raises(RuntimeError, match="other failure"):
        cache.get(spec("x"))
    assert len(cache) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (issue 44 item 7: run by "
                    "benchmarks/gpu_check.py's test step where one exists; CI has none)")
def test_on_a_gpu_the_budget_counts_gpu_memory_and_eviction_frees_it():
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    first = ModelSpec("random:demo", device="cuda")
    probe_cache = ModelCache(budget_bytes=10**12)
    size = probe_cache.get(first).nbytes
    probe_cache.clear()
    cache = ModelCache(budget_bytes=int(size * 1.5))  # room for one model, not two
    cache.get(first)
    held = torch.cuda.memory_allocated() - before
    assert held >= size * 0.9  # the model's weights are on the GPU and counted
    cache.get(ModelSpec("random:demo", device="cuda", dtype="bfloat16"))
    assert first not in cache and len(cache) == 1  # the least recently used one went
    assert cache.used("cuda") <= cache.budget("cuda")
    assert torch.cuda.memory_allocated() - before < held  # and its GPU memory was given back
    cache.clear()
    assert torch.cuda.memory_allocated() - before < size * 0.1
