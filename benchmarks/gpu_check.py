"""The GPU check (issue 44 item 8): every engine against its naive loop and the device's measured peak, in one run
of under 5 minutes on one GPU, printed as one table.

    python -m benchmarks.gpu_check [--device cuda] [--texts 20000] [--data DIR] [--model random:DIR]

Model: bert-base size with random weights from bert-base-uncased's config and tokenizer (``--model``, default
``random:`` of ``DATA/tokenizers/bert-base-uncased``). ``DATA`` (``--data``, default ``../shared/data``) needs
``sst2/train.tsv``, ``ud_english_ewt/en_ewt-ud-dev.conllu.gz`` and that tokenizer; the device machine has no
``../shared``, so copy them into an ignored folder and carry it (docs/benchmarks.md says how).

Rows: the probe (naive loop; float32 tables; certified; approximate bf16 with its agreement), the atlas's
[CLS] extraction, heads stats on 1,000 UD sentences, tuned-lens training steps, fine-tuning one epoch (the engine
and the HF Trainer), and the model cache (a hit against a load). Each row gives seconds, the ratio to its naive
way, TFLOP/s where its matrix work is counted and the fraction of the device's measured peak in the precision it
ran (:mod:`benchmarks.peak`); the float32 probe also gives the GPU-busy share (kernel time over wall time, from
``torch.profiler``) and host syncs per batch (``cudaStreamSynchronize``/``cudaDeviceSynchronize`` and
``aten::_local_scalar_dense`` calls over batches). It runs on a CPU too (``--device cpu --texts 200``), for the
suite's smoke test; the figures that matter are a GPU's.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import SHARED
from benchmarks.peak import device_name, device_peaks, encoder_flops, head_flops


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn):
    sync(device)
    start = time.perf_counter()
    value = fn()
    sync(device)
    return value, time.perf_counter() - start


class Table:
    def __init__(self, peaks: dict[str, float]):
        self.peaks, self.rows = peaks, []

    def add(self, name: str, seconds: float, naive: float | None = None, flops: float | None = None,
            precision: str = "float32", note: str = "") -> None:
        tflops = flops / seconds / 1e12 if flops else None
        peak = self.peaks.get(precision) or self.peaks["float32"]
        self.rows.append((name, seconds, naive / seconds if naive else None, tflops,
                          tflops / peak if tflops else None, precision, note))
        print(f"  done: {name} {seconds:.2f} s", flush=True)

    def print(self) -> None:
        print(f"\n{'run':<44} {'seconds':>8} {'x naive':>8} {'TFLOP/s':>8} {'of peak':>8}  peak used, notes")
        for name, seconds, ratio, tflops, share, precision, note in self.rows:
            cells = [f"{seconds:8.2f}", f"{ratio:8.2f}" if ratio else f"{'-':>8}",
                     f"{tflops:8.2f}" if tflops else f"{'-':>8}", f"{share:8.1%}" if share else f"{'-':>8}"]
            print(f"{name:<44} {' '.join(cells)}  {precision}; {note}")


def probe_rows(table: Table, args, loaded, inputs) -> None:
    from analysis.probe import reconstruction
    from analysis.probe.reconstruction import ProbeConfig, probe
    from analysis.probe.token_sink import TokenSink
    from benchmarks.bench_probe import naive
    from models.loading import ModelSpec, load_model

    (correct, counted), naive_s = timed(args.device, lambda: naive(loaded, list(inputs.texts)))
    tokens = sum(len(ids) for ids in loaded.tokenizer(list(inputs.texts), truncation=True)["input_ids"])
    work = encoder_flops(loaded, tokens, tokens / len(inputs)) + head_flops(loaded, counted * (loaded.num_layers + 1))
    table.add("probe: naive loop (batch 32, head on all rows)", naive_s, naive_s, work, note=f"{counted:,} tokens")
    out = Path(tempfile.mkdtemp())

    def run(config, model=loaded, name="tokens.parquet"):
        return probe(model, inputs, config, sink=TokenSink(model.tokenizer, config.top_k, out / name),
                     check_agreement=False)

    config = ProbeConfig(batch_size=args.batch_size)
    run(config)  # warm-up
    batches, syncs = [], {"n": 0}
    real = reconstruction.summarise
    reconstruction.summarise = lambda *a, **k: batches.append(1) or real(*a, **k)
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    try:
        with torch.profiler.profile(activities=activities) as prof:
            exact, seconds = timed(args.device, lambda: run(config))
    finally:
        reconstruction.summarise = real
    events = prof.key_averages()
    for e in events:
        if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "aten::_local_scalar_dense"):
            syncs["n"] += e.count
    busy = sum(getattr(e, "self_device_time_total", 0) or 0 for e in events) / 1e6
    same = exact.layers["correct"].tolist() == list(correct)
    table.add("probe: float32 tables (profiled)", seconds, naive_s, work,
              note=f"identical to naive: {same}; GPU busy {busy / seconds:.0%}; host syncs per batch "
                   f"{syncs['n'] / max(1, len(batches)):.1f} ({len(batches)} batches)")
    exact, seconds = timed(args.device, lambda: run(config))
    table.add("probe: float32 tables", seconds, naive_s, work)
    certified, seconds = timed(args.device, lambda: run(config.replace(precision="certified")))
    info = certified.precision
    shares = info.get("certified_share_per_state") or []
    identical = certified.layers[["tokens", "correct"]].equals(exact.layers[["tokens", "correct"]])
    table.add("probe: certified", seconds, naive_s, work, "bfloat16",
              note=f"{info['head_product']}; tables identical: {identical}; certified per layer "
                   f"{', '.join(f'{s:.2f}' for s in shares)}")
    low = load_model(ModelSpec(args.model, device=args.device, dtype="bfloat16"))
    run(config, low, "bf16.parquet")
    approx, seconds = timed(args.device, lambda: run(config, low, "bf16.parquet"))
    agreement = reconstruction.approximate_check(low, inputs, config)["agreement"]
    table.add("probe: approximate bf16", seconds, naive_s, work, "bfloat16",
              note=f"predictions identical to float32 {agreement['predictions_identical']:.2%}")


def atlas_row(table: Table, args, loaded, inputs) -> None:
    from analysis.core.vectors import extract
    from benchmarks.bench_atlas import naive_extract

    texts = list(inputs.texts)
    extract(loaded, inputs, batch_size=args.batch_size)
    _, naive_s = timed(args.device, lambda: naive_extract(loaded, texts))
    _, seconds = timed(args.device, lambda: extract(loaded, inputs, batch_size=args.batch_size))
    tokens = sum(len(ids) for ids in loaded.tokenizer(texts, truncation=True)["input_ids"])
    table.add(f"atlas [CLS] extraction, {len(texts):,} texts", seconds, naive_s,
              encoder_flops(loaded, tokens, tokens / len(texts)))


def heads_row(table: Table, args, data: Path) -> None:
    from analysis.core.treebank import read_conllu
    from analysis.heads.model import load_eager
    from analysis.heads.run import analyse
    from models.spec import ModelSpec

    path = data / "ud_english_ewt" / "en_ewt-ud-dev.conllu.gz"
    if not path.is_file():
        print(f"  skipped heads stats: {path} is missing")
        return
    bank = read_conllu(path, args.sentences)
    loaded = load_eager(ModelSpec(args.model, device=args.device))
    analyse(loaded, bank)
    result, seconds = timed(args.device, lambda: analyse(loaded, bank))
    tokens = result.info["tokens"]
    table.add(f"heads stats, {len(bank.sentences):,} UD sentences", seconds, None,
              encoder_flops(loaded, tokens, tokens / len(bank.sentences)))


def lens_row(table: Table, args, loaded, inputs) -> None:
    from analysis.probe import lens as L
    from analysis.probe import lens_training as LT
    from analysis.probe.options import LensOptions
    from benchmarks.bench_lens import naive_step

    options = LensOptions(model=args.model, batch_size=32, max_length=128)
    batches = LT.Batches(loaded, list(inputs.texts[:4000]), 32, 128, 0)

    def steps(step_fn, n=args.lens_steps):
        lens = L.TunedLens(loaded.num_layers, loaded.anatomy.hidden_size).to(loaded.spec.device)
        for step in range(n):
            batch, counted = batches.batch(batches.rows(step))
            step_fn(loaded, lens, batch, counted, options, step)
            lens.zero_grad(set_to_none=True)

    def ours(loaded, lens, batch, counted, options, step):
        LT.layer_losses(loaded, lens, batch, counted, options, step, backward=True)

    steps(ours, 2)
    _, naive_s = timed(args.device, lambda: steps(naive_step))
    _, seconds = timed(args.device, lambda: steps(ours))
    table.add(f"tuned-lens training, {args.lens_steps} steps of 32 texts", seconds, naive_s)


def finetune_row(table: Table, args, inputs) -> None:
    from analysis.training.taskdata import label_ids
    from benchmarks.bench_finetune import engine_seconds, trainer_seconds
    from models.loading import ModelSpec

    spec = ModelSpec(args.model, device=args.device).resolved()
    labels = label_ids(inputs.labels)
    settings = argparse.Namespace(batch_size=16, max_length=128)
    naive_s = trainer_seconds(spec, inputs, labels, settings, spec.device)
    seconds = engine_seconds(spec, inputs, labels, settings, spec.device)
    table.add(f"fine-tuning, 1 epoch of {len(inputs):,} texts", seconds, naive_s, note="naive: HF Trainer")


def cache_row(table: Table, args) -> None:
    from models.cache import ModelCache
    from models.loading import ModelSpec, load_model

    spec = ModelSpec(args.model, device=args.device)
    _, load_s = timed(args.device, lambda: load_model(spec))
    cache = ModelCache()
    cache.get(spec)
    _, hit_s = timed(args.device, lambda: cache.get(spec))
    table.add("model cache: a hit", hit_s, load_s, note="naive: loading again")
    cache.clear()


def main() -> None:
    from analysis.core.inputs import read_file
    from models.loading import ModelSpec, load_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--data", type=Path, default=SHARED)
    p.add_argument("--model", default=None)
    p.add_argument("--texts", type=int, default=20_000)
    p.add_argument("--finetune-texts", type=int, default=2_000)
    p.add_argument("--sentences", type=int, default=1_000)
    p.add_argument("--lens-steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--only", nargs="*", default=None, help="rows to run: probe atlas heads lens finetune cache")
    args = p.parse_args()
    args.model = args.model or f"random:{args.data / 'tokenizers' / 'bert-base-uncased'}"
    peaks = device_peaks(args.device)
    print(f"{device_name(args.device)}; torch {torch.__version__}; model {args.model}; measured peaks "
          + ", ".join(f"{k} {v:.1f} TFLOP/s" for k, v in peaks.items()), flush=True)
    table = Table(peaks)
    loaded = load_model(ModelSpec(args.model, device=args.device))
    inputs = read_file(args.data / "sst2" / "train.tsv", limit=args.texts, label_column="label")
    only = set(args.only or ["probe", "atlas", "heads", "lens", "finetune", "cache"])
    steps = [("probe", lambda: probe_rows(table, args, loaded, inputs)),
             ("atlas", lambda: atlas_row(table, args, loaded, inputs)),
             ("heads", lambda: heads_row(table, args, args.data)),
             ("lens", lambda: lens_row(table, args, loaded, inputs)),
             ("finetune", lambda: finetune_row(table, args, read_file(
                 args.data / "sst2" / "train.tsv", limit=args.finetune_texts, label_column="label"))),
             ("cache", lambda: cache_row(table, args))]
    start = time.perf_counter()
    for name, step in steps:
        if name in only:
            with contextlib.suppress(KeyboardInterrupt):
                step()
    table.print()
    print(f"\ntotal {time.perf_counter() - start:.0f} s; {np.datetime64('today')}")


if __name__ == "__main__":
    main()
