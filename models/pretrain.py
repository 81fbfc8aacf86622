"""Train the bundled demo masked LM: a WordPiece tokenizer and a small BERT, from plain text.

    python -m models.pretrain --corpus ../shared/data/english_corpus/train.txt.gz --out models/demo

Corpus format: one sentence or paragraph per line, an empty line between documents (``.gz`` is read
transparently). Training follows BERT's MLM recipe (15% of tokens selected; 80% -> [MASK], 10% -> a random
token, 10% unchanged) with two CPU-friendly choices: whole lines are packed into chunks of up to ``seq_len``
WordPieces, and the MLM decoder runs only at the selected positions.

Reproducibility: for a given tokenizer, seed and thread count, training is bit-for-bit deterministic. The
WordPiece trainer of the ``tokenizers`` library breaks ties between equally frequent candidates in hash-map
order, so two tokenizer trainings can differ in a few rare subwords; ``--tokenizer DIR`` reuses a saved
tokenizer (``--tokenizer models/demo`` reproduces the committed demo model).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import platform
import random
import sys
import time
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tqdm.auto import tqdm
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast, DataCollatorForLanguageModeling

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


class PretrainConfig(BaseModel):
    """Model size and optimisation settings. ``small`` is the demo model; ``tiny`` exists for tests. A pydantic
    schema like the techniques' options (it sits under ``analysis/``, so it takes pydantic's base directly)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    vocab_size: int = Field(6000, ge=len(SPECIAL_TOKENS) + 1)
    hidden_size: int = Field(256, ge=1)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(1024, ge=1)
    seq_len: int = Field(64, ge=4)
    batch_size: int = Field(32, ge=1)
    steps: int = Field(4000, ge=1)
    lr: float = Field(1e-3, gt=0)
    warmup_fraction: float = Field(0.06, ge=0, le=1)
    weight_decay: float = Field(0.01, ge=0)
    short_seq_prob: float = Field(0.1, ge=0, le=1)  # as in BERT: some chunks are shorter, so [SEP] and padding appear
    # No dropout: in short runs it keeps the model at the unigram plateau far longer (measured: a 4-layer BERT
    # on a copy-the-neighbour task escaped after ~220 steps without dropout, not within 300 with 0.1).
    dropout: float = Field(0.0, ge=0, lt=1)
    seed: int = Field(0, ge=0, le=2**32 - 1)



PRESETS = {
    "small": PretrainConfig(),
    "tiny": PretrainConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                           seq_len=32, batch_size=8, steps=20),
}


def read_documents(path: Path) -> list[list[str]]:
    """Documents (lists of non-empty lines) from a text file; an empty line ends a document."""
    opener = gzip.open if str(path).endswith(".gz") else open
    docs, current = [], []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                current.append(line)
            elif current:
                docs.append(current)
                current = []
    if current:
        docs.append(current)
    return docs


def train_tokenizer(lines: list[str], vocab_size: int, max_length: int = 512) -> BertTokenizerFast:
    """An uncased BERT-style WordPiece tokenizer trained on ``lines``."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2)
    tok.train_from_iterator(lines, trainer=trainer)
    # The trainer numbers tokens in hash-map order, which changes from run to run: renumber them in a fixed
    # order (special tokens first, then sorted) so that a seed reproduces the same model.
    learned = [t for t in tok.get_vocab() if t not in SPECIAL_TOKENS]
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + sorted(learned))}
    tok.model = models.WordPiece(vocab, unk_token="[UNK]")
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return BertTokenizerFast(tokenizer_object=tok, do_lower_case=True, model_max_length=max_length)


def pack(docs: list[list[str]], tokenizer, seq_len: int, short_seq_prob: float, rng: random.Random) -> list[list[int]]:
    """Whole lines packed into ``[CLS] ... [SEP]`` chunks of at most ``seq_len`` ids, documents never mixed.

    A line longer than a chunk is split. With probability ``short_seq_prob`` a chunk aims for a random
    shorter length, so that the model also sees short inputs like the sentences it will be probed with.
    """
    budget = seq_len - 2
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    chunks = []
    for doc in docs:
        ids_per_line = tokenizer(doc, add_special_tokens=False, verbose=False)["input_ids"]
        current: list[int] = []
        target = budget
        for ids in ids_per_line:
            while ids:
                if current and len(current) + len(ids) > target:
                    chunks.append([cls, *current, sep])
                    current = []
                    target = rng.randint(4, budget) if rng.random() < short_seq_prob else budget
                room = budget - len(current)
                current.extend(ids[:room])
                ids = ids[room:]
        if current:
            chunks.append([cls, *current, sep])
    return chunks


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_model(cfg: PretrainConfig, tokenizer) -> BertForMaskedLM:
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.seq_len, pad_token_id=tokenizer.pad_token_id, type_vocab_size=2,
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout,
    )
    return BertForMaskedLM(config)


def masked_lm_loss(model: BertForMaskedLM, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cross-entropy at the selected positions only; the decoder never sees the other positions.

    Returns (loss, logits at selected positions (n, vocab), their labels (n,)).
    """
    hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    selected = batch["labels"] != -100
    logits = model.cls(hidden[selected])
    labels = batch["labels"][selected]
    return torch.nn.functional.cross_entropy(logits, labels), logits, labels


@torch.no_grad()
def evaluate(model, tokenizer, chunks: list[list[int]], batch_size: int = 64, seed: int = 1234) -> dict:
    """Held-out quality: masked-token top-1 accuracy (15% of tokens, all replaced by [MASK]) and the share of
    unmasked, non-special input tokens that the last layer + MLM head reconstruct."""
    model.eval()
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, mask_replace_prob=1.0,
                                               random_replace_prob=0.0, seed=seed)
    hit = n = rec_hit = rec_n = 0
    for i in range(0, len(chunks), batch_size):
        rows = chunks[i:i + batch_size]
        batch = collator([{"input_ids": r} for r in rows])
        _, logits, labels = masked_lm_loss(model, batch)
        hit += (logits.argmax(-1) == labels).sum().item()
        n += labels.numel()
        plain = tokenizer.pad({"input_ids": rows}, return_tensors="pt")
        logits = model(**plain).logits
        special = torch.isin(plain["input_ids"], torch.tensor(tokenizer.all_special_ids))
        keep = plain["attention_mask"].bool() & ~special
        rec_hit += (logits.argmax(-1) == plain["input_ids"])[keep].sum().item()
        rec_n += keep.sum().item()
    return {"masked_top1": hit / max(n, 1), "masked_tokens": n,
            "reconstruction_top1": rec_hit / max(rec_n, 1), "reconstruction_tokens": rec_n}


def lr_lambda(cfg: PretrainConfig):
    warmup = max(1, int(cfg.steps * cfg.warmup_fraction))
    return lambda step: min((step + 1) / warmup, max(0.0, (cfg.steps - step) / max(1, cfg.steps - warmup)))


def train(cfg: PretrainConfig, corpus: Path, out: Path, valid: Path | None = None, progress: bool = True,
          tokenizer_dir: Path | None = None, eval_every: int = 0, init_from: Path | None = None) -> dict:
    """Train (or reuse, from ``tokenizer_dir``) a tokenizer, train the model, save both to ``out`` (a
    ``save_pretrained`` directory) and return what was measured. With ``eval_every`` and ``valid``, every
    that many steps the model is measured on 200 held-out chunks and saved to ``out`` (a usable checkpoint).
    ``init_from`` continues training a saved model (its tokenizer is reused; the optimiser starts afresh)."""
    if init_from is not None:
        tokenizer_dir = init_from
    start = time.time()
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    docs = read_documents(corpus)
    rng.shuffle(docs)
    if tokenizer_dir is not None:
        tokenizer = BertTokenizerFast.from_pretrained(tokenizer_dir)
    else:
        tokenizer = train_tokenizer([line for doc in docs for line in doc], cfg.vocab_size, cfg.seq_len)
    chunks = pack(docs, tokenizer, cfg.seq_len, cfg.short_seq_prob, rng)
    n_tokens = sum(len(c) for c in chunks)
    log.info("corpus: %d documents, %d chunks, %d tokens", len(docs), len(chunks), n_tokens)

    model = BertForMaskedLM.from_pretrained(init_from) if init_from is not None else build_model(cfg, tokenizer)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=cfg.seed)

    valid_chunks = pack(read_documents(valid), tokenizer, cfg.seq_len, 0.0, random.Random(0)) if valid else None
    model.train()
    order: list[int] = []
    bar = tqdm(range(cfg.steps), desc="pre-training", disable=not progress)
    for step in bar:
        if len(order) < cfg.batch_size:
            fresh = list(range(len(chunks)))
            rng.shuffle(fresh)
            order.extend(fresh)
        batch = collator([{"input_ids": chunks[j]} for j in order[:cfg.batch_size]])
        del order[:cfg.batch_size]
        loss, _, _ = masked_lm_loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if eval_every and valid_chunks and (step + 1) % eval_every == 0 and step + 1 < cfg.steps:
            quick = evaluate(model, tokenizer, valid_chunks[:200])
            log.info("step %d: held-out masked top-1 %.3f, reconstruction %.3f", step + 1, quick["masked_top1"],
                     quick["reconstruction_top1"])
            out.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)
            model.train()
    train_seconds = time.time() - start

    metrics = {"train_loss_last": loss.item(), "train_tokens_seen": cfg.steps * cfg.batch_size * n_tokens / len(chunks),
               "train_seconds": round(train_seconds, 1), "corpus_tokens": n_tokens}
    if valid_chunks is not None:
        metrics.update(evaluate(model, tokenizer, valid_chunks))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    info = {"config": cfg.model_dump(), "metrics": metrics, "corpus": corpus.name,
            "tokenizer": "reused" if tokenizer_dir is not None else "trained",
            "init_from": _previous_training(init_from),
            "valid": valid.name if valid else None, "torch": torch.__version__,
            "hardware": f"{cpu_name()}, {torch.get_num_threads()} threads"}
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    write_model_card(out, info)
    log.info("metrics: %s", metrics)
    return info


def _previous_training(init_from: Path | None) -> dict | None:
    """The training_info of the model a run continued from (so the history stays in the card)."""
    if init_from is None:
        return None
    path = init_from / "training_info.json"
    return json.loads(path.read_text()) if path.is_file() else {"path": str(init_from)}


def _first_steps(info: dict) -> str:
    prev = info.get("init_from")
    return f"--steps {prev['config']['steps']} " if prev and "config" in prev else ""


def _continue_command(info: dict) -> str:
    """The second command when this model continued an earlier run (``--init-from``)."""
    if not info.get("init_from"):
        return ""
    c = info["config"]
    return (f"OMP_NUM_THREADS=1 python -m models.pretrain --corpus ../shared/data/english_corpus/train.txt.gz \\\n"
            f"    --valid ../shared/data/english_corpus/valid.txt.gz --init-from /tmp/demo --steps {c['steps']} "
            f"--eval-every 1000 --out /tmp/demo2\n")


def _bar(m: dict) -> str:
    misses = [name for name, value, bar in [("masked top-1", m["masked_top1"], 0.20),
                                             ("reconstruction", m["reconstruction_top1"], 0.95)] if value < bar]
    return "met" if not misses else f"**not met** ({' and '.join(misses)} below it; more training is needed)"


def _continued(info: dict) -> str:
    prev = info.get("init_from")
    if not prev or "config" not in prev:
        return ""
    c, m = prev["config"], prev["metrics"]
    return (f"- These steps continued an earlier run of {c['steps']:,} steps (lr {c['lr']}, "
            f"{m['train_seconds'] / 60:.0f} minutes), with a fresh optimiser and warm-up; "
            "`training_info.json` holds both runs.\n")


def lens_section(out: Path) -> str:
    """The model card's section on the tuned lens shipped in ``out/lens`` (``python -m analysis lens train``),
    from its ``training.json``; empty without one."""
    path = out / "lens" / "training.json"
    if not path.is_file():
        return ""
    t = json.loads(path.read_text())
    o, held = t["options"], t["held_out"]
    size = sum(f.stat().st_size for f in (out / "lens").iterdir() if f.is_file())
    rows = "\n".join(f"| {i} | {r:.3f} | {u:.3f} | {a:.3f} | {b:.3f} |" for i, (r, u, a, b) in enumerate(zip(
        held["raw"]["masked"]["kl"], held["tuned"]["masked"]["kl"], held["raw"]["masked"]["agreement"],
        held["tuned"]["masked"]["agreement"], strict=True)))
    return f"""
## Tuned lens (`lens/`)
A tuned lens for this model (LayerLens' `analysis.probe.lens`: one affine translator per layer, read by this model's MLM
head), so the probe's tuned-lens view works offline: {t['parameters']:,} parameters, {size / 2**20:.2f} MB on disk
(`config.json`, `translators.safetensors`, `training.json`). Trained {t['steps']:,} steps of {o['batch_size']} texts
(up to {o['max_length']} tokens) from the corpus above, KL at masked positions, SGD with Nesterov momentum, in
{t['seconds']:.0f} s on CPU. Held-out ({t['held_out_texts']} texts, masked positions): KL to the final layer's
distribution (nats) and top-1 agreement with the final layer, raw head vs tuned lens:

| hidden state | KL raw | KL tuned | agreement raw | agreement tuned |
|---|---|---|---|---|
{rows}
"""


def write_model_card(out: Path, info: dict) -> None:
    """``out/README.md``: what the model is and how well it does, from the measured ``info``."""
    c, m = info["config"], info["metrics"]
    n_params = sum(p.numel() for p in BertForMaskedLM.from_pretrained(out).parameters())
    quality = ""
    if "masked_top1" in m:
        quality = f"""
## Quality on held-out text (`{info['valid']}`)
| measure | value | tokens |
|---|---|---|
| masked-token top-1 accuracy (15% of tokens, all replaced by `[MASK]`) | {m['masked_top1']:.3f} | \
{m['masked_tokens']:,} |
| last layer + MLM head reconstructs the unmasked input token (top-1) | {m['reconstruction_top1']:.3f} | \
{m['reconstruction_tokens']:,} |

LayerLens' bar for the demo model is masked top-1 >= 0.20 and reconstruction >= 0.95: \
{_bar(m)}.
"""
    text = f"""# LayerLens demo model

A small uncased BERT masked language model trained from scratch by LayerLens' own script, so that every
LayerLens analysis works with no network. It is a research toy for looking at layers, not a useful language
model: use a real checkpoint (e.g. `bert-base-uncased`) for conclusions about BERT.

Load it with plain transformers: `AutoModelForMaskedLM.from_pretrained("models/demo")`.

## Architecture
`BertForMaskedLM`: {c['num_layers']} layers, hidden size {c['hidden_size']}, {c['num_heads']} attention heads, \
feed-forward size {c['intermediate_size']}, {c['seq_len']} positions, WordPiece vocabulary of {c['vocab_size']:,} \
(uncased, trained on the same corpus); {n_params:,} parameters, float32 safetensors.

## Training
- Corpus: `{info['corpus']}` (LayerLens' shared English corpus: movie reviews, State of the Union and \
inaugural addresses; {m['corpus_tokens']:,} tokens with `[CLS]`/`[SEP]`). Not in this repository.
- Objective: masked LM as in BERT (15% of tokens selected; 80% `[MASK]`, 10% random, 10% unchanged); no
  next-sentence prediction. Whole lines packed into chunks of up to {c['seq_len']} tokens, {c['short_seq_prob']:.0%} \
of chunks shorter.
- {c['steps']:,} steps of batch {c['batch_size']} (about {m['train_tokens_seen'] / 1e6:.1f}M tokens seen), AdamW \
lr {c['lr']} with {c['warmup_fraction']:.0%} warm-up and linear decay, weight decay {c['weight_decay']}, seed \
{c['seed']}; no dropout (it held this small model at the unigram plateau much longer).
- Time: {m['train_seconds'] / 60:.0f} minutes on {info['hardware']} (torch {info['torch']}); last training \
loss {m['train_loss_last']:.2f}.
{_continued(info)}{quality}
## Reproduce
```
python -m models.pretrain --corpus ../shared/data/english_corpus/train.txt.gz \\
    --valid ../shared/data/english_corpus/valid.txt.gz --tokenizer models/demo {_first_steps(info)}--out /tmp/demo
{_continue_command(info)}```
`--tokenizer models/demo` reuses this vocabulary: the `tokenizers` WordPiece trainer breaks frequency ties in
hash order, so a fresh tokenizer can differ in a few rare subwords. With it, weights are identical for the same
seed and thread count. `training_info.json` holds the exact settings and measurements.
"""
    (out / "README.md").write_text(text + lens_section(out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.pretrain", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, required=True, help="training text (.txt or .txt.gz)")
    p.add_argument("--valid", type=Path, help="held-out text to measure masked-token accuracy on")
    p.add_argument("--config", choices=sorted(PRESETS), default="small")
    p.add_argument("--out", type=Path, required=True, help="output directory (save_pretrained format)")
    p.add_argument("--steps", type=int, help="override the preset's number of optimiser steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", type=Path, help="reuse this saved tokenizer instead of training one")
    p.add_argument("--init-from", type=Path, help="continue training this saved model (and reuse its tokenizer)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="with --valid: measure and save a checkpoint every this many steps")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.tokenizer is not None and not (args.tokenizer / "tokenizer.json").is_file():
        print(f"error: no tokenizer.json in {args.tokenizer}", file=sys.stderr)
        return 2
    for path in (args.corpus, args.valid):
        if path is not None and not path.is_file():
            print(f"error: no such file: {path}", file=sys.stderr)
            return 2
    try:
        cfg = PretrainConfig.model_validate({**PRESETS[args.config].model_dump(), "seed": args.seed,
                                             **({} if args.steps is None else {"steps": args.steps})})
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"error: --{first['loc'][0]}: {first['msg'].lower()}, got {first['input']!r}", file=sys.stderr)
        return 2
    if args.init_from is not None and not (args.init_from / "config.json").is_file():
        print(f"error: no saved model in {args.init_from}", file=sys.stderr)
        return 2
    train(cfg, args.corpus, args.out, args.valid, tokenizer_dir=args.tokenizer, eval_every=args.eval_every,
          init_from=args.init_from)
    return 0


if __name__ == "__main__":
    sys.exit(main())
