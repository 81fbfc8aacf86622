"""Resume files are checked, not read as truth (issue 43, item 10): the heads statistics/parse checkpoint (.npz) and
the importance scores (.json) share one ``ResumeFile``, which never follows a link, checks the size before reading,
and checks shapes, dtypes, plan bounds and value ranges before use. A file that fails any check is removed with one
warning and the run starts afresh, with the numbers of a run that never stopped; the next run is not hurt."""

from __future__ import annotations

import io
import json
import logging
import zipfile

import numpy as np
import pandas as pd
import pytest

from analysis.core.inputs import TextInputs
from analysis.heads.importance import mlm_importance
from analysis.heads.model import load_eager
from analysis.heads.run import Stopped, analyse
from models.loading import ModelSpec, load_model
from tests.unit.heads.test_attention_parse import treebank  # noqa: F401 - a fixture

OPTIONS = dict(batch_size=2, max_cells=2000, cluster_tokens=64)
TEXTS = TextInputs(("the film is good .", "i liked the movie and it was fun", "not very good , dull",
                    "it was a bad film !", "the movie is very fun and good"))


@pytest.fixture(scope="module")
def eager(tiny_dirs):
    return load_eager(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))


def stopped_checkpoint(loaded, source, folder):
    """A real checkpoint, saved by a run stopped after its third batch."""
    calls = []

    def cancel(stage, done, total):
        calls.append(done)
        if len(calls) == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        analyse(loaded, source, progress=cancel, resume=folder, **OPTIONS)
    (saved,) = folder.glob("*.npz")
    return saved


def arrays_of(path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def savez(path, arrays) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:]


def crafted(saved) -> dict:
    """name -> a function that damages the checkpoint file in one way."""
    good = saved.read_bytes()
    arrays = arrays_of(saved)
    key = next(k for k in arrays if k.startswith("stats.total"))

    def more_batches(p):
        savez(p, {**arrays, "batches": np.array(10_000)})

    def one_element(p):
        savez(p, {**arrays, key: np.ones(1)})

    def negative(p):
        savez(p, {**arrays, key: -np.abs(arrays[key]) - 1})

    def nan(p):
        savez(p, {**arrays, key: np.full_like(arrays[key], np.nan)})

    def float_batches(p):
        savez(p, {**arrays, "batches": np.array(1.5)})

    def bomb(p):  # a small file whose member claims a huge array (deflated zeros)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
            for name, value in arrays.items():
                member = io.BytesIO()
                np.save(member, np.zeros(50_000_000) if name == key else value)
                z.writestr(name + ".npy", member.getvalue())
        p.write_bytes(buffer.getvalue())

    return {"cut": lambda p: p.write_bytes(good[: len(good) // 2]),
            "flipped byte": lambda p: p.write_bytes(flipped(good, len(good) // 3)),
            "empty": lambda p: p.write_bytes(b""),
            "more batches than the plan": more_batches, "one-element array": one_element,
            "negative sums": negative, "NaN sums": nan, "fractional batches": float_batches, "bomb": bomb}


def test_a_damaged_or_crafted_checkpoint_is_removed_and_the_run_starts_afresh(eager, treebank, tmp_path,  # noqa: F811
                                                                             caplog):
    whole = analyse(eager, treebank, **OPTIONS)
    saved = stopped_checkpoint(eager, treebank, tmp_path / "first")
    for name, damage in crafted(saved).items():
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        path = folder / saved.name
        damage(path)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            result = analyse(eager, treebank, resume=folder, **OPTIONS)
        assert "resumed_after" not in result.info, name
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "starting afresh" in warnings[0], (name, warnings)
        assert not path.exists(), name
        for table in ("heads", "relations", "accuracies", "uuas"):
            pd.testing.assert_frame_equal(getattr(result, table), getattr(whole, table), check_exact=True,
                                          obj=f"{name}: {table}")


def test_a_linked_checkpoint_is_never_followed(eager, treebank, tmp_path):  # noqa: F811
    saved = stopped_checkpoint(eager, treebank, tmp_path / "first")
    elsewhere = tmp_path / "elsewhere.npz"
    elsewhere.write_bytes(saved.read_bytes())
    folder = tmp_path / "linked"
    folder.mkdir()
    (folder / saved.name).symlink_to(elsewhere)
    with pytest.raises(Stopped):  # a stop saves the sums: into a file of its own, never through the link
        analyse(eager, treebank, resume=folder, should_stop=lambda: True, **OPTIONS)
    assert "resumed_after" not in analyse(eager, treebank, resume=folder, **OPTIONS).info
    assert elsewhere.read_bytes() == saved.read_bytes()  # the link's target is neither read as ours nor changed


def test_damaged_importance_scores_are_removed_and_the_run_starts_afresh(tiny_dirs, tmp_path, caplog):
    loaded = load_model(ModelSpec(str(tiny_dirs["bert"]), device="cpu"))
    whole = mlm_importance(loaded, TEXTS, steps=4)
    path = tmp_path / "scores.json"

    def cancel(stage, done, total):
        if stage == "pruning" and done == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        mlm_importance(loaded, TEXTS, steps=4, progress=cancel, checkpoint=path)
    good = json.loads(path.read_text())
    sums, first = np.array(good["gradient"]["sums"]), np.array(good["gradient"]["first"])

    def with_(**change):
        return json.dumps({**good, **change})

    def gradient(**change):
        return with_(gradient={**good["gradient"], **change})

    nan = sums.copy()
    nan[0, 0, 0] = np.nan
    one_sum = sums.copy()
    one_sum[0] *= 1e6
    cases = {
        "NaN gradient": gradient(sums=nan.tolist()).replace("NaN", "NaN"),
        "accuracy 7.0": with_(measured=[[k, 7.0] for k, _ in good["measured"]]),
        "accuracy between counts": with_(measured=[[k, v + 1e-3] for k, v in good["measured"]]),
        "gradient x 1e6": gradient(sums=(sums * 1e6).tolist(), first=(first * 1e6).tolist()),
        "one sum x 1e6": gradient(sums=one_sum.tolist()),
        "gradient transposed": gradient(sums=np.swapaxes(sums, 1, 2).tolist()),
        "examples claimed": gradient(examples=good["gradient"]["examples"] + 1),
        "negative sums": gradient(sums=(-sums).tolist()),
        "heads out of range": with_(measured=[[[10_000], 0.5]]),
        "not an object": "[1, 2, 3]",
        "cut": path.read_text()[:40],
        "oversized": json.dumps({**good, "padding": "x" * 5_000_000}),
    }
    for name, text in cases.items():
        path.write_text(text)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            result = mlm_importance(loaded, TEXTS, steps=4, checkpoint=path)
        assert "resumed_after" not in result.info, name
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "starting afresh" in warnings[0], (name, warnings)
        for table in ("importance", "pruning", "layers"):
            pd.testing.assert_frame_equal(getattr(result, table), getattr(whole, table), check_exact=True,
                                          obj=f"{name}: {table}")
