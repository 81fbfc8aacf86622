"""The tuned lens (analysis.probe.lens) on tiny models: untrained = raw probe, training lowers held-out KL per layer,
every family trains and reloads, a lens for other weights is refused, memory is one layer's graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from analysis.core.inputs import InputError, TextInputs
from analysis.probe import lens as L
from analysis.probe import lens_training as LT
from analysis.probe.options import LensOptions
from analysis.probe.reconstruction import ProbeConfig, probe
from models.loading import ModelSpec, load_model
from tests.support.models import TINY_CONFIGS, save_tiny

WORDS = ["the", "a", "film", "is", "good", "bad", "not", "very", "movie", "and", "it", "was", "i", "liked", "hated",
         "fun", "dull", "."]


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(4, 12))) for _ in range(n)]


def options(**changes) -> LensOptions:
    base = {"model": "x", "steps": 8, "batch_size": 8, "eval_texts": 16, "save_every": 4, "max_length": 32}
    return LensOptions(**{**base, **changes})


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return load_model(ModelSpec(str(save_tiny("bert", tmp_path_factory.mktemp("lens") / "bert")), device="cpu"))


@pytest.mark.slow
def test_an_untrained_lens_is_exactly_the_raw_probe(bert):
    inputs = TextInputs(tuple(corpus(12)))
    for mode in ("unmasked", "masked"):
        config = ProbeConfig(mode=mode, batch_size=5)
        raw = probe(bert, inputs, config, divergence=True)
        zero = probe(bert, inputs, config, lens=L.TunedLens(bert.num_layers, bert.anatomy.hidden_size))
        pd.testing.assert_frame_equal(raw.layers, zero.layers)
        pd.testing.assert_frame_equal(raw.tokens, zero.tokens)
        assert (raw.layers["kl_to_final"].iloc[-1], raw.layers["agreement"].iloc[-1]) == (0.0, 1.0)


def test_divergence_columns_are_the_plain_computation(bert):
    texts = corpus(6, seed=3)
    result = probe(bert, TextInputs(tuple(texts)), ProbeConfig(), divergence=True)
    enc = bert.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = bert.model.base_model(**enc, output_hidden_states=True).hidden_states
    counted = enc["attention_mask"].bool() & ~torch.isin(enc["input_ids"], torch.tensor(bert.tokenizer.all_special_ids))
    final = torch.log_softmax(bert.model(**enc).logits[counted], -1)
    for layer, h in enumerate(states):
        logp = torch.log_softmax(bert.anatomy.head(h[counted]), -1)
        kl = torch.nn.functional.kl_div(logp, final, log_target=True, reduction="none").sum(-1).mean()
        agree = (logp.argmax(-1) == final.argmax(-1)).float().mean()
        assert result.layers["kl_to_final"][layer] == pytest.approx(kl.item(), abs=1e-5)
        assert result.layers["agreement"][layer] == pytest.approx(agree.item())


def test_training_lowers_held_out_kl_for_every_layer_and_keeps_the_last(bert, tmp_path):
    training = LT.train(bert, corpus(120), options(steps=30), tmp_path / "lens")
    raw, tuned = training["held_out"]["raw"]["masked"], training["held_out"]["tuned"]["masked"]
    assert all(t < r for r, t in zip(raw["kl"][:-1], tuned["kl"][:-1], strict=True)), (raw["kl"], tuned["kl"])
    assert raw["kl"][-1] == tuned["kl"][-1] == 0.0
    lens = L.load(tmp_path / "lens", bert)
    inputs = TextInputs(tuple(corpus(10, seed=5)))
    a, b = probe(bert, inputs, ProbeConfig(), divergence=True), probe(bert, inputs, ProbeConfig(), lens=lens)
    last = bert.num_layers
    pd.testing.assert_series_equal(a.layers.iloc[last], b.layers.iloc[last])  # the final layer is read alike
    assert not a.layers.iloc[0].equals(b.layers.iloc[0])
    saved = json.loads((tmp_path / "lens" / "training.json").read_text())
    assert saved["steps"] == 30 and len(saved["curve"]) == 30 and saved["options"]["optimizer"] == "sgd"


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
@pytest.mark.slow
def test_every_family_trains_and_reloads(family, tmp_path):
    loaded = load_model(ModelSpec(str(save_tiny(family, tmp_path / family, copy_steps=5)), device="cpu"))
    LT.train(loaded, corpus(40), options(steps=3), tmp_path / "lens")
    lens = L.load(tmp_path / "lens", loaded)
    trained = torch.stack([t.weight for t in lens.translators])
    assert trained.abs().sum() > 0 and len(lens.translators) == loaded.num_layers
    assert L.find(loaded, [tmp_path]) == [tmp_path / "lens"]


def test_a_lens_for_other_weights_is_refused(bert, tmp_path):
    LT.train(bert, corpus(40), options(steps=2), tmp_path / "lens")
    other = load_model(ModelSpec(str(save_tiny("bert", tmp_path / "other", seed=1)), device="cpu"))
    with pytest.raises(InputError, match="trained for"):
        L.load(tmp_path / "lens", other)
    assert L.find(other, [tmp_path]) == []
    with pytest.raises(InputError, match="not a tuned lens"):
        L.load(tmp_path, bert)


def test_stop_and_resume_give_the_uninterrupted_run(bert, tmp_path):
    texts = corpus(80)
    LT.train(bert, texts, options(steps=8), tmp_path / "whole")
    calls = iter(range(100))
    LT.train(bert, texts, options(steps=8), tmp_path / "parts", should_stop=lambda: next(calls) >= 5)
    assert L.trained(tmp_path / "parts") == (5, 8) and L.label(tmp_path / "parts") == "parts (partial: step 5 of 8)"
    assert L.find(bert, [tmp_path]) == [tmp_path / "whole", tmp_path / "parts"]  # finished lenses first
    LT.train(bert, texts, options(steps=8), tmp_path / "parts")
    assert L.trained(tmp_path / "parts") == (8, 8) and L.label(tmp_path / "parts") == "parts"
    a, b = L.load(tmp_path / "whole", bert), L.load(tmp_path / "parts", bert)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(x, y)
    with pytest.raises(InputError, match="other options"):
        LT.train(bert, texts, options(steps=9), tmp_path / "parts")


def peak_saved_bytes(layers: int, directory) -> int:
    """The most bytes of activations the autograd graph holds at once during one training step of a lens on a
    tiny BERT with ``layers`` layers (a backward frees its graph's saved tensors)."""
    from transformers import AutoModelForMaskedLM, BertConfig

    from tests.support.models import tiny_tokenizer

    config = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    AutoModelForMaskedLM.from_config(config).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    loaded = load_model(ModelSpec(str(directory), device="cpu"))
    batch, counted = LT.Batches(loaded, corpus(16), 16, 32, 0).batch(list(range(16)))
    live, peak = [0], [0]

    def pack(t):
        live[0] += t.numel() * t.element_size()
        peak[0] = max(peak[0], live[0])
        return t

    original = torch.Tensor.backward

    def backward(self, *a, **k):
        original(self, *a, **k)
        live[0] = 0

    torch.Tensor.backward = backward
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            LT.layer_losses(loaded, L.TunedLens(layers, 16), batch, counted, options(positions="all"), 0, backward=True)
    finally:
        torch.Tensor.backward = original
    return peak[0]


def test_training_memory_is_one_layers_graph(tmp_path):
    """Saved activations of the autograd graph at any moment of a step: the same with 2 and with 8 layers."""
    two, eight = peak_saved_bytes(2, tmp_path / "2"), peak_saved_bytes(8, tmp_path / "8")
    assert two > 0 and eight == two, (two, eight)


def test_masking_follows_pretraining():
    ids = torch.full((200, 100), 7)
    counted = torch.ones_like(ids, dtype=torch.bool)
    counted[:, :2] = False
    masked, selected = LT.mask_like_pretraining(ids, counted, 0.15, 4, 50, torch.Generator().manual_seed(0))
    assert not selected[:, :2].any() and abs(selected.float().mean().item() / 0.98 - 0.15) < 0.01
    chosen = masked[selected]
    assert abs((chosen == 4).float().mean().item() - 0.8) < 0.02
    assert abs((chosen == 7).float().mean().item() - (0.1 + 0.1 / 50)) < 0.02  # kept, or drawn as itself
    assert torch.equal(masked[~selected], ids[~selected])


def lens_job_setup(tmp_path, monkeypatch, **options):
    """A job store under a temporary LAYERLENS_HOME and a lens job's options: a tiny BERT, 60 corpus texts."""
    from jobs.store import JobStore

    monkeypatch.setenv("LAYERLENS_HOME", str(tmp_path))
    directory = save_tiny("bert", tmp_path / "bert")
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(corpus(60)) + "\n")
    return JobStore(tmp_path / "jobs"), {"kind": "lens", "model": str(directory), "corpus": str(texts),
                                         "batch_size": 8, "eval_texts": 16, "device": "cpu", **options}


@pytest.mark.slow
def test_a_lens_job_runs_through_the_store_and_is_found_for_the_model(tmp_path, monkeypatch):
    from jobs.submit import SubmitError, submit
    from jobs.worker import Worker
    from tests.integration.test_jobs import drive

    store, config = lens_job_setup(tmp_path, monkeypatch, steps=4)
    directory = Path(config["model"])
    job = drive(Worker(store), store, submit(config, store, start_worker=False))
    assert job.status == "succeeded", job.error
    assert job.name.startswith("tuned lens · bert · texts.txt") and "tuned lens" in job.label
    assert job.progress["step"] == 4 and job.metrics["kind"] == "lens"
    assert "held-out KL to the final layer" in job.log_path.read_text()
    loaded = load_model(ModelSpec(str(directory), device="cpu"))
    assert L.find(loaded) == [job.artifacts] and L.label(job.artifacts) == f"job #{job.id}"
    for bad, message in (({"steps": 0}, "steps"), ({"corpus": str(tmp_path / "none.txt")}, "none.txt"),
                         ({"eval_texts": 500}, "more than eval_texts"), ({"kind": "nope"}, "unknown job kind")):
        with pytest.raises(SubmitError, match=message):
            submit({**config, **bad}, store, start_worker=False)


def test_the_demo_model_ships_a_lens_of_its_own():
    from models.spec import DEMO_DIR

    demo = load_model(ModelSpec("demo", device="cpu"))
    assert L.find(demo) == [DEMO_DIR / "lens"] and L.label(DEMO_DIR / "lens") == "bundled lens"
    lens = L.load(DEMO_DIR / "lens", demo)
    assert sum(f.stat().st_size for f in (DEMO_DIR / "lens").iterdir()) < 2 * 2**20
    held = json.loads((DEMO_DIR / "lens" / "training.json").read_text())["held_out"]
    assert all(t < r for r, t in zip(held["raw"]["masked"]["kl"][:-1], held["tuned"]["masked"]["kl"][:-1],
                                     strict=True))
    assert any(t.weight.abs().sum() > 0 for t in lens.translators)
    assert "## Tuned lens" in (DEMO_DIR / "README.md").read_text()


@pytest.mark.slow
def test_ctrl_c_checkpoints_and_the_same_command_resumes(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(corpus(200)) + "\n")
    directory = save_tiny("bert", tmp_path / "bert", copy_steps=0)
    cmd = [sys.executable, "-m", "analysis", "lens", "train", "--model", str(directory), "--corpus", str(texts),
           "--steps", "100000", "--batch-size", "4", "--eval-texts", "16", "--out", str(tmp_path / "lens")]
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    while not (tmp_path / "lens").is_dir() and time.time() < deadline:  # it has started training
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    step, total = L.trained(tmp_path / "lens")
    assert 0 < step < total and "resume" in err
    assert "Traceback" not in err


KILL_AT_A_CHECKPOINT = """
import json, os, signal, sys
from pathlib import Path

from analysis.probe import lens as L
from analysis.probe import lens_training as LT
from analysis.probe.options import LensOptions
from models.loading import ModelSpec, load_model

model, corpus, out, after, options = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
reported = []
real = os.replace


def replace(src, dst):  # the checkpoint of step 6: SIGKILL before its first rename (0), or right after it (1)
    if reported and reported[-1] == 6 and after == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
    if reported and reported[-1] == 6:
        os.kill(os.getpid(), signal.SIGKILL)


os.replace = replace
LT.train(load_model(ModelSpec(model, device="cpu")), Path(corpus).read_text().splitlines(),
        LensOptions(**json.loads(options)), out, progress=lambda step, total, losses: reported.append(step))
"""


@pytest.mark.parametrize("after", [0, 1])
@pytest.mark.slow
def test_a_sigkill_between_the_files_of_a_checkpoint_never_mixes_steps(bert, tmp_path, after):
    """SIGKILL (Cancel's second signal) at an exact point of writing the step-6 checkpoint: before its first
    rename, or right after it. The resumed run ends with the uninterrupted run's translators: the checkpoint is one
    unit, so the resume starts from step 3 or from step 6, never from step 3 with step 6's weights."""
    import subprocess
    import sys
    from pathlib import Path

    texts = corpus(80)
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    opts = options(steps=8, save_every=3, device="cpu")
    LT.train(bert, texts, opts, tmp_path / "whole")
    proc = subprocess.run([sys.executable, "-c", KILL_AT_A_CHECKPOINT, bert.spec.name, str(tmp_path / "texts.txt"),
                           str(tmp_path / "parts"), str(after), json.dumps(opts.to_dict())],
                          cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    logged = []
    LT.train(bert, texts, opts, tmp_path / "parts", log=logged.append)
    a, b = L.load(tmp_path / "whole", bert), L.load(tmp_path / "parts", bert)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(x, y)
    assert logged == [f"resuming from step {3 if after == 0 else 6} of 8", "training in float32"]  # and its mode


CANCEL_AT_STEP_5 = """
import signal, sys, threading
from pathlib import Path

from analysis.probe import lens as L
from analysis.probe import lens_training as LT
from jobs.store import JobStore

job_id, root = int(sys.argv[1]), Path(sys.argv[2])
real = LT.layer_losses


def layer_losses(*args, **kwargs):  # before step 5: Cancel, as the page does, and wait for the worker's SIGTERM
    if args[5] == 5 and kwargs.get("backward", args[6] if len(args) > 6 else False):
        handler, delivered = signal.getsignal(signal.SIGTERM), threading.Event()
        signal.signal(signal.SIGTERM, lambda *a: (handler(*a), delivered.set()))
        JobStore(root).request_cancel(job_id)
        while not delivered.wait(0.05):
            pass
        signal.signal(signal.SIGTERM, handler)
    return real(*args, **kwargs)


LT.layer_losses = layer_losses
sys.argv = ["jobs.run", str(job_id), "--root", str(root)]
from jobs.run import main

raise SystemExit(main())
"""


@pytest.mark.slow
def test_a_cancelled_lens_job_is_listed_as_partial_and_the_same_options_resume_it(tmp_path, monkeypatch):
    """Cancel a lens job through the store at an exact step (the worker's real SIGTERM); its lens is listed as
    partial, not as a finished lens; a job with the same options resumes from its checkpoint and ends with the
    uninterrupted run's translators."""
    import sys

    import jobs.worker
    from jobs.submit import submit
    from jobs.worker import Worker
    from tests.integration.test_jobs import drive

    store, config = lens_job_setup(tmp_path, monkeypatch, steps=12, save_every=4)
    directory = Path(config["model"])
    first = submit(config, store, start_worker=False)
    real = jobs.worker.job_command
    monkeypatch.setattr(jobs.worker, "job_command", lambda job, root: [
        sys.executable, "-c", CANCEL_AT_STEP_5, str(job.id), str(root)] if job.id == first else real(job, root))
    worker = Worker(store)
    cancelled = drive(worker, store, first)
    assert cancelled.status == "cancelled", (cancelled.error, cancelled.log_path.read_text()[-2000:])
    loaded = load_model(ModelSpec(str(directory), device="cpu"))
    assert L.find(loaded) == [cancelled.artifacts]
    assert L.label(cancelled.artifacts) == f"job #{first} (partial: step 6 of 12)"

    second = drive(worker, store, submit(config, store, start_worker=False))
    assert second.status == "succeeded", second.error
    assert f"resuming from step 6 of 12 (the checkpoint of job #{first})" in second.log_path.read_text()
    assert L.label(second.artifacts) == f"job #{second.id}"
    assert L.find(loaded) == [second.artifacts, cancelled.artifacts]  # the finished lens first
    options = LensOptions(**{k: v for k, v in config.items() if k != "kind"})
    LT.train(loaded, LT.read_corpus(options), options, tmp_path / "whole")
    for x, y in zip(L.load(tmp_path / "whole", loaded).parameters(), L.load(second.artifacts, loaded).parameters(),
                    strict=True):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("units, mode", [("1", "bfloat16"), ("0", "float32")])
def test_lens_training_names_its_precision_keeps_float32_translators_and_measures_in_float32(bert, tmp_path,
                                                                                             monkeypatch, units, mode):
    """LAYERLENS_BF16_UNITS=1: the training steps' lens logits are bfloat16 (autocast, the frozen model's bf16
    shadows), the translators float32 master weights; =0: float32 throughout. The held-out measurements (no
    gradient) are float32 in both, the shared model is left as it was, and the lens still learns."""
    monkeypatch.setenv("LAYERLENS_BF16_UNITS", units)
    seen = set()
    real = LT.kl_to_final

    def spy(final_logp, logits):
        seen.add((torch.is_grad_enabled(), logits.dtype))
        return real(final_logp, logits)

    monkeypatch.setattr(LT, "kl_to_final", spy)
    params = {n: (p.dtype, p.data_ptr(), p.requires_grad) for n, p in bert.model.named_parameters()}
    training = LT.train(bert, corpus(60), options(steps=10), tmp_path / "lens")
    assert training["autocast"] == mode
    assert json.loads((tmp_path / "lens" / "training.json").read_text())["autocast"] == mode
    step_dtype = torch.bfloat16 if units == "1" else torch.float32
    assert seen == {(True, step_dtype), (False, torch.float32)}
    assert {p.dtype for p in L.load(tmp_path / "lens", bert).parameters()} == {torch.float32}
    assert {n: (p.dtype, p.data_ptr(), p.requires_grad) for n, p in bert.model.named_parameters()} == params
    raw, tuned = training["held_out"]["raw"]["masked"]["kl"], training["held_out"]["tuned"]["masked"]["kl"]
    assert sum(tuned[:-1]) < sum(raw[:-1])


# A lens of both halves (issue 36 item 5: "and the tuned lens, where one is trained for it"): a translator for each
# layer's attention half beside the layer outputs' ones, trained and read the same way.

def test_an_untrained_lens_of_both_halves_is_exactly_the_raw_probe_of_both(bert):
    inputs = TextInputs(tuple(corpus(12)))
    config = ProbeConfig(batch_size=5, half="attention")
    raw = probe(bert, inputs, config, divergence=True)
    zero = probe(bert, inputs, config, lens=L.TunedLens(bert.num_layers, bert.anatomy.hidden_size, "attention"))
    pd.testing.assert_frame_equal(raw.layers, zero.layers)
    pd.testing.assert_frame_equal(raw.tokens, zero.tokens)


def test_a_lens_of_both_halves_reads_each_attention_half_through_its_own_translator(bert, tmp_path):
    """Trained with --half attention: held-out KL falls at every state but the last output; a stop resumes to the
    uninterrupted run; the probe's attention-half row is the plain computation: a forward hook on the BERT layer's
    attention output module (transformers' BertSelfOutput), then h + A h + b, then the MLM head."""
    texts = corpus(80)
    training = LT.train(bert, texts, options(steps=8, half="attention"), tmp_path / "whole")
    L_ = bert.num_layers
    assert training["states"] == [[0, "output"]] + [[layer, half] for layer in range(1, L_ + 1)
                                                     for half in ("attention", "output")]
    raw, tuned = training["held_out"]["raw"]["masked"]["kl"], training["held_out"]["tuned"]["masked"]["kl"]
    assert len(raw) == 2 * L_ + 1 and all(t < r for r, t in zip(raw[:-1], tuned[:-1], strict=True)), (raw, tuned)
    assert raw[-1] == tuned[-1] == 0.0
    assert L.halves(tmp_path / "whole") == "attention" and L.read_config(tmp_path / "whole")["half"] == "attention"
    assert L.label(tmp_path / "whole") == "whole · both halves"
    calls = iter(range(100))
    LT.train(bert, texts, options(steps=8, half="attention"), tmp_path / "parts", should_stop=lambda: next(calls) >= 3)
    LT.train(bert, texts, options(steps=8, half="attention"), tmp_path / "parts")
    whole, parts = L.load(tmp_path / "whole", bert), L.load(tmp_path / "parts", bert)
    for x, y in zip(whole.parameters(), parts.parameters(), strict=True):
        torch.testing.assert_close(x, y)
    assert whole.attention_translators[0].weight.abs().sum() > 0 and len(whole.attention_translators) == L_

    sample = corpus(6, seed=4)
    result = probe(bert, TextInputs(tuple(sample)), ProbeConfig(half="attention"), lens=whole)
    enc = bert.tokenizer(sample, padding=True, return_tensors="pt")
    counted = enc["attention_mask"].bool() & ~torch.isin(enc["input_ids"], torch.tensor(bert.tokenizer.all_special_ids))
    caught = []
    hook = bert.model.bert.encoder.layer[1].attention.output.register_forward_hook(lambda m, a, out: caught.append(out))
    try:
        with torch.no_grad():
            bert.model(**enc)
    finally:
        hook.remove()
    h = caught[0][counted]
    t = whole.attention_translators[1]  # layer 2's attention half
    with torch.no_grad():
        predicted = bert.anatomy.head(h + h @ t.weight.T + t.bias).argmax(-1)
    accuracy = (predicted == enc["input_ids"][counted]).float().mean().item()
    row = result.layers[(result.layers["layer"] == 2) & (result.layers["half"] == "attention")]
    assert row["accuracy"].item() == pytest.approx(accuracy, abs=1e-6)


def test_a_lens_of_the_outputs_only_refuses_the_attention_halves_in_one_line(bert, tmp_path, capsys):
    from cli.main import main

    LT.train(bert, corpus(40), options(steps=2), tmp_path / "lens")
    lens = L.load(tmp_path / "lens", bert)
    with pytest.raises(InputError, match="trained on the layer outputs only"):
        probe(bert, TextInputs(tuple(corpus(4))), ProbeConfig(half="attention"), lens=lens)
    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(corpus(4)))
    assert main(["probe", "--model", str(bert.spec.name), "--input", str(texts), "--half", "attention", "--lens",
                 str(tmp_path / "lens"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "trained on the layer outputs only" in err and err.count("\n") == 0 and not (tmp_path / "out").exists()


def test_the_bfloat16_shadow_reads_the_attention_halves(bert):
    from analysis.core.activations import hidden_states, make_batch
    from analysis.core.autocast import BF16, autocast, bf16_shadow

    frozen = LT.Frozen(bf16_shadow(bert.model.base_model), bert.anatomy.head, bert.num_layers)
    batches = LT.Batches(bert, corpus(4), 4, 32, 0)
    batch = make_batch(batches.encoded, [0, 1, 2, 3], bert.tokenizer.pad_token_id, "cpu")
    with torch.no_grad(), autocast("cpu", BF16):  # as a lens step runs it
        mine = frozen.hidden_states(batch, batch.input_ids, "attention")
        plain = hidden_states(bert, batch, batch.input_ids, "attention")
    assert len(mine) == len(plain) == 2 * bert.num_layers + 1
    for a, b in zip(mine, plain, strict=True):  # bfloat16 weights: close, not equal
        torch.testing.assert_close(a.float(), b.float(), atol=0.1, rtol=0.05)
