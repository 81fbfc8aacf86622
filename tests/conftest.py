"""What every tier shares: the environment (offline, a LAYERLENS_HOME of its own, float32), the fixtures of tiny
models (the helpers that build them are in tests/support, importable), and the hooks that keep tests apart (no
upload, no process left behind). Each tier has its own conftest for its own fixtures."""

from __future__ import annotations

import functools
import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: any hub access fails fast
os.environ["LAYERLENS_HOME"] = tempfile.mkdtemp(prefix="layerlens-home-")  # never the user's own cache
os.environ.setdefault("LAYERLENS_MODEL_DIRS", tempfile.gettempdir())  # the tests' tiny models live in pytest's tmp
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the same numbers on every machine: float32 unless a test asks for the bf16 paths (LAYERLENS_BF16_UNITS=1)
os.environ.setdefault("LAYERLENS_BF16_UNITS", "0")
# `make test-all` runs the slow tests in pytest-xdist workers: each worker's torch, and every process it starts, gets
# its share of the cores (two workers of two threads each on two cores took 7 min for 3 min of tests)
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.support.models import TINY_CONFIGS, save_tiny, tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """family -> directory holding a tiny random masked LM of that family."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {family: save_tiny(family, root / family) for family in TINY_CONFIGS}


@pytest.fixture(params=sorted(TINY_CONFIGS))
def tiny_dir(request, tiny_dirs) -> Path:
    return tiny_dirs[request.param]


@pytest.fixture(autouse=True)
def _full_streamlit_errors():
    """Show the real error in AppTest failures (the dashboard itself redacts them)."""
    from streamlit import config

    config.set_option("client.showErrorDetails", "full")
    yield


@pytest.fixture(autouse=True)
def _no_uploads_left_behind():
    """Every test starts without uploads: the session's LAYERLENS_HOME is shared, and a page lists the uploads
    folder (an upload saved by one test would otherwise show up as another page's first table)."""
    import shutil

    from analysis.core.dataroots import uploads

    yield
    shutil.rmtree(uploads(), ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item):
    """A job worker, a Slurm job or a server started in a test's own folder is killed when the test ends, passed or
    failed (before its fixtures are torn down): one left running (a 100,000-epoch job whose kill missed) took a core
    from every later test."""
    folder = getattr(item, "funcargs", {}).get("tmp_path")
    if folder is not None:
        kill_processes_under(folder)


def kill_processes_under(folder: Path) -> list[int]:
    """SIGKILL every process of this user whose command line names ``folder`` (Linux's /proc; elsewhere none)."""
    import signal

    proc, needle, killed = Path("/proc"), str(folder), []
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(w == needle or w.startswith(needle + os.sep) for w in words):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except OSError:
                pass
    return killed


# Tests that take more than ~5 s each are marked `@pytest.mark.slow` where they are defined (a module of them:
# `pytestmark`): `make test` runs `pytest -m "not slow"`, `make test-all` (and CI) everything.


def pytest_configure(config):
    """Each new Streamlit ``AppTest`` scans every installed distribution's metadata for components (0.39 s here, on
    each of the page tests: about 30 s of `make test`). The installed packages do not change during a test run, so
    the scan runs once per process and every AppTest gets its result."""
    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:  # another Streamlit: it scans as it does
        return
    manifest_scanner.scan_component_manifests = functools.cache(manifest_scanner.scan_component_manifests)


@pytest.fixture(scope="module")
def bert4(tmp_path_factory):
    """A tiny 4-layer BERT (enough layers for first4/last4 and GRU groups of 1, 2, 4)."""
    import torch
    from transformers import AutoModelForMaskedLM, BertConfig

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("bert4")
    config = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=4, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    model = AutoModelForMaskedLM.from_config(config)
    with torch.no_grad():
        model.cls.predictions.bias.normal_()  # non-zero, so a lost or re-initialised head bias shows
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path
