"""Fine-tuning throughput: this engine against the Hugging Face ``Trainer``, in one run.

    python -m benchmarks.bench_finetune [--model demo] [--texts 2000] [--batch-size 16] [--max-length 128]

Both fine-tune the same model with a [CLS] classifier on the same SST-2 train texts for one epoch: same batch
size, maximum length, precision (fp32 on CPU, bf16 autocast on a GPU that has it) and dynamic padding
(``DataCollatorWithPadding`` for the Trainer). Neither evaluates during training. Prints samples/s and the
ratio, then times the demo fine-tune of the issue (demo model, 1,000 examples, 1 epoch, ``cls`` head) end to
end through the CLI code path, evaluation and checkpoint included.
"""

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from analysis.core.inputs import read_file, read_split
from analysis.training.finetune import Splits, run_finetune
from analysis.training.taskdata import label_ids, prepare
from analysis.training.train import Classifier, FinetuneConfig, train
from models.loading import ModelSpec, load_encoder

DATA = Path(os.environ.get("LAYERLENS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def fresh_accelerate() -> None:
    """Forget accelerate's process-wide state between runs: the Trainer initialises it with its own mixed
    precision, and the engine's Accelerator then refused another ("AcceleratorState has already been initialized",
    issue 44: the benchmark crashed on CUDA)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def trainer_seconds(spec: ModelSpec, inputs, labels, args, device: str, group_by_length: bool = False) -> float:
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    fresh_accelerate()
    source = spec.source
    tok = AutoTokenizer.from_pretrained(source)
    if spec.random_init:  # random:NAME: NAME's architecture with seeded random weights, as the engine reads it
        from transformers import AutoConfig

        from models.loading import random_model

        config = AutoConfig.from_pretrained(source, num_labels=len(labels))
        model = random_model(AutoModelForSequenceClassification, config, torch.float32)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=len(labels))
    enc = tok(list(inputs.texts), truncation=True, max_length=args.max_length)
    rows = [{"input_ids": ids, "attention_mask": m, "labels": labels[y]}
            for ids, m, y in zip(enc["input_ids"], enc["attention_mask"], inputs.labels, strict=True)]
    bf16 = device.startswith("cuda") and torch.cuda.is_bf16_supported()
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(out, per_device_train_batch_size=args.batch_size, num_train_epochs=1,
                                  learning_rate=2e-5, warmup_steps=0.1, weight_decay=0.01, save_strategy="no",
                                  eval_strategy="no", logging_strategy="no", report_to=[], bf16=bf16,
                                  use_cpu=device == "cpu", dataloader_num_workers=0, seed=0, disable_tqdm=True,
                                  train_sampling_strategy="group_by_length" if group_by_length else "random")
        trainer = Trainer(model=model, args=targs, train_dataset=rows, data_collator=DataCollatorWithPadding(tok))
        start = time.perf_counter()
        trainer.train()
        return time.perf_counter() - start


def engine_seconds(spec: ModelSpec, inputs, labels, args, device: str) -> float:
    fresh_accelerate()
    encoder, tok = load_encoder(spec)  # the spec itself: random:NAME keeps its random weights
    data = prepare(tok, inputs, labels, args.max_length, "head")
    tiny_val = data.subset(range(8))
    model = Classifier(encoder, "cls", len(labels)).to(device)
    config = FinetuneConfig(epochs=1, batch_size=args.batch_size, max_length=args.max_length, save_vectors=False)
    start = time.perf_counter()
    train(model, data, tiny_val, config, tok.pad_token_id, device)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="demo")
    p.add_argument("--device", default="auto")
    p.add_argument("--texts", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="alternate the two this many times; report medians")
    args = p.parse_args()
    spec = ModelSpec(args.model, device=args.device).resolved()
    inputs = read_file(DATA / "sst2" / "train.tsv", limit=args.texts, label_column="label")
    labels = label_ids(inputs.labels)
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, device "
          f"{spec.device}; model {args.model}; {len(inputs)} SST-2 train texts, batch {args.batch_size}, "
          f"max length {args.max_length}, 1 epoch")
    runs = {"engine": [], "trainer": [], "trainer group_by_length": []}
    for _ in range(args.repeats):  # alternate, so drifts in machine speed hit all three
        runs["engine"].append(engine_seconds(spec, inputs, labels, args, spec.device))
        runs["trainer"].append(trainer_seconds(spec, inputs, labels, args, spec.device))
        runs["trainer group_by_length"].append(trainer_seconds(spec, inputs, labels, args, spec.device, True))
    median = {k: float(np.median(v)) for k, v in runs.items()}
    print("runs (s): " + "; ".join(f"{k} {', '.join(f'{t:.2f}' for t in v)}" for k, v in runs.items()))
    n = len(inputs)
    for name in ("trainer", "trainer group_by_length"):
        print(f"medians: HF {name} {median[name]:.2f} s ({n / median[name]:,.1f} samples/s) | engine "
              f"{median['engine']:.2f} s ({n / median['engine']:,.1f} samples/s) | ratio "
              f"{median[name] / median['engine']:.2f}x")

    with tempfile.TemporaryDirectory() as out:
        demo = read_split(str(DATA / "sst2" / "train.tsv"))
        splits = Splits(demo.subset(range(1000)), read_split(str(DATA / "sst2" / "dev.tsv")))
        start = time.perf_counter()
        metrics = run_finetune(ModelSpec("demo", device=args.device), splits, FinetuneConfig(epochs=1), Path(out))
        print(f"demo fine-tune (1,000 SST-2 examples, 1 epoch, cls head, eval on 872 + checkpoint): "
              f"{time.perf_counter() - start:.1f} s, dev accuracy {metrics['accuracy']:.3f}")


if __name__ == "__main__":
    main()
