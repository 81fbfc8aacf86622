"""Training a tuned lens (:mod:`analysis.probe.lens`: the translators and their artifacts) for a masked language
model (Belrose et al. 2023, adapted from decoders to encoders).

Training, as the decoder recipe with what an encoder needs:
- inputs masked as in pre-training (each counted token chosen with probability ``mask_fraction``; of those 80%
  become the mask token, 10% a random token, 10% stay), drawn from a generator seeded by (seed, step), so a
  resumed run sees the same batches;
- loss: KL(final-layer distribution || lens distribution) at the **masked** positions (``positions: all``: at
  every counted position), summed over layers. At unmasked positions the final layer mostly copies its input
  (Kao's reconstruction effect), so a lens trained there learns to copy; both are reported on held-out texts;
- SGD with Nesterov momentum 0.9, the learning rate ``lr_scale * (1 - momentum)`` (PyTorch's momentum scales
  steps by 1 / (1 - momentum)), weight decay 1e-3, linear decay to 0, gradient clipping at 1.0 over all
  translators; Adam (amsgrad, lr 1e-3 x scale, linear warm-up over min(1000, steps / 5)) as an option;
- the encoder runs once per batch without a graph; each layer's translator, head and loss are then
  back-propagated one layer at a time, so training memory does not grow with the number of layers;
- in bfloat16 autocast where :func:`analysis.core.precision.bf16_pays` (:mod:`analysis.core.autocast`; Micikevicius et
  al. 2018 mixed precision, float32 translators as master weights), the frozen encoder and head through bfloat16
  shadow copies of their weights (:class:`Frozen`); the held-out measurements stay float32.
Deviations from the reference (docs/tuned_lens.md says why): no per-step re-centring of the translators (the
reference's ``normalize_`` relied on its unembedding starting with a LayerNorm; here the translator sits before the
whole MLM head, whose first part is a dense layer); text files and hub datasets rather than pre-chunked token
blocks (an encoder's inputs are sentences, padded per batch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from analysis.core.inputs import InputError
from analysis.core.staging import clean_stale_files, write_atomic
from analysis.probe.lens import (
    CHECKPOINT,
    CONFIG,
    FORMAT,
    TunedLens,
    checkpoint_state,
    finished,
    folder_name,
    read_checkpoint,
    save,
    write_config,
)
from models.loading import LoadedModel


def mask_like_pretraining(ids: torch.Tensor, counted: torch.Tensor, fraction: float, mask_id: int, vocab: int,
                          generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: each counted position is selected with probability ``fraction``; a selected one becomes
    ``mask_id`` (80%), a random token (10%) or stays (10%). Returns ``(masked ids, selected)``. Written out
    rather than transformers' collator so that every step's masks come from a generator seeded by the step
    (resume sees the same inputs)."""
    draw = torch.rand(ids.shape, generator=generator)
    selected = (draw < fraction) & counted
    how = torch.rand(ids.shape, generator=generator)
    random_ids = torch.randint(vocab, ids.shape, generator=generator)
    out = torch.where(selected & (how < 0.8), torch.full_like(ids, mask_id), ids)
    out = torch.where(selected & (how >= 0.8) & (how < 0.9), random_ids, out)
    return out, selected


def kl_to_final(final_logp: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Per row KL(final || lens) in nats, from the final layer's log-probabilities and the lens's logits."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return (final_logp.exp() * (final_logp - logp)).sum(-1)


def make_optimizer(lens: TunedLens, options, steps: int):
    from transformers import get_linear_schedule_with_warmup

    params = list(lens.parameters())
    if options.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=options.lr_scale * (1 - options.momentum), momentum=options.momentum,
                              nesterov=True, weight_decay=options.weight_decay)
        warmup = 0
    else:
        opt = torch.optim.Adam(params, lr=options.lr_scale * 1e-3, betas=(options.momentum, 0.999), amsgrad=True,
                               weight_decay=options.weight_decay)
        warmup = min(1000, steps // 5)
    return opt, get_linear_schedule_with_warmup(opt, warmup, steps)


class Batches:
    """Tokenised texts (:func:`analysis.core.activations.encode`) and the batch of every step: a seeded permutation per
    pass over the texts; batches padded and counted as the probe's (``make_batch``, ``counted_mask``)."""

    def __init__(self, loaded: LoadedModel, texts: list[str], batch_size: int, max_length: int, seed: int):
        from analysis.core.activations import encode, max_input_length
        from analysis.core.inputs import TextInputs

        self.encoded = encode(loaded.tokenizer, TextInputs(tuple(texts)), min(max_length, max_input_length(loaded)))
        self.ids = self.encoded.input_ids
        self.batch_size, self.seed, self.loaded = min(batch_size, len(self.ids)), seed, loaded

    def rows(self, step: int) -> list[int]:
        per_pass = len(self.ids) // self.batch_size
        n, k = divmod(step, per_pass)
        order = np.random.default_rng([self.seed, n]).permutation(len(self.ids))
        return order[k * self.batch_size:(k + 1) * self.batch_size].tolist()

    def batch(self, rows: list[int]):
        """``(batch, counted)``: the padded batch on the model's device and its counted positions (on the CPU)."""
        from analysis.core.activations import counted_on_host, make_batch

        tok = self.loaded.tokenizer
        batch = make_batch(self.encoded, rows, tok.pad_token_id, self.loaded.spec.device)
        return batch, torch.from_numpy(counted_on_host(batch, list(tok.all_special_ids), include_special=False))


@dataclasses.dataclass
class Frozen:
    """The frozen encoder (``base_model``) and MLM head a lens step runs: in bfloat16 autocast, their shadows with
    bfloat16 ``nn.Linear`` weights (:func:`analysis.core.autocast.bf16_shadow`: the same results as autocast's own
    casts, made once instead of on every call; measured in docs/benchmarks.md)."""

    encoder: nn.Module
    head: Callable[[torch.Tensor], torch.Tensor]
    num_layers: int

    @classmethod
    def of(cls, loaded: LoadedModel, mode: str) -> Frozen | None:
        """The shadows for ``mode`` ``"bfloat16"``; None (``loaded``'s own) for ``"float32"``."""
        from analysis.core.autocast import BF16, bf16_shadow

        if mode != BF16:
            return None
        head = loaded.anatomy.head
        return cls(bf16_shadow(loaded.model.base_model), bf16_shadow(head) if isinstance(head, nn.Module) else head,
                   loaded.num_layers)

    def hidden_states(self, batch, input_ids: torch.Tensor, half: str = "output") -> tuple[torch.Tensor, ...]:
        """As :func:`analysis.core.activations.hidden_states`, with the shadow encoder."""
        from analysis.core.activations import encoder_states

        return encoder_states(self.encoder, self.num_layers, batch, input_ids, half)


def layer_losses(loaded: LoadedModel, lens: TunedLens, batch, counted: torch.Tensor, options, step: int,
                 backward: bool, frozen: Frozen | None = None) -> tuple[list[float], int]:
    """One batch: mask it (seeded by step), run the encoder once without a graph, then per state the lens
    translates (:meth:`TunedLens.states`: the layer outputs ``0..L-1``, and with ``half="attention"`` each layer's
    attention half) the KL of the lens at the chosen positions (back-propagated one state at a time with
    ``backward``). Returns each state's mean KL (the last layer's output is the reference) and the number of
    positions. ``frozen``: the encoder and head to run instead of ``loaded``'s (their bfloat16 shadows under
    autocast, :meth:`Frozen.of`)."""
    from analysis.core.activations import hidden_states

    gen = torch.Generator().manual_seed(options.seed * 1_000_003 + step)
    masked, selected = mask_like_pretraining(batch.input_ids.cpu(), counted, options.mask_fraction,
                                             loaded.tokenizer.mask_token_id, loaded.anatomy.vocab_size, gen)
    where = (selected if options.positions == "masked" else counted).to(batch.input_ids.device)
    trained = lens.states()
    if not where.any():
        return [math.nan] * len(trained), 0
    head = frozen.head if frozen is not None else loaded.anatomy.head
    with torch.no_grad():
        states = (frozen.hidden_states(batch, masked.to(batch.input_ids.device), lens.half) if frozen is not None
                  else hidden_states(loaded, batch, masked.to(batch.input_ids.device), lens.half))
        final_logp = torch.log_softmax(head(states[-1][where]).float(), dim=-1)
    losses = []
    for state, (layer, half) in enumerate(trained):
        h = states[state][where].detach()
        with torch.set_grad_enabled(backward):
            loss = kl_to_final(final_logp, head(lens(h, layer, half))).mean()
            if backward:
                loss.backward()  # this layer's graph only: freed before the next layer's is built
        losses.append(loss.item())
    return losses, int(where.sum())


@torch.no_grad()
def evaluate(loaded: LoadedModel, lens: TunedLens | None, batches: Batches, options, rows: list[int]) -> dict:
    """Held-out KL to the final layer and top-1 agreement with it, per hidden state 0..L (with
    ``options.half="attention"``, per state of :func:`analysis.core.activations.state_labels`: each layer's attention
    half before its output), at masked and at unmasked positions (masks seeded as in training), for the lens (or
    the raw head with None)."""
    from analysis.core.activations import hidden_states, state_labels

    labels = state_labels(loaded.num_layers, options.half)
    n_states = len(labels)
    sums = {kind: np.zeros((2, n_states)) for kind in ("masked", "unmasked")}
    counts = {"masked": 0, "unmasked": 0}
    for start in range(0, len(rows), batches.batch_size):
        part = rows[start:start + batches.batch_size]
        batch, counted = batches.batch(part)
        gen = torch.Generator().manual_seed(options.seed * 1_000_003 + 10**9 + start)
        masked, selected = mask_like_pretraining(batch.input_ids.cpu(), counted, options.mask_fraction,
                                                 loaded.tokenizer.mask_token_id, loaded.anatomy.vocab_size, gen)
        states = hidden_states(loaded, batch, masked.to(batch.input_ids.device), options.half)
        for kind, where in (("masked", selected), ("unmasked", counted & ~selected)):
            where = where.to(batch.input_ids.device)
            if not where.any():
                continue
            final_logits = loaded.anatomy.head(states[-1][where])
            final_logp, final_top = torch.log_softmax(final_logits.float(), -1), final_logits.argmax(-1)
            for state, (layer, half) in enumerate(labels):
                h = states[state][where]
                logits = loaded.anatomy.head(lens(h, layer, half) if lens is not None else h)
                sums[kind][0, state] += kl_to_final(final_logp, logits).sum().item()
                sums[kind][1, state] += (logits.argmax(-1) == final_top).sum().item()
            counts[kind] += int(where.sum())
    return {kind: {"positions": counts[kind], "kl": (sums[kind][0] / max(counts[kind], 1)).tolist(),
                   "agreement": (sums[kind][1] / max(counts[kind], 1)).tolist()} for kind in sums}


def train(loaded: LoadedModel, texts: list[str], options, out: Path, progress: Callable | None = None,
          should_stop: Callable[[], bool] | None = None, log: Callable[[str], None] = lambda s: None,
          earlier: Iterable[Path] = ()) -> dict | None:
    """Train a lens for ``loaded`` on ``texts`` (:class:`analysis.probe.options.LensOptions`), checkpointing to
    ``out`` every ``save_every`` steps and when ``should_stop()``; resumes from the checkpoint in ``out`` (refusing one
    of other options, weights or texts), or, when ``out`` has none, from the furthest unfinished checkpoint among the
    ``earlier`` folders (a lens job's earlier runs) of the same options, weights and texts. ``progress(step, total,
    losses)`` after every step. Returns ``training.json``'s dict, or None when stopped (a partial lens)."""
    from safetensors.torch import save_file

    from analysis.core.activations import state_labels
    from analysis.core.autocast import autocast, training_autocast
    from analysis.probe.reconstruction import require_mlm_head

    require_mlm_head(loaded)
    if len(texts) < options.eval_texts + 1:
        raise InputError(f"{len(texts)} texts: the lens needs more than eval_texts={options.eval_texts} (held out to "
                         "measure it) plus some to train on")
    torch.manual_seed(options.seed)
    order = np.random.default_rng(options.seed).permutation(len(texts))
    held, train_rows = order[:options.eval_texts], order[options.eval_texts:]
    train_batches = Batches(loaded, [texts[i] for i in train_rows], options.batch_size, options.max_length,
                            options.seed)
    eval_batches = Batches(loaded, [texts[i] for i in held], options.batch_size, options.max_length, options.seed)
    tokens_per_step = np.mean([len(ids) for ids in train_batches.ids]) * train_batches.batch_size
    steps = options.steps if not options.max_tokens else min(options.steps, max(1, int(options.max_tokens //
                                                                                         tokens_per_step)))
    lens = TunedLens(loaded.num_layers, loaded.anatomy.hidden_size, options.half).to(loaded.spec.device)
    opt, scheduler = make_optimizer(lens, options, steps)
    run = {"format": FORMAT, "options": options.to_dict(), "weights_id": loaded.weights_id,
           "texts": texts_digest(texts), "total_steps": steps}
    clean_stale_files(out)  # a killed run's half-written checkpoint
    source = _resume_source(out, run, earlier)
    start_step, curve = 0, []
    if source is not None:
        state, tensors = read_checkpoint(source / CHECKPOINT)
        lens.load_state_dict(tensors["lens"])
        opt.load_state_dict(_optimizer_state(opt, tensors["optimizer"], state["optimizer"]))
        with warnings.catch_warnings():  # fast-forwarding the schedule to the saved step, before any opt.step()
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(state["step"]):
                scheduler.step()
        start_step = state["step"]
        curve = [{"step": i + 1, "loss": float(np.nansum(row)), "per_layer": row}
                 for i, row in enumerate(tensors["per_layer"].tolist())]
        log(f"resuming from step {start_step} of {steps}"
            + (f" (the checkpoint of {folder_name(source)})" if source != out else ""))
    eval_rows = list(range(len(eval_batches.ids)))
    before = evaluate(loaded, None, eval_batches, options, eval_rows)
    started = time.perf_counter()
    # the frozen encoder and head (and the translators, float32 master weights) in bfloat16 autocast where it pays;
    # the held-out measurements before and after stay float32: the figures a user reads are float32's
    mode = training_autocast(loaded.spec.device, loaded.anatomy.hidden_size)
    frozen = Frozen.of(loaded, mode)
    log(f"training in {mode}" + (" autocast (float32 translators; held-out KL measured in float32)"
                                 if mode != "float32" else ""))

    def checkpoint(step: int) -> None:
        """The step's translators, optimizer state, loss curve and run in one file, replaced by one rename: the
        commit point of a checkpoint (config.json, written after it, only makes the folder listed)."""
        tensors, meta = _flat_optimizer_state(opt)
        flat = {**{f"lens.{k}": v.detach().cpu().contiguous() for k, v in lens.state_dict().items()},
                **{f"optimizer.{k}": v for k, v in tensors.items()},
                "per_layer": torch.tensor([c["per_layer"] for c in curve], dtype=torch.float64).reshape(
                    len(curve), len(lens.states()))}
        state = {**run, "step": step, "optimizer": meta}
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / CHECKPOINT, lambda path: save_file(flat, path, metadata={"layerlens": json.dumps(state)}))
        if not (out / CONFIG).is_file():
            write_config(loaded, out, lens.half)

    step = start_step
    for step in range(start_step, steps):
        if should_stop is not None and should_stop():
            checkpoint(step)
            log(f"stopped at step {step} of {steps}; run again with the same options and --out to resume")
            return None
        batch, counted = train_batches.batch(train_batches.rows(step))
        with autocast(loaded.spec.device, mode):
            losses, positions = layer_losses(loaded, lens, batch, counted, options, step, backward=True,
                                             frozen=frozen)
        if positions:
            if options.max_grad_norm:
                nn.utils.clip_grad_norm_(lens.parameters(), options.max_grad_norm)
            opt.step()
        opt.zero_grad(set_to_none=True)
        scheduler.step()
        curve.append({"step": step + 1, "loss": float(np.nansum(losses)), "per_layer": losses})
        if progress is not None:
            progress(step + 1, steps, losses)
        if (step + 1) % options.save_every == 0 and step + 1 < steps:
            checkpoint(step + 1)
    after = evaluate(loaded, lens, eval_batches, options, eval_rows)
    training = {"options": options.to_dict(), "steps": steps, "total_steps": steps, "texts": len(train_rows),
                "held_out_texts": len(held), "tokens_per_step": float(tokens_per_step),
                "seconds": round(time.perf_counter() - started, 2), "autocast": mode, "curve": curve,
                "held_out": {"raw": before, "tuned": after}, "parameters": sum(p.numel() for p in lens.parameters()),
                **({"states": [list(x) for x in state_labels(loaded.num_layers, options.half)]}
                   if options.half != "output" else {})}
    checkpoint(steps)
    save(lens, loaded, out, training)  # training.json last: from then on the lens is finished
    return training


def texts_digest(texts: list[str]) -> str:
    """What a checkpoint records of its texts, so that a resume on other texts (an edited corpus) is refused."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode("utf-8", "surrogatepass") + b"\0")
    return f"{len(texts)}:{h.hexdigest()[:32]}"


def _resume_source(out: Path, run: dict, earlier: Iterable[Path]) -> Path | None:
    """The folder whose checkpoint a run resumes from: ``out``'s own (an :class:`InputError` when it belongs to
    another run, or ``out`` holds a lens without a checkpoint this version reads), else the furthest unfinished
    one of the same run among ``earlier``, else None."""
    own = out / CHECKPOINT
    if own.exists() or (out / CONFIG).exists():
        state = checkpoint_state(own)
        if state is None:
            raise InputError(f"{out} holds a lens without a checkpoint this version can resume from (an earlier "
                             "version's, whose files could be of different steps, or none): choose a new --out")
        if state["weights_id"] != run["weights_id"]:
            raise InputError(f"{out} holds a lens trained for other weights ({state['weights_id']}): choose a new "
                             "--out")
        changed = sorted(k for k in {**state["options"], **run["options"]}
                         if state["options"].get(k) != run["options"].get(k))
        if changed:
            raise InputError(f"{out} holds a lens trained with other options ({', '.join(changed)}): choose a new "
                             "--out, or the same options to resume")
        if state["texts"] != run["texts"]:
            raise InputError(f"{out} holds a lens trained on other texts (the corpus changed since): choose a new "
                             "--out, or the same texts to resume")
        return out
    best = None
    for folder in earlier:
        folder = Path(folder)
        state = checkpoint_state(folder / CHECKPOINT)
        if (folder.resolve() != out.resolve() and state is not None and not finished(folder)
                and all(state.get(k) == run[k] for k in ("options", "weights_id", "texts", "total_steps"))
                and (best is None or state["step"] > best[0])):
            best = (state["step"], folder)
    return best[1] if best is not None else None


def _flat_optimizer_state(opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """The optimizer's per-parameter tensors as a flat dict for safetensors, and its scalars as JSON."""
    sd = opt.state_dict()
    tensors, scalars = {}, {"param_groups": sd["param_groups"], "scalars": {}}
    for index, values in sd["state"].items():
        for name, value in values.items():
            if torch.is_tensor(value) and value.dim() > 0:
                tensors[f"{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars["scalars"][f"{index}.{name}"] = float(value)
    return tensors, scalars


def _optimizer_state(opt: torch.optim.Optimizer, tensors: dict, meta: dict) -> dict:
    state: dict = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    for key, value in meta["scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = torch.tensor(value)
    return {"state": state, "param_groups": meta["param_groups"]}


def read_corpus(options) -> list[str]:
    """The texts of ``options.corpus`` (the forms of a fine-tuning split: a file, ``demo``, ``hf:NAME:SPLIT``)."""
    from analysis.core.inputs import read_split

    if not options.corpus:
        raise InputError("no texts: set corpus (a .txt file, 'demo' or hf:NAME[/CONFIG]:SPLIT)")
    return list(read_split(options.corpus, options.text_column, None, None).texts)


def record_facts(training: dict) -> dict:
    """What a lens's run.json says of its training (the CLI's and a job's alike): steps, texts and the held-out KL
    and agreement, raw and tuned."""
    return {"steps": training.get("steps"), "texts": training.get("texts"), "held_out": training.get("held_out")}
