"""The reconstruction probe vs the naive loop a user would write, in one run, on SST-2 dev.

    python -m benchmarks.bench_probe [--model demo] [--device auto] [--memory]

Naive: padded batches of 32 in file order, float32, ``output_hidden_states=True`` on the full model, the MLM
head applied to every position of every layer, argmax. Both must give identical per-layer accuracies.
``--memory`` also measures the engine's peak resident memory for 2k and 20k texts (SST-2 train), each in its
own process, with per-token rows streamed to Parquet.
"""

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from analysis.core.activations import max_input_length
from analysis.core.inputs import read_file
from analysis.probe.reconstruction import ProbeConfig, probe
from analysis.probe.token_sink import TokenSink
from models.loading import ModelSpec, load_model

DATA = Path(os.environ.get("LAYERLENS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")) / "sst2"


@torch.inference_mode()
def naive(loaded, texts, batch_size=32):
    """Per-layer (correct, counted) the straightforward way."""
    model, tok, head = loaded.model, loaded.tokenizer, loaded.anatomy.head
    max_length = max_input_length(loaded)
    special = torch.tensor(tok.all_special_ids, device=loaded.spec.device)
    correct = counted = None
    for start in range(0, len(texts), batch_size):
        enc = tok(list(texts[start:start + batch_size]), padding=True, truncation=True, max_length=max_length,
                  return_tensors="pt")
        enc = {k: v.to(loaded.spec.device) for k, v in enc.items()}
        states = model(**enc, output_hidden_states=True).hidden_states
        keep = enc["attention_mask"].bool() & ~torch.isin(enc["input_ids"], special)
        hits = torch.stack([((head(h).argmax(-1) == enc["input_ids"]) & keep).sum() for h in states])
        correct = hits if correct is None else correct + hits
        counted = keep.sum() if counted is None else counted + keep.sum()
    return correct.tolist(), int(counted)


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_rss_mb(n_texts: int, model: str, device: str) -> float:
    """Peak resident memory (MB) of a fresh process probing the first ``n_texts`` of SST-2 train."""
    code = (
        "import resource, sys, tempfile, pathlib\n"
        "from analysis.core.inputs import read_file\nfrom analysis.probe.reconstruction import probe\n"
        "from analysis.probe.token_sink import TokenSink\nfrom models.loading import ModelSpec, load_model\n"
        f"loaded = load_model(ModelSpec({model!r}, device={device!r}))\n"
        f"inputs = read_file({str(DATA / 'train.tsv')!r}, limit={n_texts})\n"
        "d = pathlib.Path(tempfile.mkdtemp())\n"
        "probe(loaded, inputs, sink=TokenSink(loaded.tokenizer, 5, d / 't.parquet'))\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    return float(out.stdout.strip().splitlines()[-1])


NAIVE_SCRIPT = """
import sys, torch
from transformers import AutoModelForMaskedLM, AutoTokenizer
from benchmarks.bench_probe import naive
from models.loading import ModelSpec, load_model
import csv
texts = [r[0] for r in list(csv.reader(open(sys.argv[1]), delimiter="\\t", quoting=csv.QUOTE_NONE))[1:]]
{body}
"""


def whole_processes(model: str, runs: int) -> None:
    """Whole processes, as a user times them: ``python -m analysis probe`` against a script with the naive loop,
    and a process that only starts (imports torch and transformers, loads the model), alternating, medians.
    The start-up is paid by both; the difference is the engines'."""
    import statistics

    data = str(DATA / "dev.tsv")
    naive_body = "print(naive(load_model(ModelSpec(sys.argv[2])), texts))"
    start_body = "load_model(ModelSpec(sys.argv[2]))"
    times: dict[str, list[float]] = {"ours": [], "naive": [], "start-up": []}
    with tempfile.TemporaryDirectory() as d:
        commands = {
            "ours": [sys.executable, "-m", "analysis", "probe", "--model", model, "--input", data, "--out", d],
            "naive": [sys.executable, "-c", NAIVE_SCRIPT.format(body=naive_body), data, model],
            "start-up": [sys.executable, "-c", NAIVE_SCRIPT.format(body=start_body), data, model]}
        for _ in range(runs):
            for name, argv in commands.items():
                start = time.perf_counter()
                subprocess.run(argv, check=True, capture_output=True, cwd=Path(__file__).resolve().parents[1])
                times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"whole processes (median of {runs}): ours {med['ours']:.2f} s, naive {med['naive']:.2f} s: "
          f"{med['naive'] / med['ours']:.2f}x; start-up alone (imports + model load) {med['start-up']:.2f} s; "
          f"without it: {(med['naive'] - med['start-up']) / (med['ours'] - med['start-up']):.2f}x")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="demo")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", help="the engine's dtype (the naive loop is always float32)")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--processes", type=int, default=0, metavar="N",
                   help="also time N whole processes of each (our CLI, the naive loop, start-up alone), alternating")
    args = p.parse_args()
    spec = ModelSpec(args.model, device=args.device)
    loaded = load_model(spec)
    fast = load_model(ModelSpec(args.model, device=args.device, dtype=args.dtype)) if args.dtype != "float32" \
        else loaded
    inputs = read_file(DATA / "dev.tsv")
    device = loaded.spec.device
    naive(loaded, inputs.texts[:64])  # warm-up
    probe(fast, read_file(DATA / "dev.tsv", limit=64))

    sync(device)
    t0 = time.perf_counter()
    ref_correct, ref_counted = naive(loaded, inputs.texts)
    sync(device)
    t_naive = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as d:
        sync(device)
        t0 = time.perf_counter()
        result = probe(fast, inputs, ProbeConfig(batch_size=64 if device == "cpu" else 256),
                       sink=TokenSink(fast.tokenizer, 5, Path(d) / "tokens.parquet"))
        sync(device)
        t_engine = time.perf_counter() - t0

    same = result.layers["correct"].tolist() == ref_correct and int(result.layers["tokens"].iloc[0]) == ref_counted
    tokens = ref_counted * len(ref_correct)
    print(f"machine: {platform.machine()} {platform.processor()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name()})" if device.startswith("cuda") else ""))
    print(f"model {args.model}: {loaded.num_layers} layers, vocab {loaded.anatomy.vocab_size}; "
          f"SST-2 dev: {len(inputs)} texts, {ref_counted} counted tokens x {len(ref_correct)} layers")
    print(f"naive loop (fp32, batch 32, file order): {t_naive:8.2f} s")
    print(f"engine ({args.dtype}):{' ' * (26 - len(args.dtype))}{t_engine:8.2f} s  "
          f"({tokens / t_engine:,.0f} token-layers/s, {ref_counted / t_engine:,.0f} tokens/s)")
    print(f"identical per-layer accuracies: {same}" + ("" if args.dtype == "float32" else
          f" (engine in {args.dtype}: largest accuracy difference "
          f"{max(abs(a - b) for a, b in zip(result.layers['correct'], ref_correct, strict=True)) / ref_counted:.4f})"))
    print(f"ratio: {t_naive / t_engine:.2f}x")
    from benchmarks.peak import device_peaks, encoder_flops, head_flops

    peaks = device_peaks(device)
    n_tokens = sum(len(ids) for ids in loaded.tokenizer(list(inputs.texts), truncation=True)["input_ids"])
    work = encoder_flops(loaded, n_tokens, n_tokens / len(inputs)) + head_flops(loaded, tokens)
    print(f"matrix work {work / 1e12:.2f} TFLOP: engine {work / t_engine / 1e12:.3f} TFLOP/s = "
          f"{work / t_engine / 1e12 / peaks['float32']:.0%} of the float32 peak measured now "
          f"({peaks['float32']:.2f} TFLOP/s on {device}); naive {work / t_naive / 1e12 / peaks['float32']:.0%} "
          "(the naive loop's head runs on every position, padding included: more work than counted here)")
    if args.processes:
        whole_processes(args.model, args.processes)
    if args.memory:
        small, large = peak_rss_mb(2000, args.model, device), peak_rss_mb(20000, args.model, device)
        print(f"peak RSS: 2k texts {small:.0f} MB, 20k texts {large:.0f} MB, ratio {large / small:.2f}")


if __name__ == "__main__":
    main()
