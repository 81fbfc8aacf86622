"""Tiny randomly initialised masked LMs built from configs: no downloads anywhere in the tests."""

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
import torch  # noqa: E402
from transformers import (  # noqa: E402
    AlbertConfig,
    AutoModelForMaskedLM,
    BertConfig,
    BertTokenizerFast,
    DistilBertConfig,
    ElectraConfig,
    RobertaConfig,
    XLMRobertaConfig,
)

# The project's shared datasets live beside the checkout on our own machines (../shared/data;
# LAYERLENS_SHARED_DATA overrides). Only the demo model's full quality check reads them; every other test reads
# the small cuts in tests/data (see tests/data/README.md).
SHARED_DATA = Path(os.environ.get("LAYERLENS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
FIXTURES = Path(__file__).resolve().parent / "data"


def shared_file(relative: str) -> Path:
    """A file under the shared data, or a skip saying it is missing; a failure when LAYERLENS_REQUIRE_SHARED=1
    (as in CI, where a missing file must not pass as a skip)."""
    path = SHARED_DATA / relative
    if not path.is_file():
        message = f"needs {path} (the shared datasets beside the checkout; set LAYERLENS_SHARED_DATA)"
        if os.environ.get("LAYERLENS_REQUIRE_SHARED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path
VOCAB = 99
COMMON = dict(vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0)

TINY_CONFIGS = {
    "bert": BertConfig(hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32, **COMMON),
    "albert": AlbertConfig(embedding_size=8, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                           intermediate_size=32, **COMMON),
    "roberta": RobertaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                             **{**COMMON, "pad_token_id": 1}),
    "xlm-roberta": XLMRobertaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=32, **{**COMMON, "pad_token_id": 1}),
    "distilbert": DistilBertConfig(dim=16, n_layers=2, n_heads=2, hidden_dim=32, **COMMON),
    "electra": ElectraConfig(embedding_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=32, **COMMON),
}


def tiny_tokenizer() -> BertTokenizerFast:
    """A WordPiece tokenizer over the first ``VOCAB`` ids of a tiny vocabulary (specials + common words)."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "film", "is", "good", "bad", "not", "very",
             "movie", "and", "it", "was", "i", "liked", "hated", ".", ",", "!", "?", "##s", "##ing", "fun", "dull"]
    words += [f"w{i}" for i in range(VOCAB - len(words))]
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True)


def save_tiny(family: str, directory: Path, seed: int = 0, copy_steps: int = 40) -> Path:
    """Save a tiny ``family`` masked LM and a tokenizer as a ``save_pretrained`` directory.

    The weights are random, then nudged for ``copy_steps`` Adam steps towards reconstructing their input, so
    that layer accuracies are neither all 0 nor all 1 and the probe's tests have something to compare.
    """
    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(TINY_CONFIGS[family])
    if copy_steps:
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(copy_steps):
            ids = torch.randint(5, VOCAB, (8, 12))
            logits = model(input_ids=ids).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
    model.eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


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
