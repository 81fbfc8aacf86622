"""Run interpreto's LogitLens on a local ``*ForSequenceClassification`` checkpoint.

Usage (with a virtualenv that has ``interpreto`` installed, *not* the LayerLens one)::

    python benchmarks/interpreto_lens.py MODEL_DIR TEXTS_FILE OUT_JSON

MODEL_DIR is a local ``save_pretrained`` folder (model + tokenizer); TEXTS_FILE holds one text per line.

What interpreto (0.5.x) computes for a sequence classifier
---------------------------------------------------------
``interpreto.AllLayersSplitter`` finds the ``ModuleList`` of transformer blocks (``bert.encoder.layer`` etc.) and,
in one nnsight trace, caches the *input* of block 0 (= the embedding output, after the embedding LayerNorm, i.e.
``hidden_states[0]``) plus the output of every block (``hidden_states[1..L]``), so L+1 states over all tokens.
``LogitLens`` stacks them and calls ``splitter.apply_head``: it re-runs the whole model on dummy zero
``inputs_embeds`` while *skipping* every block and substituting the state as each block's output, so everything the
model's own ``forward`` does after the encoder is applied unchanged: for BERT ``pooler`` (dense+tanh on token 0)
then ``classifier``; for RoBERTa the head's dense+tanh+out_proj on ``<s>``; for DistilBERT ``pre_classifier``+ReLU
on token 0. No extra final norm is inserted. Scores are ``softmax(logits)`` over classes (computed as
``exp(logit - logsumexp)``), returned as top-k per layer; with ``top_k = num_labels`` we recover the full
distribution. One text at a time, no attention mask on the head pass, no truncation by the tokenizer.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import torch
from interpreto import AllLayersSplitter, LogitLens
from transformers import AutoModelForSequenceClassification, AutoTokenizer

WHAT = (
    "interpreto LogitLens on a sequence classifier: for each residual state l in 0..L (l=0 is the input to the "
    "first transformer block = embedding output after its LayerNorm = HF hidden_states[0]; l>=1 is the output of "
    "block l = hidden_states[l]) the full token sequence is fed back through the model's own post-encoder forward "
    "(all blocks skipped and replaced by the state), i.e. for BERT softmax(classifier(pooler(h_l))) with "
    "pooler = dense+tanh on h_l[:, 0], "
    "RoBERTa softmax(classifier head dense+tanh+out_proj on <s>), DistilBERT softmax(classifier(relu("
    "pre_classifier(h_l[:,0])))). Probabilities are softmax over classes; eval mode; one text at a time."
)


def lens_probs(lens: LogitLens, text: str, num_labels: int) -> list[list[float]]:
    """Full class distribution per layer for one text, rebuilt from interpreto's top-k output."""
    results = lens.explain(text)
    rows = []
    for name in lens.splitter.activation_names:
        out = results[name]
        probs = torch.zeros(num_labels, dtype=torch.float64)
        probs[out["top_indices"][0].long()] = out["top_scores"][0].double()
        rows.append(probs.tolist())
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    model_dir, texts_file, out_json = argv[1:]
    with open(texts_file, encoding="utf-8") as fh:
        texts = [line.rstrip("\n") for line in fh if line.strip()]

    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    splitter = AllLayersSplitter(model, tokenizer=tokenizer, automodel=AutoModelForSequenceClassification)
    num_labels = model.config.num_labels
    lens = LogitLens(splitter, top_k=num_labels)

    probs = [lens_probs(lens, text, num_labels) for text in texts]
    out = {
        "interpreto_version": version("interpreto"),
        "what": WHAT,
        "layers": list(range(len(splitter.activation_names))),
        "activation_names": splitter.activation_names,
        "probs": probs,
    }
    with open(out_json, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)
    print(f"wrote {out_json}: {len(texts)} texts x {len(out['layers'])} layers x {num_labels} classes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
