"""A full disk is one readable line, never a SIGBUS (issue 34 item 1): every file written through a memory map
(token shards, the flat index, the maps, the store's entries, structure word vectors) has its blocks reserved
before it is mapped (:func:`analysis.core.staging.open_npy`). Each test mounts a small tmpfs (skipped where mounting
is not permitted) and runs a real process on it: the CLI, or a library call in a child process as the Streamlit
server makes it, so that a SIGBUS shows as the child's death and not as the test runner's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
DEMO = ROOT / "models" / "demo"
pytestmark = pytest.mark.slow  # real processes loading torch: several seconds each


@pytest.fixture
def small_disk(tmp_path):
    """A 12 MB tmpfs at ``tmp_path / "disk"``, unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(disk)], capture_output=True,
                          text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def corpus(path: Path, lines: int, seed: int = 0) -> Path:
    """Plain texts of the demo model's domain, about 12 counted tokens a line."""
    rng = np.random.default_rng(seed)
    words = "the battery is great but the screen was not very good and i liked the price of this phone".split()
    path.write_text("\n".join(" ".join(rng.choice(words, size=12)) for _ in range(lines)) + "\n")
    return path


def run(args: list[str], home: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAYERLENS_HOME": str(home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("LAYERLENS_DEBUG", None)
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600, **kw)


def temporaries(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
                  and (p.name.endswith(".tmp") or p.name.startswith(".")))


def used_bytes(folder: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def one_line_no_space(done: subprocess.CompletedProcess, disk: Path) -> str:
    assert done.returncode != -signal.SIGBUS and done.returncode != 128 + signal.SIGBUS, \
        f"killed by SIGBUS: {done.stderr[-500:]}"
    lines = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1, done.stderr[-2000:]
    assert "no space left on device under" in lines[0] and str(disk) in lines[0] and "MB needed" in lines[0]
    assert "Traceback" not in done.stderr
    return lines[0]


def test_cli_extract_on_a_full_disk_says_so_and_leaves_nothing(small_disk, tmp_path):
    texts = corpus(tmp_path / "texts.txt", 1200)  # ~14,000 tokens x 5 hidden states x 256 x 2 bytes: ~36 MB
    done = run([PYTHON, "-m", "analysis", "tokens", "extract", "--model", str(DEMO), "--device", "cpu",
                "--input", str(texts)], small_disk)
    line = one_line_no_space(done, small_disk)
    needed = int(line.split("MB needed")[0].split()[-1].replace(",", ""))
    assert needed > 12  # the shard's size, which does not fit
    assert temporaries(small_disk) == []
    assert used_bytes(small_disk) < 2 * 2**20  # the token table and manifest only, no partial shard


def test_server_process_survives_a_full_disk(small_disk, tmp_path):
    """As the Token atlas page calls it: the extraction raises the readable error and the process lives on."""
    texts = corpus(tmp_path / "texts.txt", 1200)
    script = textwrap.dedent(f"""
        from analysis.core.activations import max_input_length
        from analysis.core.inputs import InputError
        from analysis.tokens.corpus import read_corpus
        from analysis.tokens.vectors import extract
        from models.loading import ModelSpec, load_model

        loaded = load_model(ModelSpec({str(DEMO)!r}, device="cpu"))
        corpus = read_corpus(loaded.tokenizer, {str(texts)!r}, max_input_length(loaded), "text", None, None)
        try:
            extract(loaded, corpus)
        except InputError as exc:
            print("refused:", exc)
        print("alive")
    """)
    done = run([PYTHON, "-c", script], small_disk)
    assert done.returncode == 0, f"the process died ({done.returncode}): {done.stderr[-1500:]}"
    assert "refused: no space left on device under" in done.stdout and done.stdout.rstrip().endswith("alive")
    assert temporaries(small_disk) == []


def test_cli_index_on_a_full_disk_cleans_its_temporaries(small_disk, tmp_path):
    """The extraction (~8 MB) fits, the flat indexes of its 5 layers (float32, ~3 MB each) do not."""
    texts = corpus(tmp_path / "texts.txt", 260)
    done = run([PYTHON, "-m", "analysis", "tokens", "extract", "--model", str(DEMO), "--device", "cpu",
                "--input", str(texts)], small_disk)
    assert done.returncode == 0, done.stderr[-1500:]
    vectors = Path(done.stdout.strip().splitlines()[-1])
    done = run([PYTHON, "-m", "analysis", "tokens", "index", "--vectors", str(vectors), "--index", "flat"],
               small_disk)
    one_line_no_space(done, small_disk)
    assert temporaries(small_disk) == []
    index = vectors / "index"
    for npy in index.glob("*.npy"):  # what is there is whole: each index file with its description
        assert np.load(npy, mmap_mode="r").shape[0] > 0 and npy.with_suffix(".json").is_file()


STORE_SCRIPT = """
import numpy as np
from analysis.core.store import ArrayStore
store = ArrayStore({root!r})
with store.create("x", "k", (40, 65536), np.float32) as out:  # 10 MB on a disk with less left
    for i in range(40):
        out[i] = i
    kept = np.asarray(out).copy()
assert (kept[:, 0] == np.arange(40)).all()
print("stored:", store.get("x", "k") is not None)
"""


def test_store_create_on_a_full_disk_keeps_the_array_in_memory(small_disk):
    (small_disk / "filler").write_bytes(b"\0" * (6 * 2**20))  # 6 of 12 MB taken
    done = run([PYTHON, "-c", STORE_SCRIPT.format(root=str(small_disk / "cache"))], small_disk)
    assert done.returncode == 0, f"the process died ({done.returncode}): {done.stderr[-1500:]}"
    assert "stored: False" in done.stdout and "could not cache" in done.stderr
    assert temporaries(small_disk / "cache") == []


def test_structure_word_vectors_on_a_full_disk(small_disk):
    """The bundled EWT sample's word vectors (~24 MB float32) on a 12 MB disk: the probes get them from memory,
    equal to those a roomy disk stores."""
    script = textwrap.dedent(f"""
        import numpy as np
        from analysis.core.store import ArrayStore
        from analysis.core.treebank import read_conllu
        from analysis.structure.words import extract
        from models.loading import ModelSpec, load_model

        loaded = load_model(ModelSpec({str(DEMO)!r}, device="cpu"))
        sample = {str(ROOT / "analysis/data/ud_english_ewt_sample/en_ewt-ud-dev-first300.conllu.gz")!r}
        words = [s.words for s in read_conllu(sample).sentences]
        full = extract(loaded, words, store=ArrayStore({str(small_disk / "c")!r}))
        roomy = extract(loaded, words, store=ArrayStore({str(small_disk.parent / "c")!r}))
        assert np.array_equal(full.layer(3), roomy.layer(3)) and not full.cache_hit
        print("alive", full.vectors.nbytes)
    """)
    done = run([PYTHON, "-c", script], small_disk)
    assert done.returncode == 0, f"the process died ({done.returncode}): {done.stderr[-1500:]}"
    assert int(done.stdout.split()[-1]) > 12 * 2**20 and temporaries(small_disk) == []
