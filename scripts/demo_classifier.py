"""A real classifier checkpoint for screenshots and trying the 'any checkpoint' paths offline: the demo model's
encoder as a ``BertForSequenceClassification``, trained a few epochs on the bundled demo sentiment set with
plain transformers, saved as ``save_pretrained`` (as a classifier from the hub would be). Every third row is
held out of training and written to ``held_out.csv`` beside it, to look at the classifier on rows it never saw.

    python scripts/demo_classifier.py --out /tmp/demo-classifier [--epochs 4]
"""

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from analysis.core.inputs import DEMO_LABELLED, read_file  # noqa: E402
from models.loading import DEMO_DIR  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=4)
    args = p.parse_args()
    every = read_file(DEMO_LABELLED, "text", label_column="label")
    data = every.subset([i for i in range(len(every)) if i % 3])
    held = every.subset([i for i in range(len(every)) if i % 3 == 0])
    names = sorted(set(data.labels))
    model = AutoModelForSequenceClassification.from_pretrained(
        DEMO_DIR, num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch.manual_seed(0)
    labels = torch.tensor([names.index(y) for y in data.labels])
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(data))
        for start in range(0, len(data), 16):
            idx = order[start:start + 16].tolist()
            batch = tokenizer([data.texts[i] for i in idx], padding=True, return_tensors="pt")
            loss = model(**batch, labels=labels[idx]).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(f"epoch {epoch + 1}: last batch loss {loss.item():.3f}", file=sys.stderr)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    import pandas as pd

    pd.DataFrame({"text": held.texts, "label": held.labels}).to_csv(args.out / "held_out.csv", index=False)
    print(args.out)


if __name__ == "__main__":
    main()
