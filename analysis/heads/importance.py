"""Head importance and pruning, Michel et al. 2019 ("Are Sixteen Heads Really Better than One?").

- **Importance** (§4.1, Eq. 2): each head's output is multiplied by a gate ``xi_h`` (all ones;
  :func:`analysis.heads.model.head_gates`) and ``I_h = E_x |dL(x)/dxi_h|``: the absolute value of each example's
  gradient, then the mean over the examples (the paper's order; the absolute value of the mean gradient,
  ``|E_x dL(x)/dxi_h|``, lets examples cancel and ranks heads differently). An example ``x`` is a text and
  ``L(x)`` its mean MLM loss over its masked tokens, or a labelled example and its classifier's cross-entropy.
  Per-example gradients come from one backward per batch (each example gated by its own gates:
  :func:`example_gradients`); a test checks them against a plain loop of one backward per example and a
  central finite difference. ``normalized`` divides each layer's scores by their l2 norm (§4.1, "we normalize
  the importance scores by layer (using the l2 norm)", after Molchanov et al. 2017). Each score has a 95%
  Student t interval over the examples, and ``run.json`` the split-half Spearman of the ranking.
- **Pruning curve** (§4.2, Fig. 3): heads masked (``xi_h = 0``) in increasing normalised importance, at
  ``steps + 1`` evenly spaced shares of all heads (0% ... 100%), against 3 seeded random orders; the score is the
  classifier's accuracy, or the MLM token accuracy at the masked positions.
- **Prunable share per layer** (after §3.2, where all heads of a layer but one are removed): within each layer
  alone, its heads masked in increasing importance until the score drops by more than ``drop`` (1 point), the
  share of its heads masked before that.

MLM masking here is deterministic and plain: ``mask_prob`` of each text's non-special tokens (at least one),
chosen with a seeded generator, all replaced by the mask token (BERT's 80/10/10 replacement is a training-time
device; importance and accuracy are read at [MASK] inputs). The same masked inputs serve every score.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from analysis.core.activations import check_finite, encode, max_input_length
from analysis.core.inputs import InputError, TextInputs
from analysis.core.vectors import Progress
from analysis.heads.model import head_gates, head_shape
from analysis.heads.resume import ResumeFile, require
from analysis.heads.run import Stopped
from analysis.heads.stats import t_interval
from models.loading import LoadedModel

SEEDS = (0, 1, 2)
log = logging.getLogger(__name__)


@dataclasses.dataclass
class LossBatch:
    """Model inputs ``(batch, seq)`` and targets: ``(batch, seq)`` token ids with -100 where not scored (MLM) or
    ``(batch,)`` class ids."""

    inputs: dict
    labels: torch.Tensor


@dataclasses.dataclass
class ImportanceResult:
    """``importance`` (importance.csv: layer, head, importance, normalized, order, layer_prunable_share),
    ``pruning`` (pruning.csv: order, seed, fraction, masked, accuracy), ``layers`` (layer, heads,
    prunable_heads, prunable_share, base_accuracy), ``info``."""

    importance: pd.DataFrame
    pruning: pd.DataFrame
    layers: pd.DataFrame
    info: dict


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), value, dtype=torch.long)
    for b, r in enumerate(rows):
        out[b, :len(r)] = torch.tensor(r)
    return out


def _batched(ids: list[list[int]], types: list[list[int]] | None, pad: int, batch_size: int):
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        inputs = {"input_ids": _pad([ids[i] for i in idx], pad),
                  "attention_mask": _pad([[1] * len(ids[i]) for i in idx], 0)}
        if types is not None:
            inputs["token_type_ids"] = _pad([types[i] for i in idx], 0)
        yield idx, inputs


def mlm_batches(loaded: LoadedModel, texts: TextInputs, batch_size: int = 16, mask_prob: float = 0.15,
                seed: int = 0) -> list[LossBatch]:
    """``texts`` tokenised (cut at the model's limit), ``mask_prob`` of each text's non-special tokens masked
    (seeded; at least one per text)."""
    tokenizer = loaded.tokenizer
    if tokenizer.mask_token_id is None:
        raise InputError(f"'{loaded.spec.name}' has no mask token: the MLM loss needs one")
    if not len(texts):
        raise InputError("the corpus is empty: no text to read")
    encoded = encode(tokenizer, texts, max_input_length(loaded))
    special = set(tokenizer.all_special_ids)
    rng = np.random.default_rng(seed)
    ids, labels, kept = [], [], []
    for r, row in enumerate(encoded.input_ids):
        candidates = [t for t, i in enumerate(row) if i not in special]
        if not candidates:
            continue
        k = max(1, int(round(mask_prob * len(candidates))))
        chosen = set(rng.choice(candidates, k, replace=False).tolist())
        ids.append([tokenizer.mask_token_id if t in chosen else i for t, i in enumerate(row)])
        labels.append([i if t in chosen else -100 for t, i in enumerate(row)])
        kept.append(r)
    if not ids:
        raise InputError("the corpus is empty: no text has a token to mask")
    types = encoded.token_type_ids
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return [LossBatch(inputs, _pad([labels[i] for i in idx], -100))
            for idx, inputs in _batched(ids, [types[r] for r in kept] if types else None, pad, batch_size)]


def classifier_labels(model: nn.Module, name: str = "the classifier") -> dict[str, int]:
    """A sequence classifier's classes (``config.label2id``); a checkpoint without a classification head or
    labels is an :class:`InputError`."""
    config = model.config
    architectures = getattr(config, "architectures", None) or []
    label2id = getattr(config, "label2id", None) or {}
    if not any(a.endswith("ForSequenceClassification") for a in architectures) and not hasattr(model, "classifier"):
        raise InputError(f"{name} has no sequence-classification head: its loss needs one (a fine-tuned "
                         "classifier), or give texts for the MLM loss instead")
    if not label2id:
        raise InputError(f"{name} has no labels (config.label2id is empty): cannot score a labelled set")
    return {str(k): int(v) for k, v in label2id.items()}


def classifier_batches(tokenizer, data: TextInputs, label2id: dict[str, int], max_length: int,
                       batch_size: int = 16, truncation: str = "head") -> list[LossBatch]:
    """A labelled set tokenised (pairs kept, cut at ``max_length``) with its class ids; a label the classifier
    does not have is an :class:`InputError`."""
    if not len(data):
        raise InputError("the labelled set is empty")
    if data.labels is None:
        raise InputError("the data has no labels: head importance for a classifier needs a labelled set")
    unknown = sorted(set(data.labels) - set(label2id))
    if unknown:
        raise InputError(f"labels {', '.join(unknown[:5])} are not among the classifier's labels "
                         f"({', '.join(label2id)})")
    encoded = encode(tokenizer, data, max_length, truncation)  # as the classifier was trained
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return [LossBatch(inputs, torch.tensor([label2id[data.labels[i]] for i in idx]))
            for idx, inputs in _batched(encoded.input_ids, encoded.token_type_ids, pad, batch_size)]


def _logits(model: nn.Module, batch: LossBatch) -> torch.Tensor:
    out = model(**batch.inputs)
    return out.logits if hasattr(out, "logits") else out


def _scored(model: nn.Module, batch: LossBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(summed loss, correct predictions, scored targets)`` of one batch."""
    flat, target = _flat(model, batch)
    loss = nn.functional.cross_entropy(flat, target, ignore_index=-100, reduction="sum")
    scored = target != -100
    correct = (flat.argmax(-1) == target)[scored].sum()
    return loss, correct, int(scored.sum())


def _flat(model: nn.Module, batch: LossBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits (targets, classes) in at least float32, target ids (targets,))`` of one batch."""
    logits = _logits(model, batch)
    flat = logits.reshape(-1, logits.shape[-1])
    return flat.to(torch.promote_types(flat.dtype, torch.float32)), batch.labels.reshape(-1)  # bf16/fp16 in fp32


def owners(batch: LossBatch) -> torch.Tensor:
    """``(targets,)``: the example (row of the batch) each target of :func:`_flat` belongs to: a token of an MLM
    batch ``(batch, seq)`` labels; a masked row of :class:`ScoredLogits` (its ``scored`` input); a class label."""
    rows = len(batch.inputs["input_ids"])
    if batch.labels.dim() == 2:
        return torch.arange(rows).repeat_interleave(batch.labels.shape[1])
    if "scored" in batch.inputs:
        return batch.inputs["scored"].nonzero()[:, 0]
    return torch.arange(rows)


def example_losses_scored(batch: LossBatch) -> torch.Tensor:
    """``(batch,)`` bool: the examples of ``batch`` with a scored target (those :func:`example_gradients` keeps)."""
    rows = len(batch.inputs["input_ids"])
    scored = (batch.labels.reshape(-1) != -100).long()
    return torch.zeros(rows, dtype=torch.long).index_add(0, owners(batch), scored) > 0


def example_losses(model: nn.Module, batch: LossBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L(x) per example (batch,), which examples have a scored target (batch,))``: an example's loss is the
    mean cross-entropy over its own scored targets (its masked tokens; a classifier: its one label)."""
    flat, target = _flat(model, batch)
    each = nn.functional.cross_entropy(flat, target, ignore_index=-100, reduction="none")
    owner, scored = owners(batch).to(each.device), (target != -100).to(each.dtype)
    rows = len(batch.inputs["input_ids"])
    total = torch.zeros(rows, dtype=each.dtype, device=each.device).index_add(0, owner, each * scored)
    counts = torch.zeros(rows, dtype=each.dtype, device=each.device).index_add(0, owner, scored)
    return total / counts.clamp(min=1), counts > 0


def example_gradients(model: nn.Module, batches: Sequence[LossBatch], encoder: nn.Module | None = None,
                      progress: Progress | None = None) -> np.ndarray:
    """``(examples, layers, heads)`` float64: ``dL(x)/dxi_h`` at ``xi = 1`` for every example ``x`` with a scored
    target (Michel et al. 2019 Eq. 2 before the absolute value; :func:`example_losses` gives ``L(x)``), in the
    order of ``batches``. One backward per batch: each example has its own gates (:func:`head_gates` with
    ``(batch, layers, heads)`` gates), and the sum of the examples' losses has, as its gradient with respect to
    an example's gates, that example's own gradient. ``encoder``: the model holding the attention layers
    (default ``model``). A loss that is not finite is refused naming the first layer that is not."""
    encoder = encoder or model
    shape = head_shape(encoder)
    dtype = torch.promote_types(next(encoder.parameters()).dtype, torch.float32)
    found = []
    with torch.enable_grad():
        for k, batch in enumerate(batches):
            gates = torch.ones((len(batch.inputs["input_ids"]), *shape), dtype=dtype, requires_grad=True)
            with head_gates(encoder, gates):
                losses, scored = example_losses(model, batch)
                total = losses[scored].sum()
                if not bool(torch.isfinite(total)):
                    refuse_nonfinite(encoder, batch)
                total.backward()
            found.append(gates.grad[scored.cpu()].double().numpy())
            if progress is not None:
                progress("importance", k + 1, len(batches))
    return np.concatenate(found) if found else np.zeros((0, *shape))


def refuse_nonfinite(encoder: nn.Module, batch: LossBatch) -> None:
    """A loss that is not finite: the :class:`InputError` of the core's one check naming the first hidden state
    that is not (:func:`analysis.core.activations.check_finite`), or one saying the loss itself is not."""
    inputs = {k: v for k, v in batch.inputs.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        states = encoder.base_model(**inputs, output_hidden_states=True, return_dict=True).hidden_states
    mask = inputs.get("attention_mask")
    check_finite(states, [f"hidden state {k}" for k in range(len(states))],
                 None if mask is None else mask.bool()[..., None])
    raise InputError("the loss is not finite although every hidden state is (the output head overflows in "
                     f"{str(next(encoder.parameters()).dtype).removeprefix('torch.')}): load the model in float32")


def importance_intervals(per_example: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(importance, low, high)`` per head from ``(examples, layers, heads)`` gradients: Eq. 2's mean of the
    absolute values and its 95% Student t interval over the examples (NaN bounds under two examples). The
    examples are drawn independently and so are their masks (one seeded draw per text), so the interval covers
    the variation of both the texts and the masking."""
    values = np.abs(per_example)
    return t_interval(values.sum(0), (values * values).sum(0), np.full(values.shape[1:], len(values)))


def split_half_spearman(per_example: np.ndarray) -> float:
    """The Spearman correlation between the head rankings (normalised importance) of the even and the odd
    examples: how stable the ranking is on this many examples (NaN under four examples)."""
    from scipy.stats import spearmanr

    if len(per_example) < 4:
        return float("nan")
    halves = [normalise(np.abs(per_example[start::2]).mean(0)).ravel() for start in (0, 1)]
    return float(spearmanr(*halves).statistic)


@torch.no_grad()
def mean_loss(model: nn.Module, batches: Sequence[LossBatch], gates: torch.Tensor,
              encoder: nn.Module | None = None) -> tuple[float, float]:
    """``(mean loss, accuracy)`` over the scored targets of ``batches`` with heads gated by ``gates``."""
    loss = correct = total = 0.0
    with head_gates(encoder or model, gates):
        for batch in batches:
            batch_loss, batch_correct, n = _scored(model, batch)
            loss, correct, total = loss + float(batch_loss), correct + float(batch_correct), total + n
    return loss / max(total, 1), correct / max(total, 1)


def pruning_passes(layers: int, heads: int, steps: int = 10, orders: int = 3) -> tuple[int, int]:
    """(fewest, most) passes over the data :func:`head_importance` makes, each a forward pass (the importance
    pass's backward counted as two more): the gradient (3), each distinct set of masked heads of the curve (every
    order shares 0% and 100%), and each layer's prunable share, from one set per layer (its first head costs the
    point) to every head of every layer (counted once where the curve scored the same set)."""
    n_heads = layers * heads
    counts = sorted({int(round(f * n_heads)) for f in np.linspace(0, 1, steps + 1)})
    curve = (1 + orders) * len(counts) - orders * (0 in counts) - orders * (n_heads in counts and n_heads > 0)
    return 3 + curve + layers, 3 + curve + n_heads


def normalise(importance: np.ndarray) -> np.ndarray:
    """Michel §4.1: each layer's scores divided by their l2 norm (a layer of zeros stays zero)."""
    norm = np.linalg.norm(importance, axis=1, keepdims=True)
    return importance / np.where(norm > 0, norm, 1)


class Scores(ResumeFile):
    """What an importance run has computed (the per-example gate gradients; each scored set of masked heads and its
    accuracy), kept in a JSON file (``path``, None: in memory only) rewritten whole after each of them, so that the
    same run started again after a stop or a cancel goes on from there. JSON writes a float's shortest repr, which
    reads back as the same float: a resumed run gives the numbers of a run never stopped.

    :meth:`load` checks what it reads (:mod:`analysis.heads.resume`): the size before reading, the gradients'
    shape, finiteness and the first batch's values recomputed, each set's heads and its accuracy a fraction of
    the scored targets in [0, 1]."""

    def __init__(self, path: Path | None):
        super().__init__(path)
        self.gradient, self.measured, self.resumed = None, {}, 0

    def load(self, shape: tuple[int, int, int], targets: int, sets: int,
             first: Callable[[], np.ndarray]) -> None:
        """Read the file of a run of ``shape`` (examples, layers, heads) gradients, ``targets`` scored targets and
        at most ``sets`` sets of masked heads; ``first()``: the first batch's gradients, computed afresh."""
        n_heads = shape[1] * shape[2]
        max_bytes = (1 << 16) + 32 * int(np.prod(shape)) + sets * (8 * n_heads + 40)

        def parse(f) -> tuple[np.ndarray | None, dict]:
            saved = json.loads(f.read())
            require(isinstance(saved, dict) and set(saved) == {"gradient", "measured"}, "not a scores file")
            gradient = None
            if saved["gradient"] is not None:
                gradient = np.array(saved["gradient"], dtype=np.float64)
                require(gradient.shape == shape, f"gradients of shape {gradient.shape}, the run's are {shape}")
                require(bool(np.isfinite(gradient).all()), "gradients not finite")
                fresh = first()
                require(np.allclose(gradient[:len(fresh)], fresh, rtol=1e-5, atol=1e-9),
                        "gradients differ from the first batch's recomputed")
            measured = {}
            require(isinstance(saved["measured"], list) and len(saved["measured"]) <= sets, "too many sets")
            for heads, accuracy in saved["measured"]:
                require(all(isinstance(h, int) and 0 <= h < n_heads for h in heads) and len(set(heads)) == len(heads),
                        "heads out of range")
                accuracy = float(accuracy)
                correct = accuracy * targets
                require(0 <= accuracy <= 1 and abs(correct - round(correct)) < 1e-6,
                        f"accuracy {accuracy} is not a count of {targets} targets")
                measured[frozenset(heads)] = accuracy
            return gradient, measured

        read = self.read(parse, max_bytes)
        if read is not None:
            self.gradient, self.measured = read
        self.resumed = len(self.measured) + (self.gradient is not None)

    def save(self) -> None:
        if self.path is None:  # in memory only: nothing to serialise
            return
        state = {"gradient": None if self.gradient is None else self.gradient.tolist(),
                 "measured": [[sorted(k), v] for k, v in self.measured.items()]}
        self.write(lambda tmp: tmp.write_text(json.dumps(state)))


def head_importance(model: nn.Module, batches: Sequence[LossBatch], *, encoder: nn.Module | None = None,
                    steps: int = 10, seeds: Sequence[int] = SEEDS, drop: float = 0.01,
                    progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
                    checkpoint: Path | None = None) -> ImportanceResult:
    """Importance, the pruning curve (importance order against ``seeds`` random orders) and each layer's
    prunable share, for ``model`` scored on ``batches`` (:func:`mlm_batches` or :func:`classifier_batches`).
    ``checkpoint``: a file (:class:`Scores`) that keeps what was computed, for a stopped run to go on from;
    removed once the run completes. The caller keys it by everything that changes the numbers."""
    if not batches:
        raise InputError("the corpus is empty: nothing to score")
    encoder = encoder or model
    layers, heads = head_shape(encoder)
    n_heads = layers * heads
    counts = sorted({int(round(f * n_heads)) for f in np.linspace(0, 1, steps + 1)})
    scores = Scores(checkpoint)
    targets = int(sum(int((b.labels != -100).sum()) for b in batches))
    examples = sum(int(example_losses_scored(b).sum()) for b in batches)
    scores.load((examples, layers, heads), targets, (1 + len(seeds)) * len(counts) + n_heads,
                lambda: example_gradients(model, batches[:1], encoder))

    def check():
        if should_stop is not None and should_stop():
            raise Stopped("stopped")

    if scores.gradient is None:
        scores.gradient = example_gradients(model, batches, encoder, progress)
        scores.save()
    raw, low, high = importance_intervals(scores.gradient)
    normed = normalise(raw)
    order = np.argsort(normed.ravel(), kind="stable")  # least important first
    orders = [("importance", None, order)] + [("random", s, np.random.default_rng(s).permutation(n_heads))
                                               for s in seeds]
    measured = scores.measured  # masked heads -> accuracy: each set of masked heads is scored once

    def accuracy_without(masked_heads) -> float:
        key = frozenset(int(h) for h in masked_heads)
        if key not in measured:  # e.g. 0% and 100% masked are the same for every order
            gates = torch.ones(n_heads)
            gates[torch.as_tensor(sorted(key), dtype=torch.long)] = 0
            measured[key] = mean_loss(model, batches, gates.view(layers, heads), encoder)[1]
            scores.save()
        return measured[key]

    rows, work, done = [], len(orders) * len(counts), 0
    for name, seed, sequence in orders:
        for masked in counts:
            check()
            accuracy = accuracy_without(sequence[:masked])
            rows.append({"order": name, "seed": seed, "fraction": masked / n_heads, "masked": masked,
                         "accuracy": accuracy})
            done += 1
            if progress is not None:
                progress("pruning", done, work)
    pruning = pd.DataFrame(rows, columns=["order", "seed", "fraction", "masked", "accuracy"])
    pruning["seed"] = pruning["seed"].astype("Int64")
    base = float(pruning.loc[(pruning.order == "importance") & (pruning.masked == 0), "accuracy"].iloc[0])
    layer_rows = []
    for layer in range(layers):
        check()
        prunable, gone = 0, []
        for head in np.argsort(normed[layer], kind="stable"):
            gone.append(layer * heads + int(head))
            accuracy = accuracy_without(gone)
            if accuracy < base - drop - 1e-12:
                break
            prunable += 1
        layer_rows.append({"layer": layer + 1, "heads": heads, "prunable_heads": prunable,
                           "prunable_share": prunable / heads, "base_accuracy": base})
        if progress is not None:
            progress("layers", layer + 1, layers)
    layer_table = pd.DataFrame(layer_rows)
    rank = np.empty(n_heads, int)
    rank[order] = np.arange(n_heads)
    layer_index, head_index = np.divmod(np.arange(n_heads), heads)
    table = pd.DataFrame({"layer": layer_index + 1, "head": head_index, "importance": raw.ravel(),
                          "importance_low": low.ravel(), "importance_high": high.ravel(),
                          "normalized": normed.ravel(), "order": rank,
                          "layer_prunable_share": layer_table["prunable_share"].to_numpy()[layer_index]})
    scores.remove()
    info = {"layers": layers, "heads": heads, "targets": targets,
            **({"resumed_after": scores.resumed} if scores.resumed else {}),
            "base_accuracy": base, "drop": drop, "seeds": list(seeds), "steps": steps,
            "examples": int(len(scores.gradient)), "split_half_spearman": split_half_spearman(scores.gradient),
            "importance": "Michel et al. 2019 Eq. 2: I_h = E_x |dL(x)/dxi_h|, the absolute value per example x (a "
                          "text; L(x) its mean loss over its masked tokens, or its classification loss), "
                          "normalised per layer by the l2 norm (§4.1); importance_low/high: 95% Student t "
                          "interval over the examples"}
    return ImportanceResult(table, pruning, layer_table, info)


def classifier_importance(model: nn.Module, tokenizer, labels: Sequence[str], data: TextInputs, *,
                          encoder: nn.Module | None = None, max_length: int = 512, truncation: str = "head",
                          batch_size: int = 16, **options) -> ImportanceResult:
    """:func:`head_importance` of a classifier already loaded (``model(**inputs)`` gives logits over ``labels``, in
    that order; ``encoder``: its encoder, whose heads are gated) on the labelled set ``data``, tokenised as it was
    trained (``max_length``, ``truncation``). A fine-tuning job's classifier is
    :func:`analysis.training.finetune.load_checkpoint`'s (the CLI's and the page's ``job:N``)."""
    batches = classifier_batches(tokenizer, data, {str(name): i for i, name in enumerate(labels)}, max_length,
                                 batch_size, truncation)
    return head_importance(model, batches, encoder=encoder, **options)


class ScoredLogits(nn.Module):
    """The MLM's logits at the scored (masked) positions only, all Michel et al.'s loss reads: the encoder's last
    state at those rows through the model's MLM head (``anatomy.head``, which equals the model's own logits:
    tested per family). The vocabulary product, the largest matrix of a small model, then runs on the ~15% of
    the positions that are scored instead of all of them."""

    def __init__(self, loaded: LoadedModel):
        super().__init__()
        self.model, self.head = loaded.model, loaded.anatomy.head

    def forward(self, scored: torch.Tensor, **inputs) -> torch.Tensor:
        return self.head(self.model.base_model(**inputs).last_hidden_state[scored])


def mlm_importance(loaded: LoadedModel, texts: TextInputs, *, batch_size: int = 16, mask_prob: float = 0.15,
                   seed: int = 0, **options) -> ImportanceResult:
    """:func:`head_importance` for the MLM loss of ``loaded`` (its own MLM head) on ``texts``, the head read at
    the masked positions only (:class:`ScoredLogits`)."""
    return head_importance(*scored_mlm(loaded, texts, batch_size, mask_prob, seed), encoder=loaded.model, **options)


def scored_mlm(loaded: LoadedModel, texts: TextInputs, batch_size: int = 16, mask_prob: float = 0.15,
               seed: int = 0) -> tuple[ScoredLogits, list[LossBatch]]:
    """What :func:`mlm_importance` scores: :class:`ScoredLogits` and :func:`mlm_batches` whose targets are the
    masked positions' ids (one row each), the positions passed as the input ``scored``."""
    if loaded.mlm_head is None:
        raise InputError(f"'{loaded.spec.name}' has no MLM head: give a labelled set and a classifier instead")
    batches = [LossBatch({**b.inputs, "scored": b.labels != -100}, b.labels[b.labels != -100])
               for b in mlm_batches(loaded, texts, batch_size, mask_prob, seed)]
    return ScoredLogits(loaded), batches
