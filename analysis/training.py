"""Fine-tuning an encoder with a layer-pooling head (:mod:`analysis.heads`): the engine behind
``python -m analysis finetune`` and the dashboard's jobs.

- AdamW, no weight decay on biases and LayerNorm weights; linear warm-up (``warmup`` of the steps) then linear
  decay; gradient clipping; dropout in the head; a seed.
- Layer-wise decreasing learning rate (Sun et al. 2019, eq. 2): encoder layer k (1..L) trains at
  ``lr * layer_decay ** (L - k)``; the embeddings sit below layer 1 (``lr * layer_decay ** L``); the head and
  the pooler sit on top (``lr``). ALBERT's one shared layer is used at every depth and gets the top rate.
- Early stopping on validation loss, keeping the best epoch's weights; k-fold cross-validation (mean and std)
  with a majority-vote ensemble of the fold models on the test set (GRUBERT).
- Accelerate runs the same loop on CPU, one GPU (bfloat16 autocast where supported) or several GPUs/nodes
  under ``accelerate launch``.
- Shaped like the HF Trainer without its weight: a :class:`TrainState` (step, epoch, history) and a
  :class:`TrainControl` (``should_stop``) are passed to callbacks after every step and epoch.
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

from analysis.heads import HeadOutput, build_head, trainable_parameters
from analysis.options import FinetuneConfig
from analysis.scores import classification_metrics
from analysis.taskdata import TaskData, batches

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

    def metrics(self, labels: list[int], names: list[str], train_labels: list[int] | None = None) -> dict:
        return {"loss": self.loss, **classification_metrics(self.predictions, labels, names, train_labels)}


@torch.no_grad()
def evaluate(model: Classifier, data: TaskData, batch_size: int, pad_id: int, device, keep_vectors: bool = False,
             autocast: bool = False) -> Evaluation:
    model.eval()
    n = len(data)
    preds = np.zeros(n, dtype=np.int64)
    weights, vectors, total, counted, weight_layers = None, None, 0.0, 0, None
    for batch in batches(data, batch_size * 2, pad_id, shuffle=False, by_length=True):
        pos = batch.pop("positions").numpy()
        labels = batch.pop("labels").to(device)
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
            out, cls = model(**{k: v.to(device) for k, v in batch.items()}, return_states=True)
        logits = out.logits.float()
        preds[pos] = logits.argmax(-1).cpu().numpy()
        if (labels >= 0).any():
            total += nn.functional.cross_entropy(logits[labels >= 0], labels[labels >= 0], reduction="sum").item()
            counted += int((labels >= 0).sum())
        if out.layer_weights is not None:
            if weights is None:
                weights, weight_layers = np.zeros((n, out.layer_weights.shape[1]), np.float32), out.layers
            weights[pos] = out.layer_weights.float().cpu().numpy()
        if keep_vectors:
            if vectors is None:
                vectors = np.zeros((cls.shape[0], n, cls.shape[-1]), np.float16)
            vectors[:, pos] = cls.float().cpu().numpy()
    return Evaluation(total / max(counted, 1), preds, weights, weight_layers, vectors)


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
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import get_linear_schedule_with_warmup

    seed_everything(config.seed)
    model = model.float()  # float32 master weights whatever the checkpoint's dtype; bf16 only as autocast
    autocast = device.startswith("cuda") and torch.cuda.is_bf16_supported()
    accelerator = Accelerator(cpu=device == "cpu", mixed_precision="bf16" if autocast else "no")
    steps_per_epoch = math.ceil(math.ceil(len(train_data) / config.batch_size) / accelerator.num_processes)
    total = min(config.max_steps or 10**12, steps_per_epoch * config.epochs)
    optimizer = torch.optim.AdamW(parameter_groups(model, config), lr=config.lr, fused=True)  # one kernel, CPU too
    if config.schedule == "linear":
        scheduler = get_linear_schedule_with_warmup(optimizer, int(config.warmup * total), total)
    else:
        scheduler = LambdaLR(optimizer, lambda step: 0.9 ** (step // steps_per_epoch))
    model, optimizer = accelerator.prepare(model, optimizer)  # the scheduler steps once per step: not prepared
    state, control = TrainState(total_steps=total), TrainControl()
    best_loss, best_state, since_best = float("inf"), None, 0
    start = time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        state.epoch = epoch
        model.train()
        losses = []
        epoch_batches = batches(train_data, config.batch_size, pad_id, shuffle=True, seed=config.seed + epoch,
                                by_length=config.group_by_length)
        for n, batch in enumerate(epoch_batches):
            if n % accelerator.num_processes != accelerator.process_index:
                continue  # under `accelerate launch`, each process takes every n-th batch
            batch.pop("positions")
            labels = batch.pop("labels").to(accelerator.device)
            with accelerator.autocast():
                output: HeadOutput = model(**{k: v.to(accelerator.device) for k, v in batch.items()})
                loss = nn.functional.cross_entropy(output.logits.float(), labels)
            accelerator.backward(loss)
            if config.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state.step += 1
            state.last_loss = loss.item()
            state.lr = max(scheduler.get_last_lr())
            losses.append(state.last_loss)
            for cb in callbacks:
                cb("step", state, control)
            if control.should_stop or state.step >= total:
                break
        unwrapped = accelerator.unwrap_model(model)
        ev = evaluate(unwrapped, val_data, config.batch_size, pad_id, accelerator.device,
                      keep_vectors=config.save_vectors and out is not None, autocast=autocast)
        metrics = ev.metrics(val_data.labels, [str(i) for i in range(unwrapped.num_labels)])
        state.history.append({"epoch": epoch, "step": state.step, "train_loss": float(np.mean(losses or [np.nan])),
                              "val_loss": ev.loss, "val_accuracy": metrics["accuracy"],
                              "val_macro_f1": metrics["macro_f1"], "seconds": round(time.perf_counter() - start, 2)})
        if out is not None and accelerator.is_main_process:
            save_epoch(out / "epochs" / str(epoch), ev, val_data)
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
    """Per-epoch files for the dashboard: ``layer_weights.csv``, ``val_cls.npy`` (float16, (L+1, n, hidden)) and
    ``val_ids.json`` (each row's example id and label id; names in metrics.json's ``labels``)."""
    directory.mkdir(parents=True, exist_ok=True)
    if ev.layer_weights is not None:
        weights_frame(ev, data).to_csv(directory / "layer_weights.csv", index=False)
    if ev.cls_vectors is not None:
        np.save(directory / "val_cls.npy", ev.cls_vectors)
        (directory / "val_ids.json").write_text(json.dumps({"example_id": list(map(int, data.ids)),
                                                            "label": list(map(int, data.labels))}))


def weights_frame(ev: Evaluation, data: TaskData):
    import pandas as pd

    frame = pd.DataFrame(ev.layer_weights, columns=[f"layer_{i}" for i in ev.weight_layers])
    frame.insert(0, "example_id", list(data.ids))
    return frame
