"""What a token-vector extraction holds is whole and finite (issue 34 items 4 and 7):

- hidden states beyond float16's range (65,504) are stored in float32 and the manifest says so; a model whose own
  output is not finite is refused naming the hidden state and the count; map, neighbours and geometry refuse
  non-finite vectors (planted, or left by an older version) with one line;
- the metadata (tokens.parquet, texts.parquet, manifest.json) is checked by ``TokenVectors.open``: a missing
  part, a cut shard, a non-JSON manifest or a cut parquet is one line naming the file and saying to re-run the
  extraction, which rewrites what is damaged; a cut index or map (caches derived from the vectors) is rebuilt.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

from analysis.core.inputs import InputError
from analysis.tokens.geometry import geometry
from analysis.tokens.maps import layer_map
from analysis.tokens.search import across_layers, brute_force
from analysis.tokens.vectors import TokenVectors, write_arrays
from cli.main import main

TEXTS = ["the film is good", "a very bad movie .", "i liked it and it was fun", "the movie was not dull !",
         "it is a film", "i hated the film , it was very bad", "good fun", "the film and the movie"] * 3


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def variant(tiny_dirs, directory: Path, change) -> Path:
    """A copy of the tiny BERT with ``change(model)`` applied to its weights."""
    model = AutoModelForMaskedLM.from_pretrained(tiny_dirs["bert"])
    with torch.no_grad():
        change(model)
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(tiny_dirs["bert"]).save_pretrained(directory)
    return directory


def plain_states(directory: Path, texts: list[str]) -> list[np.ndarray]:
    """Every hidden state's counted (non-special) rows, text by text, from a plain transformers forward."""
    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    per_text = []
    for text in texts:
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            states = model(**enc, output_hidden_states=True).hidden_states
        keep = ~torch.isin(enc["input_ids"][0], torch.tensor(tok.all_special_ids))
        per_text.append([s[0][keep].numpy() for s in states])
    return [np.concatenate(rows) for rows in zip(*per_text, strict=True)]


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    """Each test its own cache: a damaged extraction never reaches the next test."""
    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


# --- item 4: values beyond float16, NaN -------------------------------------------------------------------------


def test_states_beyond_float16_are_stored_in_float32_and_said(tiny_dirs, tmp_path, texts_file, capsys):
    def scale(model):  # layer 0 is the embeddings' LayerNorm output: its gain sets the states' size
        model.bert.embeddings.LayerNorm.weight.mul_(1e5)

    big = variant(tiny_dirs, tmp_path / "big", scale)
    ref = plain_states(big, TEXTS)
    assert np.abs(ref[0]).max() > 65_504 and np.isfinite(ref[0]).all()  # the premise: float16 cannot hold it
    out = tmp_path / "x"
    assert main(["tokens", "extract", "--model", str(big), "--device", "cpu", "--input", str(texts_file),
                 "--shard-rows", "40", "--out", str(out)]) == 0
    tv = TokenVectors.open(out)
    for layer in tv.layers:
        got = tv.rows_at(layer, np.arange(tv.rows))
        assert np.isfinite(got).all(), f"hidden state {layer}: {np.size(got) - np.isfinite(got).sum()} non-finite"
        np.testing.assert_allclose(got, ref[layer], rtol=2e-3, atol=2e-3 * np.abs(ref[layer]).max())
    assert all(s["dtype"] == "float32" and s["float32_layers"] == [0] for s in tv.manifest["shards"])
    run = json.loads((out / "run.json").read_text())
    assert "float32" in run["storage"] and "hidden state 0" in run["storage"]
    capsys.readouterr()
    assert main(["tokens", "map", "--vectors", str(out), "--layer", "0"]) == 0
    coords, _ = layer_map(tv, 0)
    x = ref[0].astype(np.float64) - ref[0].mean(0)
    axes = np.linalg.eigh(x.T @ x)[1][:, ::-1][:, :2]
    np.testing.assert_allclose(np.abs(np.asarray(coords)), np.abs(x @ axes), rtol=1e-3, atol=1e-3 * np.abs(x).max())
    assert main(["tokens", "neighbours", "--vectors", str(out), "--row", "0", "-k", "3", "--layers", "0"]) == 0
    assert main(["tokens", "geometry", "--vectors", str(out), "--layers", "0", "--boots", "5"]) == 0


def test_a_model_whose_output_is_not_finite_is_refused_naming_the_layer(tiny_dirs, tmp_path, texts_file, capsys,
                                                                       own_home):
    def poison(model):  # one gain of layer 2's output LayerNorm: hidden state 3 gets a NaN per token
        model.bert.encoder.layer[2].output.LayerNorm.weight[0] = float("nan")

    bad = variant(tiny_dirs, tmp_path / "nan", poison)
    ref = plain_states(bad, TEXTS)
    first = next(i for i, s in enumerate(ref) if not np.isfinite(s).all())
    assert first == 3
    out = tmp_path / "x"
    capsys.readouterr()
    assert main(["tokens", "extract", "--model", str(bad), "--device", "cpu", "--input", str(texts_file),
                 "--batch-size", "64", "--out", str(out)]) == 2
    line = error_line(capsys)
    # the core's one check counts every real token (special ones too): two more per text than the counted rows
    per_token = int((~np.isfinite(ref[3][0])).sum())
    expected = int((~np.isfinite(ref[3])).sum()) + 2 * len(TEXTS) * per_token
    assert f"hidden state 3: {expected:,}" in line and "not finite" in line
    assert not out.exists()
    vectors = next((own_home / "cache" / "token_vectors").glob("*"))
    assert not list(vectors.glob("shard_*"))  # nothing half-written


def planted(directory: Path, poison=None) -> tuple[TokenVectors, np.ndarray]:
    rng = np.random.default_rng(0)
    n_texts, per = 30, 10
    vectors = rng.normal(size=(2, n_texts * per, 8))
    if poison is not None:
        poison(vectors)
    tokens = pd.DataFrame({"row": np.arange(n_texts * per), "text_id": np.repeat(np.arange(n_texts), per),
                           "position": np.tile(np.arange(1, per + 1), n_texts), "token_id": 5, "token": "w",
                           "word_index": np.tile(np.arange(per), n_texts), "word": "w", "first_subword": True,
                           "start": 0, "end": 1})
    texts = pd.DataFrame({"text_id": np.arange(n_texts), "text": ["w"] * n_texts})
    return write_arrays(directory, vectors, tokens, texts, shard_rows=100), vectors


def plant_nonfinite(vectors):
    vectors[1, [3, 150, 299], [0, 4, 7]] = np.nan
    vectors[1, [10, 11], 2] = [np.inf, -np.inf]


@pytest.mark.parametrize("older", [False, True], ids=["counted", "older-manifest"])
def test_map_neighbours_and_geometry_refuse_non_finite_vectors(tmp_path, capsys, older):
    tv, _ = planted(tmp_path / "v", plant_nonfinite)
    if older:  # an extraction written before the counts were kept: the vectors themselves are checked
        manifest = {k: v for k, v in tv.manifest.items() if k != "nonfinite"}
        (tmp_path / "v" / "manifest.json").write_text(json.dumps(manifest))
        tv = TokenVectors.open(tmp_path / "v")
    for call in (lambda: layer_map(tv, 1), lambda: across_layers(tv, 0, 3, layers=[1]),
                 lambda: across_layers(tv, 0, 3, kind=None, layers=[1]), lambda: geometry(tv, [1], boots=5)):
        with pytest.raises(InputError, match="hidden state 1 .*5 non-finite"):
            call()
    for argv in (["map", "--layer", "1"], ["neighbours", "--row", "0", "--layers", "1"],
                 ["geometry", "--layers", "1", "--boots", "5"]):
        capsys.readouterr()
        assert main(["tokens", *argv, "--vectors", str(tmp_path / "v")]) == 2
        assert "5 non-finite" in error_line(capsys)
    assert layer_map(tv, 0)[0].shape == (300, 2)  # a finite layer of the same extraction still works


# --- item 7: every part checked, damage named, a re-run repairs ---------------------------------------------------


@pytest.fixture
def extraction(tiny_dirs, tmp_path, texts_file):
    out = tmp_path / "x"
    args = ["tokens", "extract", "--model", str(tiny_dirs["bert"]), "--device", "cpu", "--input",
            str(texts_file), "--shard-rows", "40", "--out", str(out)]
    assert main(args) == 0
    tv = TokenVectors.open(out)
    assert len(tv.manifest["shards"]) >= 3
    return tv, args


def snapshot(directory: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def repaired(tv, args, before, capsys):
    capsys.readouterr()
    assert main(args) == 0
    assert snapshot(tv.directory) == before
    assert main(["tokens", "neighbours", "--vectors", str(tv.directory), "--row", "0", "-k", "2"]) == 0


def test_a_kill_between_the_metadata_renames_is_repaired_by_the_next_extract(extraction, capsys):
    tv, args = extraction
    before = snapshot(tv.directory)
    # the state a kill between the two renames of a first run leaves: tokens.parquet, nothing else
    for p in tv.directory.iterdir():
        if p.name != "tokens.parquet":
            p.unlink()
    capsys.readouterr()
    assert main(args) == 0
    assert snapshot(tv.directory) == before
    (tv.directory / "texts.parquet").unlink()  # and a part missing under a manifest: named, not FileNotFoundError
    for argv in (["neighbours", "--row", "0"], ["map"]):
        assert main(["tokens", *argv, "--vectors", str(tv.directory)]) == 2
        line = error_line(capsys)
        assert "texts.parquet" in line and "re-run" in line
    repaired(tv, args, before, capsys)


@pytest.mark.parametrize("damage", ["cut shard", "manifest not JSON", "manifest cut", "tokens.parquet cut",
                                    "shard of another shape"])
def test_a_damaged_part_is_one_line_naming_it_and_a_rerun_repairs_it(extraction, capsys, damage):
    tv, args = extraction
    before = snapshot(tv.directory)
    shard = tv.directory / "shard_00001.npy"
    name = {"cut shard": shard.name, "shard of another shape": shard.name, "tokens.parquet cut": "tokens.parquet"
            }.get(damage, "manifest.json")
    target = tv.directory / name
    data = target.read_bytes()
    if damage == "shard of another shape":
        np.save(target, np.zeros((1, 2, 3), np.float16))
    elif damage == "manifest not JSON":
        target.write_text("not json {")
    else:
        target.write_bytes(data[:len(data) // 2])
    for argv in (["neighbours", "--row", "0"], ["map"], ["geometry", "--boots", "5"]):
        capsys.readouterr()
        assert main(["tokens", *argv, "--vectors", str(tv.directory)]) == 2
        line = error_line(capsys)
        assert name in line and "re-run" in line and "unexpected" not in line
    with pytest.raises(InputError, match=name):
        TokenVectors.open(tv.directory)
    repaired(tv, args, before, capsys)


@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_a_cut_index_is_rebuilt(extraction, capsys, kind):
    tv, _ = extraction
    assert main(["tokens", "index", "--vectors", str(tv.directory), "--index", kind, "--layers", "2"]) == 0
    before = across_layers(tv, 4, 3, kind=kind, layers=[2])
    index = next((tv.directory / "index").glob(f"layer02.{kind}.*[!n]"))  # the .npy or .faiss, not the .json
    index.write_bytes(index.read_bytes()[:200])
    capsys.readouterr()
    assert main(["tokens", "neighbours", "--vectors", str(tv.directory), "--row", "4", "-k", "3", "--layers", "2",
                 "--index", kind]) == 0
    assert "unexpected" not in capsys.readouterr().err
    after = across_layers(tv, 4, 3, kind=kind, layers=[2])
    pd.testing.assert_frame_equal(after, before)
    if kind == "flat":  # exact: the brute force's cosines
        scores, rows = brute_force(tv, 2, tv.rows_at(2, np.array([4])), 4)
        np.testing.assert_allclose(after["cosine"], scores[0][rows[0] != 4][:3], atol=1e-5)


def test_a_cut_map_is_recomputed(extraction, capsys):
    tv, _ = extraction
    first, _ = layer_map(tv, 1)
    first = np.array(first)
    path = tv.directory / "maps" / "layer01.pca2.npy"
    path.write_bytes(path.read_bytes()[:100])
    again, _ = layer_map(tv, 1)
    np.testing.assert_array_equal(np.asarray(again), first)


def test_open_names_a_directory_that_is_no_extraction(tmp_path):
    shutil.rmtree(tmp_path, ignore_errors=True)
    with pytest.raises(InputError, match="no manifest.json"):
        TokenVectors.open(tmp_path)


@pytest.mark.slow
def test_two_processes_store_the_float32_shards_of_one(tiny_dirs, tmp_path, texts_file):
    """Under accelerate launch the main process asks every process for a shard again, in float32: the steps stay
    in lockstep and the files equal a one-process run's."""
    import os
    import subprocess
    import sys

    from analysis.core.parallel import launch_command

    def scale(model):
        model.bert.embeddings.LayerNorm.weight.mul_(1e5)

    big = variant(tiny_dirs, tmp_path / "big", scale)
    args = ["-m", "analysis", "tokens", "extract", "--model", str(big), "--device", "cpu", "--input", str(texts_file),
            "--shard-rows", "40", "--batch-size", "2"]
    found = []
    for n in (1, 2):
        cmd = launch_command(n, *args) if n > 1 else [sys.executable, *args]
        env = {**os.environ, "LAYERLENS_HOME": str(tmp_path / f"home{n}"), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[3], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        found.append(snapshot(Path(done.stdout.strip().splitlines()[-1])))
    assert found[0] == found[1]
    assert json.loads(found[0]["manifest.json"])["shards"][0]["dtype"] == "float32"


def test_a_cut_moments_file_is_computed_again(extraction):
    """A layer's moments (the standardised search's mean and deviation) are an entry of the store like a map or an
    index: a cut file is computed again (it was read as it was, and a cut one failed in numpy)."""
    from analysis.tokens.search import layer_moments

    tv, _ = extraction
    mean, std = layer_moments(tv, 2)
    path = tv.directory / "index" / "layer02.moments.npy"
    path.write_bytes(path.read_bytes()[:90])
    again_mean, again_std = layer_moments(tv, 2)
    np.testing.assert_array_equal(again_mean, mean)
    np.testing.assert_array_equal(again_std, std)
    x = np.asarray(tv.array()[tv.layer_slot(2)], dtype=np.float64)
    np.testing.assert_allclose(mean, x.mean(0), atol=1e-10)
    np.testing.assert_allclose(std, x.std(0), atol=1e-8)


def test_a_map_without_its_manifest_is_computed_again_and_its_manifest_says_its_size(extraction):
    """The manifest is the entry's commit point: a map file whose manifest never got written (a kill between the two
    renames) is not taken as whole; a written manifest names the file and its size."""
    tv, _ = extraction
    first, meta = layer_map(tv, 1)
    path = tv.directory / "maps" / "layer01.pca2.npy"
    assert meta["file"] == path.name and meta["bytes"] == path.stat().st_size
    path.with_suffix(".json").unlink()
    again, meta_again = layer_map(tv, 1)
    assert path.with_suffix(".json").is_file() and meta_again["bytes"] == meta["bytes"]
    np.testing.assert_array_equal(np.asarray(again), np.asarray(first))
