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
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from analysis.core.activations import check_finite
from analysis.core.inputs import InputError, TextInputs
from analysis.core.vectors import Progress
from analysis.heads.batches import LossBatch, classifier_batches, mlm_batches
from analysis.heads.model import head_gates, head_shape
from analysis.heads.resume import ResumeFile, require
from analysis.heads.run import Stopped
from analysis.heads.stats import t_interval
from models.loading import LoadedModel

SEEDS = (0, 1, 2)
log = logging.getLogger(__name__)


@dataclasses.dataclass
class ImportanceResult:
    """``importance`` (importance.csv: layer, head, importance, normalized, order, layer_prunable_share),
    ``pruning`` (pruning.csv: order, seed, fraction, masked, accuracy), ``layers`` (layer, heads,
    prunable_heads, prunable_share, base_accuracy), ``info``."""

    importance: pd.DataFrame
    pruning: pd.DataFrame
    layers: pd.DataFrame
    info: dict


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


@dataclasses.dataclass
class GateSums:
    """What Eq. 2 and its intervals need from the per-example gradients, of a size that does not grow with the
    examples (a resume file rewritten after every pass stays small): per head the sum of ``|g|``, of ``g^2``, and of
    ``|g|`` over the even and the odd examples, ``(4, layers, heads)``; the examples counted; and the first batch's
    per-example gradients, recomputed to check a resume file (:class:`Scores`)."""

    sums: np.ndarray
    examples: int
    first: np.ndarray

    @classmethod
    def of(cls, per_example: np.ndarray, first: int) -> GateSums:
        """From ``(examples, layers, heads)`` gradients, the first ``first`` of them the first batch's."""
        a = np.abs(per_example)
        sums = np.stack([a.sum(0), (per_example * per_example).sum(0), a[0::2].sum(0), a[1::2].sum(0)])
        return cls(sums, len(per_example), per_example[:first].copy())

    def intervals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(importance, low, high)`` per head: Eq. 2's mean of the absolute values and its 95% Student t interval
        over the examples (NaN bounds under two examples). The examples are drawn independently and so are their
        masks (one seeded draw per text), so the interval covers the variation of both the texts and the
        masking."""
        return t_interval(self.sums[0], self.sums[1], np.full(self.sums.shape[1:], self.examples))

    def split_half_spearman(self) -> float:
        """The Spearman correlation between the head rankings (normalised importance) of the even and the odd
        examples, counted in the order the batches ran them (length-sorted, not the input's order: each half holds
        texts of every length): how stable the ranking is on this many examples (NaN under four examples)."""
        from scipy.stats import spearmanr

        if self.examples < 4:
            return float("nan")
        return float(spearmanr(normalise(self.sums[2]).ravel(), normalise(self.sums[3]).ravel()).statistic)


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


def curve_points(n_heads: int, steps: int) -> list[int]:
    """The pruning curve's numbers of masked heads: ``steps + 1`` evenly spaced shares of all heads, rounded,
    each once (0% ... 100%)."""
    return sorted({int(round(f * n_heads)) for f in np.linspace(0, 1, steps + 1)})


def drop_resolution(base: float, targets: int, drop: float) -> dict:
    """Whether the allowed ``drop`` is one these ``targets`` resolve: the binomial standard error of an accuracy of
    ``base`` on ``targets`` scored targets, ``sqrt(p (1 - p) / n)``, against the drop. A drop under two standard
    errors is within the noise of one accuracy, so a layer's prunable share is too (issue 53 item 12: a 1-point
    drop where the standard error was 2.2 points); ``prunable_note`` says so in words."""
    se = math.sqrt(base * (1 - base) / targets) if targets else float("nan")
    resolved = bool(targets) and drop >= 2 * se
    note = (f"the allowed drop ({drop:.1%}) is at least two standard errors of the accuracy ({se:.1%} on "
            f"{targets:,} targets)" if resolved else
            f"the allowed drop ({drop:.1%}) is less than two standard errors of the accuracy ({se:.1%} on "
            f"{targets:,} targets): a layer's prunable share is within noise; score more texts, or allow a drop of "
            f"at least {2 * se:.1%} (the CLI's --drop)")
    return {"accuracy_se": se, "drop_resolved": resolved, "prunable_note": note}


def pruning_passes(layers: int, heads: int, steps: int = 10, orders: int = 3) -> tuple[int, int]:
    """(fewest, most) passes over the data :func:`head_importance` makes, each a forward pass (the importance
    pass's backward counted as two more): the gradient (3), each distinct set of masked heads of the curve (every
    order shares 0% and 100%), and each layer's prunable share, from one set per layer (its first head costs the
    point) to every head of every layer (counted once where the curve scored the same set)."""
    n_heads = layers * heads
    counts = curve_points(n_heads, steps)
    curve = (1 + orders) * len(counts) - orders * (0 in counts) - orders * (n_heads in counts and n_heads > 0)
    return 3 + curve + layers, 3 + curve + n_heads


def normalise(importance: np.ndarray) -> np.ndarray:
    """Michel §4.1: each layer's scores divided by their l2 norm (a layer of zeros stays zero)."""
    norm = np.linalg.norm(importance, axis=1, keepdims=True)
    return importance / np.where(norm > 0, norm, 1)


class Scores(ResumeFile):
    """What an importance run has computed (the gate gradients' sums, :class:`GateSums`; each scored set of masked
    heads and its accuracy), kept in a JSON file (``path``, None: in memory only) rewritten whole after each of
    them, so that the same run started again after a stop or a cancel goes on from there. JSON writes a float's
    shortest repr, which reads back as the same float: a resumed run gives the numbers of a run never stopped.

    :meth:`load` checks what it reads (:mod:`analysis.heads.resume`): the size before reading; the sums' shape,
    finiteness and signs, the examples counted, the first batch's gradients recomputed and equal, the sums
    consistent with each other (Cauchy-Schwarz: ``(sum |g|)^2 <= n sum g^2``, the halves adding up); each set's
    heads, and its accuracy a count of the scored targets in [0, 1]."""

    def __init__(self, path: Path | None):
        super().__init__(path)
        self.gradient: GateSums | None = None
        self.measured, self.resumed = {}, 0

    def load(self, shape: tuple[int, int, int], first_examples: int, targets: int, sets: int,
             first: Callable[[], np.ndarray]) -> None:
        """Read the file of a run of ``shape`` (examples, layers, heads), ``first_examples`` in its first batch,
        ``targets`` scored targets and at most ``sets`` sets of masked heads; ``first()``: the first batch's
        gradients, computed afresh."""
        examples, layers, heads = shape
        n_heads = layers * heads
        max_bytes = (1 << 16) + 32 * (4 + first_examples) * n_heads + sets * (8 * n_heads + 40)

        def parse(f) -> tuple[GateSums | None, dict]:
            saved = json.loads(f.read())
            require(isinstance(saved, dict) and set(saved) == {"gradient", "measured"}, "not a scores file")
            gradient = None
            if saved["gradient"] is not None:
                g = saved["gradient"]
                require(isinstance(g, dict) and set(g) == {"sums", "examples", "first"}, "not gradient sums")
                sums, stored = np.array(g["sums"], dtype=np.float64), np.array(g["first"], dtype=np.float64)
                require(sums.shape == (4, layers, heads) and stored.shape == (first_examples, layers, heads),
                        f"sums of shape {sums.shape}, first batch {stored.shape}: not the run's")
                require(g["examples"] == examples, f"{g['examples']} examples, the run has {examples}")
                require(bool(np.isfinite(sums).all() and np.isfinite(stored).all() and (sums >= 0).all()),
                        "sums not finite or negative")
                require(bool((sums[0] ** 2 <= examples * sums[1] * (1 + 1e-9) + 1e-300).all())
                        and np.allclose(sums[2] + sums[3], sums[0], rtol=1e-9, atol=1e-300),
                        "sums inconsistent with each other")
                require(np.allclose(stored, first(), rtol=1e-5, atol=1e-9),
                        "gradients differ from the first batch's recomputed")
                gradient = GateSums(sums, examples, stored)
            measured = {}
            require(isinstance(saved["measured"], list) and len(saved["measured"]) <= sets, "too many sets")
            for chosen, accuracy in saved["measured"]:
                require(all(isinstance(h, int) and 0 <= h < n_heads for h in chosen)
                        and len(set(chosen)) == len(chosen), "heads out of range")
                accuracy = float(accuracy)
                correct = accuracy * targets
                require(0 <= accuracy <= 1 and abs(correct - round(correct)) < 1e-6,
                        f"accuracy {accuracy} is not a count of {targets} targets")
                measured[frozenset(chosen)] = accuracy
            return gradient, measured

        read = self.read(parse, max_bytes)
        if read is not None:
            self.gradient, self.measured = read
        self.resumed = len(self.measured) + (self.gradient is not None)

    def save(self) -> None:
        if self.path is None:  # in memory only: nothing to serialise
            return
        g = self.gradient
        state = {"gradient": None if g is None else {"sums": g.sums.tolist(), "examples": g.examples,
                                                     "first": g.first.tolist()},
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
    counts = curve_points(n_heads, steps)
    scores = Scores(checkpoint)
    targets = int(sum(int((b.labels != -100).sum()) for b in batches))
    per_batch = [int(example_losses_scored(b).sum()) for b in batches]  # the examples each batch scores
    scores.load((sum(per_batch), layers, heads), per_batch[0], targets, (1 + len(seeds)) * len(counts) + n_heads,
                lambda: example_gradients(model, batches[:1], encoder))

    def check():
        if should_stop is not None and should_stop():
            raise Stopped("stopped")

    if scores.gradient is None:
        scores.gradient = GateSums.of(example_gradients(model, batches, encoder, progress), per_batch[0])
        scores.save()
    raw, low, high = scores.gradient.intervals()
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
            "base_accuracy": base, "drop": drop, **drop_resolution(base, targets, drop), "seeds": list(seeds),
            "steps": steps,
            "examples": scores.gradient.examples, "split_half_spearman": scores.gradient.split_half_spearman(),
            "split_half": "the Spearman correlation of the head rankings of the even and the odd examples in the "
                          "order the batches ran them (sorted by length), not in the input's order",
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
