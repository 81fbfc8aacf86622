"""Fine-tuning an encoder with a layer-pooling head (:mod:`analysis.training.heads`): the engine behind
``python -m analysis finetune`` and the dashboard's jobs.

- AdamW, no weight decay on biases and LayerNorm weights; linear warm-up (``warmup`` of the steps) then linear
  decay; gradient clipping; dropout in the head; a seed.
- Layer-wise decreasing learning rate (Sun et al. 2019, eq. 2): encoder layer k (1..L) trains at
  ``lr * layer_decay ** (L - k)``; the embeddings sit below layer 1 (``lr * layer_decay ** L``); the head and
  the pooler sit on top (``lr``). ALBERT's one shared layer is used at every depth and gets the top rate.
- Early stopping on validation loss, keeping the best epoch's weights; k-fold cross-validation (mean and std)
  with a majority-vote ensemble of the fold models on the test set (GRUBERT).
- Accelerate runs the same loop on CPU, one GPU or several processes
  under ``accelerate launch`` (:func:`share`): the batch size is the *global* batch; every process takes its
  rows of each global batch (so every process takes the same number of steps, whatever the number of batches)
  and the loss is scaled so that DDP's average of the gradients is the gradient of the global batch's mean
  loss, as in one process. Evaluation is shared between the processes and gathered.
- Shaped like the HF Trainer without its weight: a :class:`TrainState` (step, epoch, history) and a
  :class:`TrainControl` (``should_stop``) are passed to callbacks after every step and epoch.
- Float32 master weights; the products in bfloat16 autocast where :func:`analysis.core.precision.bf16_pays` says it
  pays (a GPU with bfloat16, a CPU with bf16 units: :mod:`analysis.core.autocast`; mixed-precision training,
  Micikevicius et al. 2018, without loss scaling in bfloat16, Kalamkar et al. 2019), as the HF Trainer's
  ``bf16=True``. :attr:`TrainState.autocast` says which ran.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from analysis.core.autocast import BF16, F32, training_autocast
from analysis.core.autocast import autocast as _autocast
from analysis.core.csvout import to_csv
from analysis.core.parallel import ONE, Ranks, ranks_for
from analysis.core.scores import classification_metrics, majority_class
from analysis.core.store import write_set
from analysis.training.heads import HeadOutput, build_head, trainable_parameters
from analysis.training.options import FinetuneConfig
from analysis.training.runs import EACH_ROW, EPOCH_VECTORS
from analysis.training.taskdata import TaskData, batch_order, batches, padded

log = logging.getLogger(__name__)


class Classifier(nn.Module):
    """An encoder (``AutoModel``: every layer's states) and a head over them."""

    def __init__(self, encoder: nn.Module, head_name: str, num_labels: int, dropout: float = 0.1):
        super().__init__()
        config = encoder.config
        self.encoder = encoder
        self.num_layers = config.num_hidden_layers
        self.head_name = head_name
        self.num_labels = num_labels
        self.head = build_head(head_name, self.num_layers, config.hidden_size, num_labels, dropout,
                               pooler=getattr(encoder, "pooler", None))

    def forward(self, input_ids, attention_mask, token_type_ids=None, return_states: bool = False):
        kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None and self._uses_types() else {}
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, **kwargs)
        result = self.head(out.hidden_states, attention_mask)
        if not return_states:
            return result
        return result, torch.stack([h[:, 0] for h in out.hidden_states])  # (L + 1, batch, hidden)

    def _uses_types(self) -> bool:
        return getattr(self.encoder.config, "type_vocab_size", 0) > 1

    def head_parameters(self) -> int:
        return trainable_parameters(self.head, exclude=getattr(self.encoder, "pooler", None))


def layer_of(name: str, num_layers: int) -> int:
    """Depth of an encoder parameter for layer-wise learning rates: 0 embeddings, k for layer k (1-based),
    ``num_layers`` for ALBERT's shared layer and anything else in the encoder (pooler)."""
    if "embedding" in name:  # embeddings.*, ALBERT's embedding_hidden_mapping_in, ELECTRA's embeddings_project
        return 0
    if m := re.search(r"\blayers?\.(\d+)\.", name):
        return int(m.group(1)) + 1
    return num_layers


def no_decay(name: str) -> bool:
    return name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name or "layernorm" in name.lower()


def parameter_groups(model: Classifier, config: FinetuneConfig) -> list[dict]:
    """AdamW groups by (learning rate, weight decay): layer-wise decay over the encoder, the head on top."""
    groups: dict[tuple[float, float], list] = {}
    top = model.num_layers
    head_ids = {id(p) for p in model.head.parameters()}
    for name, p in model.encoder.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in head_ids:  # the pooler, used by the pooler head: on top, with the head
            continue
        lr = config.lr * config.layer_decay ** (top - layer_of(name, top))
        groups.setdefault((lr, 0.0 if no_decay(name) else config.weight_decay), []).append(p)
    seen = {id(p) for ps in groups.values() for p in ps}
    for name, p in model.head.named_parameters():
        if p.requires_grad and id(p) not in seen:
            groups.setdefault((config.lr, 0.0 if no_decay(name) else config.weight_decay), []).append(p)
    return [{"params": ps, "lr": lr, "weight_decay": wd} for (lr, wd), ps in groups.items()]


@dataclasses.dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    total_steps: int = 0
    history: list[dict] = dataclasses.field(default_factory=list)
    last_loss: float = float("nan")
    lr: float = float("nan")  # the top (base) learning rate after the last step
    autocast: str = "float32"  # "bfloat16" (autocast, float32 master weights) or "float32": analysis.core.autocast


@dataclasses.dataclass
class TrainControl:
    should_stop: bool = False


Callback = Callable[[str, TrainState, TrainControl], None]  # event is "step" or "epoch"


@dataclasses.dataclass
class Evaluation:
    loss: float
    predictions: np.ndarray  # (n,) label ids, in data order
    layer_weights: np.ndarray | None  # (n, pooled layers)
    weight_layers: list[int] | None
    cls_vectors: np.ndarray | None  # (L + 1, n, hidden) float16

    def metrics(self, labels: list[int], names: list[str], train_labels: list[int]) -> dict:
        """Scores on ``labels``, the baseline being the majority class of ``train_labels``."""
        majority = majority_class(train_labels, list(range(len(names))))
        return {"loss": self.loss, **classification_metrics(self.predictions, labels, names, majority)}


@torch.no_grad()
def evaluate(model: Classifier, data: TaskData, batch_size: int, pad_id: int, device, keep_vectors: bool = False,
             autocast: bool = False, ranks: Ranks = ONE) -> Evaluation:
    """Loss, predictions, layer weights (and [CLS] vectors) on ``data``. Under a launcher each process evaluates
    every N-th batch and every process gets the whole result (the same numbers: early stopping decides alike).
    In float32 unless ``autocast`` (bfloat16): :func:`train` evaluates every epoch in float32 whatever it trains
    in, so the validation scores, layer weights and vectors a user reads are float32's."""
    model.eval()
    n = len(data)
    lengths = [len(ids) for ids in data.input_ids]
    parts = []
    for idx in ranks.steps(batch_order(lengths, batch_size * 2, shuffle=False, by_length=True)):
        if idx is None:
            continue
        batch = padded(data, idx, pad_id)
        pos = batch.pop("positions").numpy()
        labels = batch.pop("labels").to(device)
        with _autocast(device, BF16 if autocast else F32):
            out, cls = model(**{k: v.to(device) for k, v in batch.items()}, return_states=True)
        logits, known = out.logits.float(), labels >= 0
        loss = nn.functional.cross_entropy(logits[known], labels[known], reduction="sum").item() if known.any() else 0
        parts.append((pos, logits.argmax(-1).cpu().numpy(), loss, int(known.sum()), out.layers,
                      out.layer_weights.float().cpu().numpy() if out.layer_weights is not None else None,
                      cls.float().cpu().numpy().astype(np.float16) if keep_vectors else None))
    parts = [part for rank_parts in ranks.all_gather(parts) for part in rank_parts]
    preds = np.zeros(n, dtype=np.int64)
    weights = vectors = weight_layers = None
    for pos, pred, _, _, layers, w, cls in parts:
        preds[pos] = pred
        if w is not None:
            if weights is None:
                weights, weight_layers = np.zeros((n, w.shape[1]), np.float32), layers
            weights[pos] = w
        if cls is not None:
            if vectors is None:
                vectors = np.zeros((cls.shape[0], n, cls.shape[-1]), np.float16)
            vectors[:, pos] = cls
    total, counted = sum(part[2] for part in parts), sum(part[3] for part in parts)
    return Evaluation(total / max(counted, 1), preds, weights, weight_layers, vectors)


def freeze_unused(model: Classifier, batch: dict, device) -> list[str]:
    """Freeze the parameters the head never reaches (the pooler, the layers above the one a head reads): one
    process gives them no gradient and AdamW leaves them alone, but DDP would all-reduce zeros into them and
    weight decay would then move them. Found by one backward pass in eval mode (no dropout, no random numbers
    drawn). Returns their names."""
    batch = {k: v.to(device) for k, v in batch.items() if k not in ("labels", "positions")}
    model.eval()
    model.zero_grad(set_to_none=True)
    model(**batch).logits.float().sum().backward()
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    for name, p in model.named_parameters():
        if name in unused:
            p.requires_grad_(False)
    model.zero_grad(set_to_none=True)
    return unused


def share(batch: dict, ranks: Ranks) -> tuple[dict, torch.Tensor]:
    """This process's rows of a global batch (contiguous, sizes differing by at most one) and each row's
    weight in the loss. A process left without a row (a last batch smaller than the number of processes) gets
    the batch's first row again with weight 0: it takes the step like the others and adds nothing."""
    rows = np.array_split(np.arange(len(batch["labels"])), ranks.count)[ranks.index]
    weight = torch.ones(len(rows))
    if len(rows) == 0:
        rows, weight = np.zeros(1, dtype=np.int64), torch.zeros(1)
    return {k: v[torch.from_numpy(rows)] for k, v in batch.items()}, weight


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train(model: Classifier, train_data: TaskData, val_data: TaskData, config: FinetuneConfig, pad_id: int,
          device: str = "cpu", out: Path | None = None,
          callbacks: list[Callback] = ()) -> tuple[Classifier, TrainState]:
    """Fine-tune ``model`` in place; returns it (the best epoch's weights with early stopping) and the state.
    With ``out``, per-epoch layer weights and validation [CLS] vectors go to ``out/epochs/<e>/``."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import get_linear_schedule_with_warmup

    seed_everything(config.seed)
    model = model.float()  # float32 master weights whatever the checkpoint's dtype; bf16 only as autocast
    mode = training_autocast(device, model.encoder.config.hidden_size)
    ranks = ranks_for(device)
    handlers = []
    if ranks.count > 1:
        freeze_unused(model, padded(train_data, list(range(min(2, len(train_data)))), pad_id), device)
        handlers = [DistributedDataParallelKwargs(find_unused_parameters=True)]  # in case a head skips a part
    # autocast is entered around the forward pass below, not through accelerate's mixed_precision: that wraps the
    # model's forward in autocast for good, and the evaluations (and the returned model) are float32
    accelerator = Accelerator(cpu=ranks.device_for(device) == "cpu", mixed_precision="no", kwargs_handlers=handlers)
    steps_per_epoch = math.ceil(len(train_data) / config.batch_size)  # global batches: each one step in every process
    total = min(config.max_steps or 10**12, steps_per_epoch * config.epochs)
    optimizer = torch.optim.AdamW(parameter_groups(model, config), lr=config.lr, fused=True)  # one kernel, CPU too
    if config.schedule == "linear":
        scheduler = get_linear_schedule_with_warmup(optimizer, int(config.warmup * total), total)
    else:
        scheduler = LambdaLR(optimizer, lambda step: 0.9 ** (step // steps_per_epoch))
    model, optimizer = accelerator.prepare(model, optimizer)  # the scheduler steps once per step: not prepared
    state, control = TrainState(total_steps=total, autocast=mode), TrainControl()
    best_loss, best_state, since_best = float("inf"), None, 0
    start = time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        state.epoch = epoch
        model.train()
        losses = []
        epoch_batches = batches(train_data, config.batch_size, pad_id, shuffle=True, seed=config.seed + epoch,
                                by_length=config.group_by_length)
        for global_batch in epoch_batches:
            # every process takes its rows of the same global batch; DDP averages the processes' gradients, so
            # each one's loss is its rows' summed loss x processes / global rows: the mean over the global batch
            batch, weight = share(global_batch, ranks)
            batch.pop("positions")
            labels = batch.pop("labels").to(accelerator.device)
            with _autocast(accelerator.device, mode):
                output: HeadOutput = model(**{k: v.to(accelerator.device) for k, v in batch.items()})
                rows_loss = nn.functional.cross_entropy(output.logits.float(), labels, reduction="none")
                loss = (rows_loss * weight.to(rows_loss.device)).sum() * ranks.count / len(global_batch["labels"])
            accelerator.backward(loss)
            if config.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state.step += 1
            state.last_loss = accelerator.reduce(loss.detach(), "mean").item()  # the global batch's mean loss
            state.lr = max(scheduler.get_last_lr())
            losses.append(state.last_loss)
            for cb in callbacks:
                cb("step", state, control)
            if control.should_stop or state.step >= total:
                break
        unwrapped = accelerator.unwrap_model(model)
        ev = evaluate(unwrapped, val_data, config.batch_size, pad_id, accelerator.device,
                      keep_vectors=config.save_vectors and out is not None, ranks=ranks)
        metrics = ev.metrics(val_data.labels, [str(i) for i in range(unwrapped.num_labels)], train_data.labels)
        state.history.append({"epoch": epoch, "step": state.step, "train_loss": float(np.mean(losses or [np.nan])),
                              "val_loss": ev.loss, "val_accuracy": metrics["accuracy"],
                              "val_macro_f1": metrics["macro_f1"], "seconds": round(time.perf_counter() - start, 2)})
        if out is not None and accelerator.is_main_process:
            save_epoch(out / "epochs" / str(epoch), ev, val_data)
            if config.save_epoch_checkpoints:  # a series of the job's epochs (layerlens series --checkpoints job:N)
                unwrapped.encoder.save_pretrained(out / "epochs" / str(epoch) / "encoder")
        if ev.loss < best_loss:
            best_loss, since_best = ev.loss, 0
            if config.early_stopping:
                best_state = copy.deepcopy({k: v.detach().cpu() for k, v in unwrapped.state_dict().items()})
        else:
            since_best += 1
        for cb in callbacks:
            cb("epoch", state, control)
        if control.should_stop or state.step >= total:
            break
        if config.early_stopping and since_best >= config.patience:
            log.info("early stopping after epoch %d (best validation loss %.4f)", epoch, best_loss)
            break
    model = accelerator.unwrap_model(model)
    if best_state is not None:
        model.load_state_dict(best_state)
    return model, state


def save_epoch(directory: Path, ev: Evaluation, data: TaskData) -> None:
    """Per-epoch files for the dashboard: ``layer_weights.csv``, and the epoch's validation [CLS] vectors as a
    layered vector set (:func:`analysis.training.runs.epoch_vectors`): ``manifest.json``, ``val_cls.npy`` (float16,
    (L+1, n, hidden)) and ``val_ids.json`` (each row's example id and label id; names in metrics.json's
    ``labels``)."""
    directory.mkdir(parents=True, exist_ok=True)
    if ev.layer_weights is not None:
        to_csv(weights_frame(ev, data), directory / "layer_weights.csv")
    if ev.cls_vectors is not None:
        (directory / "val_ids.json").write_text(json.dumps({"example_id": list(map(int, data.ids)),
                                                            "label": list(map(int, data.labels))}))
        write_set(directory, ev.cls_vectors, shard_file=EPOCH_VECTORS, each_row=EACH_ROW)  # the manifest last


def weights_frame(ev: Evaluation, data: TaskData):
    import pandas as pd

    frame = pd.DataFrame(ev.layer_weights, columns=[f"layer_{i}" for i in ev.weight_layers])
    frame.insert(0, "example_id", list(data.ids))
    return frame


def read_weights(path: Path):
    """A ``layer_weights.csv`` (:func:`weights_frame`), or an :class:`analysis.core.inputs.InputError` saying why it is
    not one (a file edited or truncated by hand)."""
    import pandas as pd

    from analysis.core.inputs import InputError

    frame = pd.read_csv(path)
    columns = [c for c in frame.columns if c.startswith("layer_") and c[6:].isdigit()]
    if "example_id" not in frame.columns or not columns:
        raise InputError(f"{path.name} has no example_id and layer_<i> columns")
    bad = [c for c in ["example_id", *columns] if not pd.api.types.is_numeric_dtype(frame[c])]
    if bad:
        raise InputError(f"{path.name}: column {bad[0]} holds values that are not numbers")
    return frame
