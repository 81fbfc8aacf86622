"""Tuned-lens training throughput: LayerLens' step (the encoder once without a graph, then each layer's
translator, head and KL back-propagated one layer at a time, analysis.probe.lens.layer_losses) against the plain PyTorch
loop that sums every layer's loss and back-propagates once, same batches, one run. Memory: the most bytes of
activations the autograd graph holds at once (saved-tensor hooks; on a GPU also torch.cuda.max_memory_allocated).

    python -m benchmarks.bench_lens [--model demo] [--steps 30] [--batch-size 32]
"""

import argparse
import gzip
import os
import time

import torch

from analysis.core.activations import hidden_states
from analysis.probe import lens as L
from analysis.probe import lens_training as LT
from analysis.probe.options import LensOptions
from benchmarks import data_file
from models.loading import ModelSpec, load_model


def texts(n: int) -> list[str]:
    source = data_file("english_corpus/valid.txt.gz", "english_valid_400.txt.gz")
    lines = [line.strip() for line in gzip.open(source, "rt") if len(line.split()) > 5]
    return (lines * (n // len(lines) + 1))[:n]


class Saved:
    """Bytes of activations autograd holds; a backward frees them."""

    def __init__(self):
        self.live = self.peak = 0

    def pack(self, t):
        self.live += t.numel() * t.element_size()
        self.peak = max(self.peak, self.live)
        return t

    def freed(self):
        self.live = 0


def naive_step(loaded, lens, batch, counted, options, step) -> int:
    """Every layer's KL summed, one backward through all of them."""
    gen = torch.Generator().manual_seed(options.seed * 1_000_003 + step)
    masked, selected = LT.mask_like_pretraining(batch.input_ids.cpu(), counted, options.mask_fraction,
                                               loaded.tokenizer.mask_token_id, loaded.anatomy.vocab_size, gen)
    where = selected.to(batch.input_ids.device)
    with torch.no_grad():
        states = hidden_states(loaded, batch, masked.to(batch.input_ids.device))
        final = torch.log_softmax(loaded.anatomy.head(states[-1][where]).float(), -1)
    loss = sum(LT.kl_to_final(final, loaded.anatomy.head(lens(states[i][where], i))).mean()
               for i in range(loaded.num_layers))
    loss.backward()
    return int(where.sum())


def run(name, step_fn, loaded, batches, options, steps):
    lens = L.TunedLens(loaded.num_layers, loaded.anatomy.hidden_size).to(loaded.spec.device)
    saved = Saved()
    original = torch.Tensor.backward

    def backward(self, *a, **k):
        original(self, *a, **k)
        saved.freed()

    torch.Tensor.backward = backward
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    tokens, start = 0, time.perf_counter()
    try:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            for step in range(steps):
                batch, counted = batches.batch(batches.rows(step))
                step_fn(loaded, lens, batch, counted, options, step)
                tokens += int(batch.attention_mask.sum())
                lens.zero_grad(set_to_none=True)
    finally:
        torch.Tensor.backward = original
    seconds = time.perf_counter() - start
    gpu = f", GPU peak {torch.cuda.max_memory_allocated() / 2**20:.0f} MB" if torch.cuda.is_available() else ""
    print(f"  {name:<34} {tokens / seconds:>9,.0f} tokens/s  autograd peak {saved.peak / 2**20:>8.1f} MB{gpu}")
    return tokens / seconds, saved.peak


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="demo")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    args = p.parse_args()
    loaded = load_model(ModelSpec(args.model))
    options = LensOptions(model=args.model, batch_size=args.batch_size, max_length=args.max_length)
    batches = LT.Batches(loaded, texts(4000), args.batch_size, args.max_length, 0)
    print(f"{args.model} ({loaded.num_layers} layers, vocab {loaded.anatomy.vocab_size}) on {loaded.spec.device}, "
          f"batch {args.batch_size} texts, {args.steps} steps, {os.cpu_count()} cores")

    def ours(loaded, lens, batch, counted, options, step):
        LT.layer_losses(loaded, lens, batch, counted, options, step, backward=True)

    run("warm-up", ours, loaded, batches, options, 2)
    fast, low = run("LayerLens (one layer at a time)", ours, loaded, batches, options, args.steps)
    slow, high = run("naive (all layers, one backward)", naive_step, loaded, batches, options, args.steps)
    print(f"  throughput ratio {fast / slow:.2f}x, autograd memory ratio {high / low:.1f}x lower")


if __name__ == "__main__":
    main()
