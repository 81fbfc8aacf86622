"""Data-parallel runs (analysis.core.parallel) against one process: real `accelerate launch` runs, two processes on
CPU with gloo, the same rows: integers and text identical, floats within FLOAT_TOLERANCE."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.core.parallel import ONE, Ranks, launch_command
from tests.support.data import FIXTURES

pytestmark = pytest.mark.slow  # every test here takes more than ~5 s

ROOT = Path(__file__).resolve().parents[2]
SST2 = FIXTURES / "sst2_dev_200.tsv"


def run_cli(args: list[str], processes: int, home: Path) -> subprocess.CompletedProcess:
    entry = ["-m", "analysis", *map(str, args)]
    cmd = launch_command(processes, *entry) if processes > 1 else [sys.executable, *entry]
    env = {**os.environ, "LAYERLENS_HOME": str(home), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_steps_give_every_process_the_same_number_of_steps():
    plan = list("abcde")
    shares = [list(Ranks(index=r, count=2).steps(plan)) for r in range(2)]
    assert shares == [["a", "c", "e"], ["b", "d", None]]
    assert list(ONE.steps(plan)) == plan
    assert ONE.gather("x") == ["x"] and ONE.broadcast(3) == 3


FLOAT_TOLERANCE = 1e-5  # absolute: what different thread counts per process may change (float summation order)


def assert_same_rows(a: pd.DataFrame, b: pd.DataFrame, name: str) -> None:
    """What a run in N processes guarantees against one: the same rows in the same order, every integer, text
    and list-of-text cell identical (predictions, ranks, counts, decoded text, top-k tokens), every float within
    :data:`FLOAT_TOLERANCE` (a process computes with fewer threads, so sums are added in another order)."""
    assert list(a.columns) == list(b.columns) and len(a) == len(b), name
    for col in a.columns:
        x, y = a[col], b[col]
        if pd.api.types.is_float_dtype(x):
            assert np.allclose(x, y, atol=FLOAT_TOLERANCE, rtol=0, equal_nan=True), (name, col, (x - y).abs().max())
        elif len(x) and isinstance(x.iloc[0], np.ndarray) and x.iloc[0].dtype.kind == "f":  # top-k probabilities
            assert np.allclose(np.stack(x), np.stack(y), atol=FLOAT_TOLERANCE, rtol=0), (name, col)
        else:
            assert [v.tolist() if isinstance(v, np.ndarray) else v for v in x] == \
                   [v.tolist() if isinstance(v, np.ndarray) else v for v in y], (name, col)


def test_probe_in_two_processes_writes_the_files_of_one(tmp_path):
    # 85 texts in batches of 7: 13 batches, so the second process has one step with nothing to do; with the
    # demo model's tuned lens, so the tuned rows (kl_to_final, agreement) are gathered too (unmasked: the masked
    # mode changes how each batch's states are computed, not how they are gathered, and costs 7 passes a text)
    texts = tmp_path / "texts.tsv"
    texts.write_text("".join(SST2.read_text().splitlines(keepends=True)[:86]))  # the header and 85 rows
    args = ["probe", "--model", "demo", "--input", texts, "--mode", "unmasked", "--batch-size", "7",
            "--lens", ROOT / "models" / "demo" / "lens"]
    for n in (1, 2):
        done = run_cli([*args, "--out", tmp_path / f"out{n}"], n, tmp_path / f"home{n}")
    assert "probing (2 processes)" in done.stderr
    one, two = tmp_path / "out1", tmp_path / "out2"
    for name in ("layers.csv", "decoded.csv"):
        assert_same_rows(pd.read_csv(one / name), pd.read_csv(two / name), name)
    for name in ("tokens.parquet", "tokens_tuned.parquet"):
        a, b = pd.read_parquet(one / name), pd.read_parquet(two / name)
        assert len(a) > 4_000
        assert_same_rows(a, b, name)
    assert [json.loads((d / "run.json").read_text())["processes"] for d in (one, two)] == [1, 2]


def test_atlas_in_two_processes_writes_the_files_of_one(tmp_path):
    args = ["atlas", "--model", "demo", "--data", SST2, "--pooling", "mean", "--layers", "all", "--batch-size", "16"]
    for n in (1, 2):  # separate homes: the second run must extract, not read the first one's cache
        run_cli([*args, "--out", tmp_path / f"out{n}"], n, tmp_path / f"home{n}")
    one, two = tmp_path / "out1", tmp_path / "out2"
    for name in ("coords.csv", "separability.csv", "cka.csv"):
        assert_same_rows(pd.read_csv(one / name), pd.read_csv(two / name), name)
    info = [json.loads((d / "run.json").read_text()) for d in (one, two)]
    assert [i["processes"] for i in info] == [1, 2] and not any(i["cache_hit"] for i in info)
    assert info[1]["model_spec"]["device"] == "cpu"


@pytest.mark.parametrize("processes", [2])
def test_a_bad_input_is_said_once(tmp_path, processes):
    cmd = launch_command(processes, "-m", "analysis", "probe", "--model", "demo", "--input",
                         str(tmp_path / "missing.txt"), "--out", str(tmp_path / "out"))
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0
    assert done.stderr.count("missing.txt") == 1, done.stderr[-2000:]


def test_share_splits_a_global_batch_and_pads_an_empty_share_with_weight_zero():
    import torch

    from analysis.training.train import share

    batch = {"labels": torch.arange(5), "input_ids": torch.arange(10).view(5, 2)}
    parts = [share(batch, Ranks(r, 2)) for r in range(2)]
    assert [p["labels"].tolist() for p, _ in parts] == [[0, 1, 2], [3, 4]]
    assert all(w.tolist() == [1.0] * len(p["labels"]) for p, w in parts)
    one = {"labels": torch.tensor([7]), "input_ids": torch.tensor([[1, 2]])}
    (first, w0), (second, w1) = share(one, Ranks(0, 2)), share(one, Ranks(1, 2))
    assert first["labels"].tolist() == [7] and w0.tolist() == [1.0]
    assert second["labels"].tolist() == [7] and w1.tolist() == [0.0]  # takes the step, adds nothing


def test_two_process_fine_tune_equals_one_process_with_the_same_global_batch(tmp_path):
    """33 training rows in global batches of 8: 5 batches a epoch (odd), the last one a single row, so the second
    process gets a zero-weight copy of it. Dropout is 0 in model and head, so the runs differ only by float
    summation order (the gradient all-reduce adds two partial sums)."""
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM, BertConfig

    from tests.support.models import tiny_tokenizer

    torch.manual_seed(0)
    config = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model_dir = tmp_path / "tiny"
    AutoModelForMaskedLM.from_config(config).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    rng = np.random.default_rng(0)
    words = ["good", "bad", "film", "movie", "fun", "dull", "very", "not"]

    def write(name, n):
        rows = [(" ".join(rng.choice(words, rng.integers(2, 9))), int(rng.integers(0, 2))) for _ in range(n)]
        (tmp_path / name).write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
        return tmp_path / name

    train, val = write("train.csv", 33), write("val.csv", 11)
    args = ["finetune", "--model", model_dir, "--train", train, "--val", val, "--head", "attention",
            "--batch-size", "8", "--epochs", "2", "--dropout", "0", "--lr", "1e-3", "--device", "cpu"]
    for n in (1, 2):
        run_cli([*args, "--out", tmp_path / f"out{n}"], n, tmp_path / f"home{n}")
    one, two = tmp_path / "out1", tmp_path / "out2"
    m1, m2 = (json.loads((d / "metrics.json").read_text()) for d in (one, two))
    assert m1["steps"] == m2["steps"] == 10
    assert m1["steps_per_process"] == [10] and m2["steps_per_process"] == [10, 10]
    r2 = json.loads((two / "run.json").read_text())
    assert (r2["processes"], r2["per_process_batch"], r2["global_batch"]) == (2, 4, 8)
    for h1, h2 in zip(m1["history"], m2["history"], strict=True):
        assert h1["val_loss"] == pytest.approx(h2["val_loss"], abs=1e-5)
        assert h1["train_loss"] == pytest.approx(h2["train_loss"], abs=1e-5)
    w1, w2 = (load_file(d / "checkpoint" / "encoder" / "model.safetensors") for d in (one, two))
    moved = 0
    for name, value in w1.items():
        torch.testing.assert_close(value, w2[name], atol=1e-5, rtol=1e-4, msg=name)
    start = AutoModelForMaskedLM.from_pretrained(model_dir).base_model.state_dict()
    moved = sum(not torch.equal(start[k], w1[k]) for k in w1 if k in start)
    assert moved > len(w1) // 2  # the encoder really trained
    h1, h2 = (load_file(d / "checkpoint" / "head.safetensors") for d in (one, two))
    for name in h1:
        torch.testing.assert_close(h1[name], h2[name], atol=1e-5, rtol=1e-4, msg=name)
    assert (one / "predictions.csv").read_text() == (two / "predictions.csv").read_text()


def test_a_job_with_two_processes_runs_the_shared_loop(tmp_path):
    """num_processes 2: the worker starts accelerate's launcher, the two processes train together, one writes."""
    from jobs.store import JobStore
    from jobs.submit import submit
    from jobs.worker import Worker
    from tests.integration.test_jobs import drive
    from tests.support.data import synthetic
    from tests.unit.training.test_training import write_tsv

    store = JobStore(tmp_path / "jobs")
    config = {"model": "demo", "train": str(write_tsv(tmp_path / "train.tsv", synthetic(21))),
              "val": str(write_tsv(tmp_path / "val.tsv", synthetic(9, seed=1))), "head": "attention",
              "epochs": 1, "batch_size": 4, "num_processes": 2, "device": "cpu"}
    job = drive(Worker(store), store, submit(config, store, start_worker=False), timeout=240)
    assert job.status == "succeeded", job.error
    run = json.loads((job.artifacts / "run.json").read_text())
    assert (run["processes"], run["per_process_batch"], run["global_batch"]) == (2, 2, 4)
    assert job.metrics["steps_per_process"] == [6, 6]  # 21 rows in global batches of 4
    log = job.log_path.read_text()
    assert log.count("epoch 1/1: train loss") == 1, log  # said once, by the main process


def test_structure_in_two_processes_writes_the_files_of_one(tmp_path):
    data = FIXTURES
    args = ["structure", "--model", "demo", "--train", data / "ud_tiny_train.conllu", "--test",
            data / "ud_tiny_test.conllu", "--tasks", "upos,depth", "--layers", "0,2", "--batch-size", "2"]
    for n in (1, 2):  # separate homes: the second run must extract, not read the first one's cache
        run_cli([*args, "--out", tmp_path / f"out{n}"], n, tmp_path / f"home{n}")
    one, two = tmp_path / "out1", tmp_path / "out2"
    for name in ("probes.csv", "mdl.csv", "summary.csv"):
        assert_same_rows(pd.read_csv(one / name), pd.read_csv(two / name), name)
    assert (one / "trees.jsonl").read_text() == (two / "trees.jsonl").read_text()
    info = [json.loads((d / "run.json").read_text()) for d in (one, two)]
    assert [i["processes"] for i in info] == [1, 2] and not any(any(i["cache_hit"].values()) for i in info)
