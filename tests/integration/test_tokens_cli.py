"""``python -m analysis tokens extract|index|neighbours|geometry``: the files docs/tokens.md documents, and bad
input as one line with exit status 2."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cli.main import main
from tests.support.data import FIXTURES


@pytest.fixture(scope="module")
def extracted(tiny_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens_cli") / "extract"
    assert main(["tokens", "extract", "--model", str(tiny_dirs["bert"]), "--device", "cpu", "--input",
                 str(FIXTURES / "ud_tiny_train.conllu"), "--shard-rows", "20", "--out", str(out)]) == 0
    return out


def test_extract_writes_run_json_naming_the_vectors(extracted, capsys):
    run = json.loads((extracted / "run.json").read_text())
    manifest = json.loads((__import__("pathlib").Path(run["vectors"]) / "manifest.json").read_text())
    assert run["layers"] == manifest["layers"] == [0, 1, 2, 3] and run["rows"] == manifest["rows"] > 0
    assert run["shards"] == len(manifest["shards"]) > 1 and run["source"]["kind"] == "conllu"
    tokens = pd.read_parquet(__import__("pathlib").Path(run["vectors"]) / "tokens.parquet")
    assert {"row", "text_id", "position", "token", "word", "upos", "deprel", "shard"} <= set(tokens.columns)


def test_index_neighbours_and_geometry_write_their_files(extracted, tmp_path, capsys):
    assert main(["tokens", "index", "--vectors", str(extracted), "--index", "ivf", "--recall-queries", "20",
                 "--out", str(tmp_path / "ix")]) == 0
    index = pd.read_csv(tmp_path / "ix" / "index.csv")
    assert index["layer"].tolist() == [0, 1, 2, 3] and index["recall@10"].between(0, 1).all()
    assert main(["tokens", "neighbours", "--vectors", str(extracted), "--word", "film", "-k", "3",
                 "--out", str(tmp_path / "nb")]) == 0
    found = pd.read_csv(tmp_path / "nb" / "neighbours.csv")
    assert found.groupby("layer").size().tolist() == [3, 3, 3, 3]
    summary = pd.read_csv(tmp_path / "nb" / "summary.csv")
    assert {"same_word", "same_upos", "upos", "deprel"} <= set(summary.columns)
    assert json.loads((tmp_path / "nb" / "run.json").read_text())["query"]["word"].casefold() == "film"
    exact = tmp_path / "nb_exact"
    assert main(["tokens", "neighbours", "--vectors", str(extracted), "--word", "film", "-k", "3", "--exact",
                 "--out", str(exact)]) == 0
    brute = pd.read_csv(exact / "neighbours.csv")  # the same cosines rank by rank (near-ties may swap rows)
    assert brute["cosine"].to_numpy() == pytest.approx(found["cosine"].to_numpy(), abs=1e-5)
    assert main(["tokens", "geometry", "--vectors", str(extracted), "--boots", "20", "--layers", "0,3",
                 "--out", str(tmp_path / "geo")]) == 0
    geo = pd.read_csv(tmp_path / "geo" / "geometry.csv")
    assert geo["layer"].tolist() == [0, 3] and geo["anisotropy"].between(-1, 1).all()
    assert (tmp_path / "geo" / "rogue_dims.csv").is_file()


@pytest.mark.parametrize("argv, message", [
    (["tokens", "extract", "--input", "missing.txt"], "no such file"),
    (["tokens", "extract"], "needs --input"),
    (["tokens", "index"], "needs --vectors"),
    (["tokens", "geometry", "--vectors", "."], "not a token-vector extraction"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0]


def test_a_neighbour_query_needs_a_token(extracted, capsys):
    assert main(["tokens", "neighbours", "--vectors", str(extracted)]) == 2
    assert "choose the query token" in capsys.readouterr().err
    assert main(["tokens", "neighbours", "--vectors", str(extracted), "--row", "999999"]) == 2
    assert main(["tokens", "neighbours", "--vectors", str(extracted), "--layers", "9", "--row", "0"]) == 2


@pytest.mark.slow
def test_extract_in_two_processes_writes_the_shards_of_one(tmp_path):
    """accelerate launch with two processes: each runs its share of every shard's batches, the main one writes
    them; the shards and metadata equal a one-process run's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import numpy as np

    from analysis.core.parallel import launch_command

    root = Path(__file__).resolve().parents[2]
    args = ["-m", "analysis", "tokens", "extract", "--model", "demo", "--input", str(FIXTURES / "ud_tiny_train.conllu"),
            "--shard-rows", "30", "--batch-size", "2"]
    dirs = []
    for n in (1, 2):  # separate homes: the second run must extract, not read the first one's cache
        full = [*args, "--out", str(tmp_path / f"out{n}")]
        cmd = launch_command(n, *full) if n > 1 else [sys.executable, *full]
        env = {**os.environ, "LAYERLENS_HOME": str(tmp_path / f"home{n}"), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        dirs.append(Path(json.loads((tmp_path / f"out{n}" / "run.json").read_text())["vectors"]))
    assert json.loads((tmp_path / "out2" / "run.json").read_text())["processes"] == 2
    one, two = sorted(dirs[0].glob("shard_*.npy")), sorted(dirs[1].glob("shard_*.npy"))
    assert [p.name for p in one] == [p.name for p in two] and len(one) > 1
    for a, b in zip(one, two, strict=True):
        np.testing.assert_allclose(np.load(a).astype(np.float32), np.load(b).astype(np.float32), atol=2e-3)
    pd.testing.assert_frame_equal(pd.read_parquet(dirs[0] / "tokens.parquet"),
                                  pd.read_parquet(dirs[1] / "tokens.parquet"))
