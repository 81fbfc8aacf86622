"""Training in bfloat16 autocast (float32 master weights) against float32, and against the HF Trainer's
``bf16=True``, on this machine's matrix units, in one run (issue 26).

    python -m benchmarks.bench_train_precision [--part finetune,lens,lens-kl,demo] [--steps 8] [--warmup 2]

- **finetune**: bert-base size (the config and tokenizer of ``../shared/data/tokenizers/bert-base-uncased``,
  random weights saved once to a temporary folder, so both read the same weights), a [CLS] classifier, the first
  1,000 SST-2 train rows, batch 16, max length 128, dynamic padding. A whole epoch (63 steps) takes too long on 2
  cores: ``--warmup`` steps, then ``--steps`` timed ones (the time between the ends of consecutive steps, data
  loading included, as the Trainer's own loop sees it); examples/s, padded tokens/s and the epoch extrapolated
  (steps per epoch x mean step). Our engine (:func:`analysis.training.train.train`, length-grouped batches) in float32
  and in bf16 autocast (``LAYERLENS_BF16_UNITS`` forced), the HF Trainer with ``bf16=True, use_cpu=True``
  (default random sampler and ``group_by_length``). Training FLOPs are estimated as 6 x parameters x tokens
  and set against the GEMM peaks measured in the same run on a layer's shape (2,048 x 768 by 768 x 3,072).
- **lens**: tuned-lens steps (:func:`analysis.probe.lens.layer_losses`) at bert-base size, batch 16: float32,
  plain bf16 autocast, and bf16 autocast through the frozen model's bf16 shadows (what ``lens.train`` runs).
- **lens-kl**: the demo model's lens trained for ``--lens-steps`` in float32 and in bf16 (``lens.train``, same
  batches and masks); the held-out KL (measured in float32) of each, and tokens/s.
- **demo**: the README's demo fine-tune (``--model demo --train demo --head attention``, 3 epochs) over 3 seeds
  in both modes: validation accuracy.
``--profile``: the top ops (torch.profiler, self CPU time) of one bf16 step of our engine and of the Trainer.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from benchmarks import SHARED, data_file

BERT_BASE = SHARED / "tokenizers" / "bert-base-uncased"
ENV = "LAYERLENS_BF16_UNITS"


@contextmanager
def units(flag: str):
    """Force the precision policy (analysis.core.precision.bf16_pays) on ("1") or off ("0") inside the block."""
    old = os.environ.get(ENV)
    os.environ[ENV] = flag
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def gemm_gflops(m: int, k: int, n: int, dtype: torch.dtype, repeats: int = 20) -> float:
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


class StepTimer:
    """Times between the ends of consecutive steps, and the padded tokens each step's forward saw (a pre-hook on
    the word embeddings, training mode only)."""

    def __init__(self, embeddings: torch.nn.Module, warmup: int):
        self.ends, self.tokens, self.warmup = [], [], warmup
        self.hook = embeddings.register_forward_pre_hook(self._count)

    def _count(self, module, args):
        if module.training:
            self.tokens.append(args[0].numel())

    def step_end(self) -> None:
        self.ends.append(time.perf_counter())

    def result(self, steps_per_epoch: int, batch: int) -> dict:
        self.hook.remove()
        times = np.diff(self.ends[self.warmup - 1:])  # the steps after the warm-up ones
        tokens = self.tokens[self.warmup:self.warmup + len(times)]
        mean = float(times.mean())
        return {"steps": len(times), "mean_step": mean, "examples_s": batch / mean,
                "tokens_s": sum(tokens) / float(times.sum()), "epoch_s": steps_per_epoch * mean,
                "tokens": sum(tokens)}


def engine_run(model_dir: Path, inputs, labels, args, flag: str, profile: bool = False) -> dict:
    from analysis.training.taskdata import prepare
    from analysis.training.train import Classifier, FinetuneConfig, train
    from models.loading import ModelSpec, load_encoder

    with units(flag):
        encoder, tok = load_encoder(ModelSpec(str(model_dir), device="cpu"))
        data = prepare(tok, inputs, labels, args.max_length, "head")
        model = Classifier(encoder, "cls", len(labels))
        timer = StepTimer(model.encoder.embeddings.word_embeddings, args.warmup)
        total = args.warmup + args.steps
        config = FinetuneConfig(epochs=1, batch_size=args.batch_size, max_length=args.max_length, max_steps=total,
                                save_vectors=False)
        prof = None

        def on(event, state, control):
            nonlocal prof
            if event != "step":
                return
            timer.step_end()
            if prof is not None and state.step == total:  # the last step alone, not the evaluation after it
                prof.__exit__(None, None, None)
            if profile and state.step == total - 1:
                from torch.profiler import ProfilerActivity
                from torch.profiler import profile as profiler

                prof = profiler(activities=[ProfilerActivity.CPU])
                prof.__enter__()

        _, state = train(model, data, data.subset(range(8)), config, tok.pad_token_id, "cpu", callbacks=[on])
        if prof is not None:
            print(f"  profile of our engine's last step ({state.autocast}):")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
        out = timer.result(-(-len(data) // args.batch_size), args.batch_size)
        out["autocast"] = state.autocast
        return out


def trainer_run(model_dir: Path, inputs, labels, args, bf16: bool, group_by_length: bool,
                profile: bool = False) -> dict:
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=len(labels))
    enc = tok(list(inputs.texts), truncation=True, max_length=args.max_length)
    rows = [{"input_ids": ids, "attention_mask": m, "labels": labels[y]}
            for ids, m, y in zip(enc["input_ids"], enc["attention_mask"], inputs.labels, strict=True)]
    timer = StepTimer(model.bert.embeddings.word_embeddings, args.warmup)
    total = args.warmup + args.steps
    holder = {}

    class Timing(TrainerCallback):
        def on_step_end(self, targs, state, control, **kw):
            timer.step_end()
            if "prof" in holder and state.global_step == total:
                holder["prof"].__exit__(None, None, None)
            if profile and state.global_step == total - 1:
                from torch.profiler import ProfilerActivity
                from torch.profiler import profile as profiler

                holder["prof"] = profiler(activities=[ProfilerActivity.CPU])
                holder["prof"].__enter__()

    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(out, per_device_train_batch_size=args.batch_size, max_steps=total,
                                  learning_rate=2e-5, warmup_steps=0.1, weight_decay=0.01, save_strategy="no",
                                  eval_strategy="no", logging_strategy="no", report_to=[], bf16=bf16, use_cpu=True,
                                  dataloader_num_workers=0, seed=0, disable_tqdm=True,
                                  train_sampling_strategy="group_by_length" if group_by_length else "random")
        trainer = Trainer(model=model, args=targs, train_dataset=rows, data_collator=DataCollatorWithPadding(tok),
                          callbacks=[Timing()])
        trainer.train()
    if "prof" in holder:
        print(f"  profile of the HF Trainer's last step (bf16={bf16}):")
        print(holder["prof"].key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
    return timer.result(-(-len(rows) // args.batch_size), args.batch_size)


def report(runs: dict, params: int, f32: float, b16: float) -> None:
    """The table: medians per variant, GFLOP/s (6 x parameters x tokens) and the share of the measured peak."""
    rows = {}
    print(f"  {'':<32} {'examples/s':>10} {'tokens/s':>9} {'s/step':>7} {'epoch (extrap.)':>15} "
          f"{'GFLOP/s':>8} {'of peak':>8}")
    for name, results in runs.items():
        r = {k: statistics.median(x[k] for x in results) for k in ("mean_step", "examples_s", "tokens_s",
                                                                     "epoch_s")}
        rows[name] = r
        gflops = 6 * params * r["tokens_s"] / 1e9
        peak = b16 if "bf16" in name else f32
        print(f"  {name:<32} {r['examples_s']:>10.2f} {r['tokens_s']:>9.0f} {r['mean_step']:>7.2f} "
              f"{r['epoch_s']:>13.0f} s {gflops:>8.0f} {gflops / peak:>8.0%}")
    ours, ours32 = rows["ours bf16"], rows["ours float32"]
    print(f"  ours bf16 / ours float32: {ours['examples_s'] / ours32['examples_s']:.2f}x examples/s "
          f"(target >= 2x)")
    for name in ("HF Trainer bf16", "HF Trainer bf16 group_by_length"):
        print(f"  ours bf16 / {name}: {ours['examples_s'] / rows[name]['examples_s']:.2f}x examples/s, "
              f"{ours['tokens_s'] / rows[name]['tokens_s']:.2f}x padded tokens/s (target >= 1.2x)")


def fresh_accelerate() -> None:
    """Forget accelerate's process-wide state: the Trainer sets it to bf16 mixed precision, which our engine's own
    ``Accelerator(mixed_precision="no")`` (autocast entered by the engine) may not change within one process."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)


def finetune_part(args) -> None:
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

    from analysis.core.inputs import read_file
    from analysis.training.taskdata import label_ids

    inputs = read_file(data_file("sst2/train.tsv", "sst2_dev_200.tsv"), limit=args.rows, label_column="label")
    labels = label_ids(inputs.labels)
    config = AutoConfig.from_pretrained(BERT_BASE)
    hidden, inter = config.hidden_size, config.intermediate_size
    f32, b16 = (gemm_gflops(2048, hidden, inter, dt) for dt in (torch.float32, torch.bfloat16))
    print(f"layer-shape GEMM (2048 x {hidden} by {hidden} x {inter}): float32 {f32:.0f} GFLOP/s, bfloat16 "
          f"{b16:.0f} GFLOP/s ({b16 / f32:.2f}x)")
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = AutoModelForMaskedLM.from_config(config)
        params = sum(p.numel() for p in model.bert.parameters())
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(BERT_BASE).save_pretrained(tmp)
        del model
        print(f"fine-tuning: bert-base size (random weights, {params / 1e6:.1f} M encoder parameters), [CLS] head, "
              f"{len(inputs):,} SST-2 train rows, batch {args.batch_size}, max length {args.max_length}; "
              f"{args.warmup} warm-up + {args.steps} timed steps, {args.repeats} run(s) each, medians")
        runs: dict[str, list[dict]] = {}
        plan = [("ours float32", lambda: engine_run(Path(tmp), inputs, labels, args, "0")),
                ("ours bf16", lambda: engine_run(Path(tmp), inputs, labels, args, "1")),
                ("HF Trainer bf16", lambda: trainer_run(Path(tmp), inputs, labels, args, True, False)),
                ("HF Trainer bf16 group_by_length", lambda: trainer_run(Path(tmp), inputs, labels, args, True, True))]
        if args.trainer_fp32:
            plan.append(("HF Trainer float32", lambda: trainer_run(Path(tmp), inputs, labels, args, False, False)))
        for _ in range(0 if args.profile_only else args.repeats):  # alternate: drifts in speed hit every variant
            for name, fn in plan:
                fresh_accelerate()
                runs.setdefault(name, []).append(fn())
        if runs:
            report(runs, params, f32, b16)
        if args.profile or args.profile_only:
            args = argparse.Namespace(**{**vars(args), "warmup": 2, "steps": 1})
            fresh_accelerate()
            engine_run(Path(tmp), inputs, labels, args, "0", profile=True)
            fresh_accelerate()
            engine_run(Path(tmp), inputs, labels, args, "1", profile=True)
            fresh_accelerate()
            trainer_run(Path(tmp), inputs, labels, args, True, True, profile=True)


def lens_speed_part(args) -> None:
    from analysis.probe import lens as L
    from analysis.probe import lens_training as LT
    from analysis.probe.options import LensOptions
    from benchmarks.bench_lens import texts
    from models.loading import ModelSpec, load_model

    loaded = load_model(ModelSpec(f"random:{BERT_BASE}", device="cpu", dtype="float32"))
    options = LensOptions(model="x", batch_size=args.lens_batch, max_length=128)
    batches = LT.Batches(loaded, texts(2000), args.lens_batch, 128, 0)
    frozen = LT.Frozen.of(loaded, "bfloat16")
    print(f"tuned-lens steps, bert-base size (random weights, {loaded.num_layers} layers, vocabulary "
          f"{loaded.anatomy.vocab_size:,}), batch {args.lens_batch} texts, 1 warm-up + {args.lens_timed} timed "
          f"steps, masked positions")
    variants = {"float32": (False, None), "bf16 autocast": (True, None), "bf16 autocast + shadows": (True, frozen)}
    speed: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, (bf16, shadow) in variants.items():
            lens = L.TunedLens(loaded.num_layers, loaded.anatomy.hidden_size)
            tokens, start = 0, None
            for step in range(1 + args.lens_timed):
                if step == 1:
                    tokens, start = 0, time.perf_counter()
                batch, counted = batches.batch(batches.rows(step))
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    LT.layer_losses(loaded, lens, batch, counted, options, step, backward=True, frozen=shadow)
                lens.zero_grad(set_to_none=True)
                tokens += int(batch.attention_mask.sum())
            speed.setdefault(name, []).append(tokens / (time.perf_counter() - start))
    base = statistics.median(speed["float32"])
    for name, values in speed.items():
        v = statistics.median(values)
        print(f"  {name:<26} {v:>7,.0f} tokens/s  {v / base:.2f}x")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        lens = L.TunedLens(loaded.num_layers, loaded.anatomy.hidden_size)
        batch, counted = batches.batch(batches.rows(0))
        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.autocast("cpu", dtype=torch.bfloat16):
            LT.layer_losses(loaded, lens, batch, counted, options, 0, backward=True, frozen=frozen)
        print("  profile of one bf16 lens step (shadows):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def lens_kl_part(args) -> None:
    from analysis.probe import lens_training as LT
    from analysis.probe.options import LensOptions
    from benchmarks.bench_lens import texts
    from models.loading import ModelSpec, load_model

    loaded = load_model(ModelSpec("demo", device="cpu", dtype="float32"))
    corpus = texts(3000)
    print(f"demo lens ({loaded.num_layers} layers), {args.lens_steps} steps of 16 texts, held-out KL at masked "
          "positions (128 held-out texts, measured in float32), mean over layers 0..L-1")
    kl = {}
    for flag in ("0", "1"):
        with units(flag), tempfile.TemporaryDirectory() as out:
            training = LT.train(loaded, corpus, LensOptions(model="demo", steps=args.lens_steps,
                                                           save_every=10**6), Path(out))
        tuned = training["held_out"]["tuned"]["masked"]["kl"][:-1]
        raw = training["held_out"]["raw"]["masked"]["kl"][:-1]
        kl[flag] = float(np.mean(tuned))
        tokens_s = training["tokens_per_step"] * training["steps"] / training["seconds"]
        print(f"  {training['autocast']:<9} held-out KL {kl[flag]:.4f} nats (raw head {np.mean(raw):.4f}); per "
              f"layer {', '.join(f'{x:.3f}' for x in tuned)}; {tokens_s:,.0f} tokens/s (training.json's seconds)")
    print(f"  bf16 vs float32 held-out KL: {kl['1'] / kl['0'] - 1:+.2%} (target within 2%)")


def demo_part(args) -> None:
    import json

    from cli.main import main as cli

    print(f"README demo fine-tune (--model demo --train demo --head attention, defaults), seeds "
          f"{', '.join(map(str, range(args.seeds)))}: validation accuracy")
    acc: dict[str, list[float]] = {}
    for seed in range(args.seeds):
        for flag in ("0", "1"):
            with units(flag), tempfile.TemporaryDirectory() as out:
                start = time.perf_counter()
                code = cli(["finetune", "--model", "demo", "--train", "demo", "--head", "attention", "--seed",
                            str(seed), "--out", f"{out}/run"])
                assert code == 0, code
                metrics = json.loads(Path(out, "run", "metrics.json").read_text())
                acc.setdefault(metrics["autocast"], []).append(metrics["accuracy"])
                print(f"  seed {seed} {metrics['autocast']:<9} accuracy {metrics['accuracy']:.3f} "
                      f"({time.perf_counter() - start:.1f} s)")
    f32, b16 = np.array(acc["float32"]), np.array(acc["bfloat16"])
    print(f"  mean float32 {f32.mean():.3f}, bfloat16 {b16.mean():.3f}; largest per-seed difference "
          f"{np.abs(f32 - b16).max():.3f} (target within 0.02)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--part", default="finetune,lens,lens-kl,demo")
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--trainer-fp32", action="store_true", help="also the HF Trainer in float32")
    p.add_argument("--lens-batch", type=int, default=16)
    p.add_argument("--lens-timed", type=int, default=4)
    p.add_argument("--lens-steps", type=int, default=250)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-only", action="store_true", help="finetune: only the profiles of one step")
    args = p.parse_args()
    from analysis.core.precision import bf16_units

    print(f"{datetime.date.today()}; {cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; bf16 units: {bf16_units('cpu')}")
    parts = {"finetune": finetune_part, "lens": lens_speed_part, "lens-kl": lens_kl_part, "demo": demo_part}
    for name in args.part.split(","):
        parts[name](args)


if __name__ == "__main__":
    main()
