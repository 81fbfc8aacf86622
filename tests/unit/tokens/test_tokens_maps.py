"""A layer's token map (analysis.tokens.maps): the streamed exact PCA equals numpy's PCA of the whole matrix
(up to the documented sign rule), with its explained variance, and is cached; the UMAP map's sample equals
umap-learn's own fit_transform of the same rows and seed, every other row equals the fitted model's transform,
and it is cached; the dispatcher, bad input and ``tokens map``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.core.inputs import InputError
from analysis.tokens import maps
from analysis.tokens.maps import layer_map, pca_map, umap_map, umap_sample_rows
from tests.unit.tokens.test_tokens_search import planted


def test_streamed_pca_equals_numpy_pca_of_all_rows(tmp_path):
    tv = planted(tmp_path / "v", n_texts=40, per_text=20, hidden=12)
    x = np.concatenate([np.asarray(b, np.float64) for _, b in tv.layer_blocks(1)])
    centred = x - x.mean(0)
    values, vectors = np.linalg.eigh(np.cov(centred, rowvar=False))
    order = np.argsort(values)[::-1][:3]
    axes = vectors[:, order]
    axes *= np.sign(axes[np.abs(axes).argmax(0), np.arange(3)])
    coords, meta = pca_map(tv, 1, components=3)
    np.testing.assert_allclose(coords, centred @ axes, atol=1e-4)
    assert meta["explained_variance_ratio"] == pytest.approx((values[order] / values.sum()).tolist(), rel=1e-6)
    again, _ = pca_map(tv, 1, components=3)
    assert isinstance(again, np.memmap)
    np.testing.assert_array_equal(again, coords)
    assert coords.shape == (tv.rows, 3) and coords.dtype == np.float32


# --- UMAP on a sample, the rest transformed ------------------------------------------------------------------

def _reference(x, rows, seed, **extra):
    """umap-learn's own model with the parameters docs/tokens.md states (2-D, 15 neighbours, cosine, 200
    epochs, the seed), fitted on the sampled rows."""
    import umap

    ref = umap.UMAP(n_components=2, n_neighbors=15, metric="cosine", n_epochs=200, random_state=seed, **extra)
    return ref, ref.fit_transform(x[rows])


def _all_rows(tv, layer):
    return np.concatenate([np.asarray(b, np.float32) for _, b in tv.layer_blocks(layer)])


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return planted(tmp_path_factory.mktemp("umap"), n_texts=40, per_text=20, hidden=12)


# umap-learn compiles its numba kernels in every fresh process (tens of seconds): the UMAP tests are slow ones.
@pytest.mark.slow
def test_umap_sample_is_umaps_own_fit_and_the_rest_its_transform(small):
    coords, meta = umap_map(small, 1, sample=300, seed=3, chunk=64)  # 500 rows in 8+ chunks over two shards
    rows = umap_sample_rows(small.rows, 300, 3)
    np.testing.assert_array_equal(rows, np.sort(np.random.default_rng(3).choice(small.rows, 300, replace=False)))
    x = _all_rows(small, 1)
    ref, fitted = _reference(x, rows, 3)
    np.testing.assert_array_equal(coords[rows], fitted)  # bit-identical: a seeded umap-learn fit is serial
    rest = np.setdiff1d(np.arange(small.rows), rows)
    # one call on every other row (umap-learn's transform of a chunk alone differs: the batch's largest edge weight
    # scales its layout; maps.transform_rest uses the largest over all chunks)
    np.testing.assert_array_equal(coords[rest], ref.transform(x[rest]))
    assert coords.shape == (small.rows, 2) and coords.dtype == np.float32
    assert meta["sample"] == 300 and meta["seed"] == 3 and meta["metric"] == "cosine" and meta["n_neighbors"] == 15
    assert meta["transformed_rows"] == 500 and meta["umap_version"]
    np.testing.assert_array_equal(np.load(small.directory / "maps" / meta["sample_file"]), rows)


@pytest.mark.slow
def test_umap_transform_in_chunks_equals_one_transform_with_the_approximate_neighbour_index(small, monkeypatch):
    """Above 4,096 sampled rows umap-learn searches neighbours with pynndescent's index instead of exact
    distances: forced here on small data, the chunked transform still equals one transform of every row."""
    real = maps.make_reducer

    def approximate(*args, **kwargs):
        reducer = real(*args, **kwargs)
        reducer.force_approximation_algorithm = True
        return reducer

    monkeypatch.setattr(maps, "make_reducer", approximate)
    coords, _ = umap_map(small, 0, sample=400, seed=0, chunk=37, force=True)
    rows = umap_sample_rows(small.rows, 400, 0)
    x = _all_rows(small, 0)
    ref, fitted = _reference(x, rows, 0, force_approximation_algorithm=True)
    np.testing.assert_array_equal(coords[rows], fitted)
    rest = np.setdiff1d(np.arange(small.rows), rows)
    np.testing.assert_array_equal(coords[rest], ref.transform(x[rest]))


@pytest.mark.slow
def test_umap_map_is_cached_and_a_new_computation_gives_the_same_array(small):
    first, meta = umap_map(small, 1, sample=200, seed=1)
    again, meta_again = umap_map(small, 1, sample=200, seed=1)
    assert isinstance(again, np.memmap) and meta_again == meta
    np.testing.assert_array_equal(again, first)
    fresh, _ = umap_map(small, 1, sample=200, seed=1, force=True)
    np.testing.assert_array_equal(fresh, first)
    other, meta_other = umap_map(small, 1, sample=200, seed=2)  # another seed: another file
    assert meta_other["file"] != meta["file"] and not np.array_equal(other, first)


@pytest.mark.slow
def test_a_sample_as_large_as_the_corpus_fits_every_row(small):
    coords, meta = umap_map(small, 1, sample=10**6, seed=0)
    assert meta["sample"] == small.rows and meta["transformed_rows"] == 0
    _, fitted = _reference(_all_rows(small, 1), np.arange(small.rows), 0)
    np.testing.assert_array_equal(coords, fitted)


def test_layer_map_dispatches_and_bad_input_says_what_is_wrong(small):
    coords, meta = layer_map(small, 1, "pca")
    np.testing.assert_array_equal(coords, pca_map(small, 1, components=2)[0])
    assert coords.shape == (small.rows, 2)
    with pytest.raises(InputError, match="layer 7 was not extracted.*hidden states 0, 1"):
        layer_map(small, 7, "umap")
    with pytest.raises(InputError, match="layer 5 was not extracted"):
        layer_map(small, 5, "pca")
    with pytest.raises(InputError, match="unknown map method 'tsne'.*pca, umap"):
        layer_map(small, 1, "tsne")
    with pytest.raises(InputError, match="too small"):
        umap_map(small, 1, sample=2)
    with pytest.raises(InputError, match="n_neighbors >= 2"):
        layer_map(small, 1, "umap", n_neighbors=1)


# --- tokens map (CLI) ------------------------------------------------------------------------------------------

def test_tokens_map_writes_the_coordinates_path_in_run_json(small, tmp_path, capsys):
    from cli.main import main

    assert main(["tokens", "map", "--vectors", str(small.directory), "--layer", "1", "--method", "pca",
                 "--out", str(tmp_path / "m")]) == 0
    run = json.loads((tmp_path / "m" / "run.json").read_text())
    assert run["layer"] == 1 and run["method"] == "pca" and run["map"]["components"] == 2
    np.testing.assert_array_equal(np.load(run["coordinates"]), pca_map(small, 1, components=2)[0])
    assert json.loads(Path(run["description"]).read_text()) == run["map"]
    assert capsys.readouterr().out.strip().splitlines()[-1] == run["coordinates"]
    assert main(["tokens", "map", "--vectors", str(small.directory), "--layer", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "layer 4 was not extracted" in err[0]


@pytest.mark.slow
def test_tokens_map_umap_is_the_libraries_map(small, tmp_path):
    from cli.main import main

    assert main(["tokens", "map", "--vectors", str(small.directory), "--method", "umap", "--sample", "250",
                 "--seed", "4", "--out", str(tmp_path / "u")]) == 0
    run = json.loads((tmp_path / "u" / "run.json").read_text())
    assert run["layer"] == 1 and run["map"]["sample"] == 250 and run["map"]["seed"] == 4  # default: the last layer
    np.testing.assert_array_equal(np.load(run["coordinates"]), umap_map(small, 1, sample=250, seed=4)[0])


@pytest.mark.slow
def test_umap_reports_its_epochs_and_rows_and_a_stop_leaves_no_file(small, monkeypatch):
    """The page's progress: the fit's epochs (umap-learn's own epoch loop) and the transform's rows, each a stage of
    its own; an exception raised by the callback (the page's Stop) ends the run at that epoch, leaving no file. The
    reports change nothing: the same array as a run without them."""
    monkeypatch.setattr(maps, "UMAP_REPORT_SECONDS", 0.0)
    seen = []
    coords, meta = umap_map(small, 0, sample=300, seed=6, chunk=64, progress=lambda *a: seen.append(a))
    stages = list(dict.fromkeys(s for s, _, _ in seen))
    assert stages == ["UMAP fit: neighbour graph", "UMAP fit: epoch", "UMAP transform: neighbours of row",
                      "UMAP transform: layout of row"]
    epochs = [(d, n) for s, d, n in seen if s == "UMAP fit: epoch"]
    assert {n for _, n in epochs} == {200} and epochs[-1] == (200, 200) and len(epochs) > 50
    assert [d for d, _ in epochs] == sorted(d for d, _ in epochs)
    for stage in stages[2:]:
        done = [(d, n) for s, d, n in seen if s == stage]
        assert done[-1] == (small.rows - 300, small.rows - 300) and len(done) >= 3  # 200 rows in chunks of 64
    plain, _ = umap_map(small, 0, sample=300, seed=6, chunk=64, force=True)
    np.testing.assert_array_equal(plain, coords)

    class Stop(Exception):
        pass

    def stop_at_epoch_50(stage, done, total):
        if stage == "UMAP fit: epoch" and done >= 50:
            raise Stop

    with pytest.raises(Stop):
        umap_map(small, 1, sample=300, seed=7, progress=stop_at_epoch_50)
    assert not list((small.directory / "maps").glob("layer01.umap-s300-seed7*"))
    # tqdm's refresh() keeps its global write lock when the display raises: the Stop must not leave it held, or
    # every later progress bar of the server process (another session's UMAP, in another thread) waits forever
    import io
    import threading

    from tqdm.auto import tqdm

    other = threading.Thread(target=lambda: [None for _ in tqdm(range(3), disable=False, file=io.StringIO())],
                             daemon=True)
    other.start()
    other.join(timeout=30)
    assert not other.is_alive(), "a tqdm bar in another thread is blocked on the lock the Stop left held"
