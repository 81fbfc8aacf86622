"""Reconstruction probing (Kao et al. 2020, §2): every layer's hidden states through the model's own MLM head.

Definitions (pinned by tests):
- layers are ``0..L`` as in Hugging Face ``hidden_states`` (0 = embedding output);
- the prediction of layer ``l`` at a position is ``argmax(head(hidden_states[l]))`` there;
- with ``half="attention"`` (issue 36) each layer ``l >= 1`` is also read at its attention half, the residual
  stream after its attention block and before its feed-forward block (:func:`analysis.core.activations.
  attention_halves`), through the same head: the tables gain a ``half`` column (``attention`` or ``output``) and
  each layer has two rows, its attention half first;
- a position is *counted* when its attention mask is 1 and its input id is not a special token
  (``include_special`` counts special tokens too);
- token accuracy of a layer is correct counted positions / counted positions (micro); the sentence mean is the
  mean of per-sentence accuracies, with a 95% percentile-bootstrap interval over sentences (:data:`INTERVAL`).

Modes: ``unmasked`` (the paper's: the input as is) and ``masked`` (every counted position is masked exactly
once, in non-overlapping random groups of ``mask_fraction`` of a text's counted positions, seeded per text,
one forward pass per group), which measures each layer's real masked-LM accuracy.

The head is applied only to counted positions, gathered without padding, a bounded number of rows at a time
(``ProbeConfig.logits_budget_bytes``), so memory never grows with texts x layers x vocabulary.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from analysis.core.activations import (
    counted_on_host,
    encode,
    finite_flag,
    hidden_states,
    make_batch,
    max_input_length,
    state_labels,
)
from analysis.core.inputs import InputError, TextInputs
from analysis.core.memory import release_freed_memory
from analysis.core.parallel import ONE, Ranks
from analysis.core.precision import describe, dtype_of, head_product
from analysis.core.scores import bootstrap_counts
from analysis.core.transfer import to_device, to_host
from analysis.core.vectors import batch_plan, run_plan
from analysis.probe.certified import Certified, CertifiedHead
from analysis.probe.decoding import decode_rows
from analysis.probe.options import ProbeConfig
from analysis.probe.rowstats import row_stats
from analysis.probe.token_sink import TokenSink
from models.loading import LoadedModel

LAYER_COLUMNS = ["layer", "tokens", "correct", "accuracy", "sentence_mean", "ci_low", "ci_high"]
DIVERGENCE_COLUMNS = ["kl_to_final", "agreement"]  # with a lens (or divergence=True)


class Stopped(Exception):
    """The caller asked the probe to stop."""


@dataclasses.dataclass
class ProbeResult:
    """What a probe run produced. ``layers`` has :data:`LAYER_COLUMNS`; ``decoded`` has
    ``text_id, layer, text``; ``sentence_accuracy`` is ``(texts, L + 1)`` (NaN where a text has no counted
    token); ``tokens`` is the per-token table, or None when it was streamed to disk only."""

    model: str
    config: ProbeConfig
    layers: pd.DataFrame
    decoded: pd.DataFrame
    sentence_accuracy: np.ndarray
    tokens: pd.DataFrame | None
    n_texts: int
    truncated: int
    max_length: int
    seconds: float
    layer_names: list[str]
    precision: dict = dataclasses.field(default_factory=dict)  # analysis.core.precision.describe: what ran in what

    def __post_init__(self):
        assert [c for c in self.layers.columns if c != "half"][:len(LAYER_COLUMNS)] == LAYER_COLUMNS
        assert self.sentence_accuracy.shape == (self.n_texts, len(self.layers))

    def run_info(self) -> dict:
        return {"model": self.model, "options": self.config.to_dict(), "texts": self.n_texts,
                "truncated": self.truncated, "max_length": self.max_length, "seconds": round(self.seconds, 3),
                "precision": self.precision}


# --- scoring ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Scores:
    """Per scored row: prediction, probability and rank (1 = top) of the target, top-k ids and probabilities."""

    pred: torch.Tensor
    prob: torch.Tensor
    rank: torch.Tensor
    top_ids: torch.Tensor
    top_probs: torch.Tensor


@torch.inference_mode()
def score_rows(head: Callable, stacked: torch.Tensor, targets: torch.Tensor, top_k: int, rows_per_chunk: int,
               divergence: bool = False, certified: CertifiedHead | None = None,
               ) -> tuple[Scores, tuple[torch.Tensor, torch.Tensor] | None]:
    """Apply ``head`` to every layer's states ``stacked`` ``(L + 1, n, hidden)`` and compare with ``targets``
    ``(n,)``. Returns the :class:`Scores` of the ``(L + 1) * n`` rows, layer by layer, and with ``divergence``
    ``(kl, agree)``, each ``(L + 1, n)``: KL(final layer's distribution || this layer's) in nats, and whether this
    layer's top prediction is the final layer's.

    Positions are taken in chunks with all their layers in one call of the head, so each layer's logits are
    computed once and the final layer's are at hand for the divergence; peak memory is one
    ``(rows_per_chunk, vocab)`` block of logits (and its log-probabilities with ``divergence``). With
    ``certified`` (:class:`analysis.core.precision.CertifiedHead`, not with ``divergence``) the vocabulary product runs
    in bfloat16 and every row is certified equal to the float32 head's, or recomputed in float32.
    """
    layers, n = stacked.shape[:2]
    step = max(1, rows_per_chunk // layers)
    parts, kl, agree = [], [], []
    for start in range(0, n, step):
        block = stacked[:, start:start + step]  # (L + 1, c, hidden)
        c = block.shape[1]
        if certified is not None and not divergence:
            parts.append(Scores(*certified.score(block.flatten(0, 1), targets[start:start + c].repeat(layers),
                                                 top_k, layers)))
            continue
        logits = head(block.flatten(0, 1))  # (L + 1) * c rows, layer by layer
        if divergence:  # before row_stats, which may reuse the logits' memory
            logp = torch.log_softmax(logits.float(), dim=-1).unflatten(0, (layers, c))
            final = logp[-1]
            kl.append((final.exp() * (final - logp)).sum(-1).clamp(min=0))
            agree.append((logp.argmax(-1) == final.argmax(-1)).long())
            del logp, final
        parts.append(Scores(*row_stats(logits, targets[start:start + c].repeat(layers), top_k)))
    # each chunk's rows are layer by layer over its c positions: put them back as layer by layer over all n
    scores = Scores(*(torch.cat([getattr(p, f.name).unflatten(0, (layers, -1)) for p in parts], dim=1).flatten(0, 1)
                      if parts else torch.empty(0) for f in dataclasses.fields(Scores)))
    return scores, ((torch.cat(kl, dim=1), torch.cat(agree, dim=1)) if divergence and parts else None)


def mask_groups(counted: np.ndarray, text_ids: list[int], fraction: float, seed: int) -> np.ndarray:
    """``(batch, seq)`` int64, on the host: the masking group of each counted position (-1 elsewhere).

    A text with n counted positions gets ``ceil(n / m)`` groups of ``m = max(1, round(fraction * n))``
    positions, drawn by a permutation seeded with ``(seed, text_id)``, so results do not depend on batching.
    """
    groups = np.full(counted.shape, -1, dtype=np.int64)
    for row, text_id in enumerate(text_ids):
        positions = np.flatnonzero(counted[row])
        n = len(positions)
        if n == 0:
            continue
        m = max(1, round(fraction * n))
        order = np.random.default_rng([seed, text_id]).permutation(n)
        groups[row, positions[order]] = np.arange(n) // m
    return groups


# --- the probe --------------------------------------------------------------------------------------------

def require_mlm_head(loaded: LoadedModel) -> None:
    """An :class:`InputError` saying what to pass when ``loaded`` has no MLM head (own or borrowed)."""
    if loaded.mlm_head is None:
        saved = f"saved as {loaded.task}" if loaded.task else "a bare encoder"
        if loaded.anatomy.family == "electra" and loaded.task == "PreTraining":
            saved += "; an ELECTRA discriminator has none: use the generator's head"
        raise InputError(f"'{loaded.spec.name}' has no MLM head of its own ({saved}): read its layers with the "
                         "pre-trained head of a masked LM of the same family, hidden size and vocabulary, e.g. the "
                         "model it was fine-tuned from: --head-from MODEL (CLI), or in the sidebar under 'Revision, "
                         "device, precision, MLM head': 'Read layers with the MLM head of'")


def probe(loaded: LoadedModel, inputs: TextInputs, config: ProbeConfig | None = None,
          sink: TokenSink | None = None, progress: Callable[[int, int], None] | None = None,
          should_stop: Callable[[], bool] | None = None, ranks: Ranks = ONE, lens=None,
          divergence: bool = False, check_agreement: bool = True) -> ProbeResult | None:
    """Run the reconstruction probe on ``inputs``. Per-token rows go to ``sink`` (in memory by default).

    ``lens`` (:class:`analysis.probe.lens.TunedLens`) reads hidden state ``l < L`` as ``head(h + A_l h + b_l)`` instead
    of ``head(h)`` (with ``half="attention"``, a lens trained on both halves: each attention half through its own
    translator); ``check_agreement`` (for a bfloat16/float16 model) stores :func:`approximate_check` in the
    result's ``precision``; ``divergence`` (on with a lens) adds each layer's mean KL to the final layer's distribution
    and its top-1 agreement with the final layer to the layer table (``kl_to_final``, ``agreement``).

    Under a launcher (``ranks``, :mod:`analysis.core.parallel`) each process probes its share of the batches and the
    main process merges them in plan order: it alone gets the result (others get None), calls ``progress`` (for
    the whole run) and ``should_stop``, and writes to ``sink``. The rows and numbers equal one process's."""
    config = config or ProbeConfig()
    require_mlm_head(loaded)
    if config.half != "output" and lens is not None and lens.half != config.half:
        raise InputError("this tuned lens was trained on the layer outputs only: read the attention halves with the "
                         "MLM head alone (no lens), or train a lens with `layerlens lens train --half attention`")
    start = time.perf_counter()
    release_freed_memory()
    tokenizer, anatomy = loaded.tokenizer, loaded.anatomy
    labels = state_labels(anatomy.num_layers, config.half)  # (layer, half) of each state read
    n_states = len(labels)
    max_length = min(config.max_length or 10**9, max_input_length(loaded))
    encoded = encode(tokenizer, inputs, max_length)
    if ranks.is_main:
        sink = sink or TokenSink(tokenizer, config.top_k, halves=config.half != "output")
    rows_per_chunk = max(1, config.logits_budget_bytes // (4 * anatomy.vocab_size))
    special_ids = list(tokenizer.all_special_ids)
    n = len(encoded)
    correct = np.zeros((n, n_states), dtype=np.int64)
    counted_n = np.zeros(n, dtype=np.int64)
    predicted: dict[int, np.ndarray] = {}  # text id -> (L + 1, counted) predicted ids
    divergence = divergence or lens is not None
    head_kind = head_product(config.precision, loaded.spec.device, divergence)
    if head_kind != "float32" and (anatomy.decoder is None or loaded.model.dtype != torch.float32):
        head_kind = "float32"  # a bf16/fp16 model's head is already in its own dtype: nothing to certify
    certified = CertifiedHead(anatomy.head_transform, anatomy.decoder) if head_kind != "float32" else None
    kl_sum, agree_n = np.zeros((n, n_states)), np.zeros((n, n_states), dtype=np.int64)
    done = 0

    def run(idx: list[int]) -> dict:
        batch = make_batch(encoded, idx, tokenizer.pad_token_id, loaded.spec.device)
        device = batch.input_ids.device
        # Each pass's scored positions, (n, 2) row and position in row-major order, are found on the host from the
        # batch's host copy, and the states and targets gathered by these indices on the device. Every result
        # stays there until one copy of the whole batch's (issue 44: at most one host sync per batch of ours).
        counted = counted_on_host(batch, special_ids, config.include_special)
        if config.mode == "unmasked":
            passes = [(False, np.argwhere(counted))]
        else:
            groups = mask_groups(counted, batch.indices, config.mask_fraction, config.seed)
            passes = [(True, np.argwhere(groups == g)) for g in range(int(groups.max()) + 1)]
        scored = []  # each pass: its positions on the host, as device indices, and its input ids (masked or None)
        for masked, where in passes:
            if len(where):
                at = to_device(torch.from_numpy(where.T.copy()), device).unbind(0)
                mask = torch.tensor(tokenizer.mask_token_id, device=device)
                scored.append((where, at, batch.input_ids.index_put(at, mask) if masked else None))
        on_device, flags = [], []
        for _, (rows_at, positions_at), ids in scored:
            with torch.inference_mode():
                states = hidden_states(loaded, batch, ids, config.half, check=False)
                flags.append(finite_flag(states))
                stacked = torch.stack([s[rows_at, positions_at] for s in states])  # (L + 1, n, hidden)
            del states
            if lens is not None:
                stacked = lens.translate(stacked, labels)
            targets = batch.input_ids[rows_at, positions_at]
            scores, apart = score_rows(anatomy.head, stacked, targets, config.top_k, rows_per_chunk, divergence,
                                       certified)
            on_device.append([targets, *dataclasses.astuple(scores), *(apart or ())])
        if not scored:
            return summarise(batch.indices, [], n_states)
        host = to_host([t for tensors in on_device for t in tensors] + [torch.stack(flags)])
        for (_, _, ids), finite in zip(scored, host[-1], strict=True):
            if not finite:  # the message names the state, or the non-finite values were at padding only
                hidden_states(loaded, batch, ids, config.half)
        width = len(on_device[0])
        per_pass = []
        for number, (where, _, _) in enumerate(scored):
            targets, *rest = (torch.from_numpy(a) for a in host[number * width:(number + 1) * width])
            scores = Scores(*rest[:5])
            per_pass.append((torch.from_numpy(where), targets, scores, tuple(rest[5:]) or None))
        return summarise(batch.indices, per_pass, n_states)

    def record(part: dict) -> None:
        for row, (text_id, counted, right, pred) in enumerate(zip(part["text_ids"], part["counted"], part["correct"],
                                                                  part["predicted"], strict=True)):
            counted_n[text_id], correct[text_id], predicted[text_id] = counted, right, pred
            if divergence:
                kl_sum[text_id], agree_n[text_id] = part["kl"][row], part["agree"][row]
        if part["rows"] is not None:
            sink.add(**label_rows(part["rows"], labels, config.half))

    def stop() -> Stopped | None:
        return Stopped(f"stopped after {done} of {n} texts") if should_stop is not None and should_stop() else None

    try:
        for step in run_plan(batch_plan(loaded, encoded, config.batch_size, ranks), run, ranks, stop):
            for part in step:
                record(part)
                done += len(part["text_ids"])
            if progress is not None:
                progress(done, n)
    except BaseException:
        if sink is not None:
            sink.abort()
        raise
    stats = ranks.gather(certified.stats if certified is not None else None)
    if not ranks.is_main:
        return None
    total = None
    if certified is not None:
        total = Certified()
        for part in stats:
            total.add(part)

    halves = labels if config.half != "output" else None
    layers = layer_table(correct, counted_n, divergence=(kl_sum, agree_n) if divergence else None, labels=halves)
    decoded = decoded_table(tokenizer, predicted, n_states, halves)
    with np.errstate(invalid="ignore", divide="ignore"):
        sentence = np.where(counted_n[:, None] > 0, correct / counted_n[:, None], np.nan)
    tokens = sink.close()
    return ProbeResult(model=loaded.spec.name, config=config, layers=layers, decoded=decoded,
                       sentence_accuracy=sentence, tokens=tokens, n_texts=n, truncated=encoded.truncated,
                       max_length=max_length, seconds=time.perf_counter() - start,
                       layer_names=state_names(anatomy.layer_names(), labels),
                       precision=describe(head_kind, total, dtype_of(loaded.model))
                       | (approximate_check(loaded, inputs, config, lens) if check_agreement else {}))


def approximate_check(loaded: LoadedModel, inputs: TextInputs, config: ProbeConfig, lens=None) -> dict:
    """For a model in bfloat16/float16 (the approximate mode, :func:`analysis.core.precision.mode`): the same probe on
    the first :data:`~analysis.core.precision.AGREEMENT_TEXTS` texts, once as it ran and once with the model in float32,
    compared token by token: ``{"agreement": {...}}`` with the texts and tokens compared, per layer the share of
    predictions identical, the largest difference in a layer's accuracy and in a target's probability. ``{}``
    for a float32 model."""
    from analysis.core.precision import AGREEMENT_TEXTS, reference_spec
    from models.loading import load_model

    if loaded.model.dtype == torch.float32:
        return {}
    sample = TextInputs(tuple(inputs.texts[:AGREEMENT_TEXTS]),
                        tuple(inputs.pairs[:AGREEMENT_TEXTS]) if inputs.pairs else None)
    reference = load_model(reference_spec(loaded.spec))
    ref_lens = copy.deepcopy(lens).float() if lens is not None else None
    cheap = config.replace(precision="float32")
    ours = probe(loaded, sample, cheap, lens=lens, check_agreement=False)
    theirs = probe(reference, sample, cheap, lens=ref_lens, check_agreement=False)
    a, b = ours.tokens, theirs.tokens
    same = (a["predicted_token"].to_numpy() == b["predicted_token"].to_numpy())
    per_layer = pd.Series(same).groupby(a["layer"].to_numpy()).mean()
    accuracy = (ours.layers["accuracy"] - theirs.layers["accuracy"]).abs()
    return {"agreement": {
        "texts": len(sample), "tokens_per_layer": int(len(a) // max(1, len(per_layer))),
        "predictions_identical": float(same.mean()) if len(same) else math.nan,
        "predictions_identical_per_layer": [round(float(x), 6) for x in per_layer],
        "max_accuracy_difference": float(accuracy.max()) if len(accuracy) else math.nan,
        "max_prob_difference": float((a["prob"] - b["prob"]).abs().max()) if len(a) else math.nan}}


def summarise(text_ids: list[int], per_pass: list, n_states: int) -> dict:
    """One batch's results as plain arrays (they travel between processes): per text its counted positions,
    correct predictions per layer and predicted ids ``(L + 1, counted)``; and the per-token ``rows`` for the
    sink, text by text (each text's layers, each layer's positions), so a batch split in halves on
    out-of-memory gives the same rows in the same order."""
    m = len(text_ids)
    part = {"text_ids": list(text_ids), "counted": np.zeros(m, np.int64),
            "correct": np.zeros((m, n_states), np.int64),
            "predicted": [np.zeros((n_states, 0), np.int64) for _ in range(m)], "rows": None}
    if not per_pass:
        return part
    where = torch.cat([w for w, _, _, _ in per_pass])
    targets = torch.cat([t for _, t, _, _ in per_pass])
    k = len(where)
    # every text's positions in reading order, then each score as (L + 1, k)
    order = torch.argsort(where[:, 0] * (where[:, 1].max() + 1) + where[:, 1])
    where, targets = where[order], targets[order]
    pred, prob, rank, top_ids, top_probs = (
        torch.cat([getattr(s, f.name).cpu().unflatten(0, (n_states, len(w))) for w, _, s, _ in per_pass], dim=1)
        [:, order].numpy() for f in dataclasses.fields(Scores))
    if per_pass[0][3] is not None:  # KL to the final layer and agreement with it, (L + 1, k) each
        kl, agree = (torch.cat([d[i] for _, _, _, d in per_pass], dim=1)[:, order].numpy() for i in (0, 1))
        part["kl"], part["agree"] = np.zeros((m, n_states)), np.zeros((m, n_states), np.int64)
    targets, rows = targets.numpy(), where[:, 0].numpy()
    # the positions are sorted by row: each text's are one slice, summed per slice
    bounds = np.searchsorted(rows, np.arange(m + 1))
    part["counted"][:] = np.diff(bounds)
    part["correct"][:] = segment_sums(pred == targets[None, :], bounds).T
    part["predicted"] = [pred[:, a:b] for a, b in itertools.pairwise(bounds)]
    if "kl" in part:
        part["kl"][:], part["agree"][:] = segment_sums(kl, bounds).T, segment_sums(agree, bounds).T
    layer = np.repeat(np.arange(n_states), k)
    column = np.tile(np.arange(k), n_states)
    flat = np.lexsort((column, layer, rows[column]))  # text, then layer, then position
    part["rows"] = {"text_ids": np.asarray(text_ids)[rows[column]][flat], "layers": layer[flat],
                    "positions": where[:, 1].numpy()[column][flat], "targets": targets[column][flat],
                    "preds": pred.reshape(-1)[flat], "probs": prob.reshape(-1)[flat],
                    "ranks": rank.reshape(-1)[flat], "top_ids": top_ids.reshape(n_states * k, -1)[flat],
                    "top_probs": top_probs.reshape(n_states * k, -1)[flat]}
    return part


def segment_sums(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``(rows, segments)``: the sums of ``values`` ``(rows, n)`` over the column slices ``bounds[i]:bounds[i + 1]``
    (an empty slice sums to 0). Counts by one cumulative sum; floats slice by slice, summed as ``values[:, a:b]
    .sum(1)`` sums them (a difference of running sums would not give the same last bits)."""
    if values.dtype.kind == "f":
        return np.stack([values[:, a:b].sum(axis=1) for a, b in itertools.pairwise(bounds)], axis=1)
    cumulative = np.zeros((values.shape[0], values.shape[1] + 1), np.int64)
    np.cumsum(values, axis=1, out=cumulative[:, 1:])
    return cumulative[:, bounds[1:]] - cumulative[:, bounds[:-1]]


# The layer table's headers as the pages show them (name, help); the CSV keeps the short column names.
LAYER_HEADERS = {
    "accuracy": ("token accuracy", "correct / counted tokens over all texts (micro average)"),
    "sentence_mean": ("sentence mean", "mean of the per-sentence accuracies (macro average over sentences)"),
    "ci_low": ("95% CI low (bootstrap)", "sentence mean's 95% percentile-bootstrap interval over sentences, "
               "2000 resamples, seed 0; blank for one sentence. With few sentences it is too narrow (sentences "
               "that all score the same give a zero-width interval): read it as a resampling range, not a "
               "guarantee"),
    "ci_high": ("95% CI high (bootstrap)", "see 95% CI low"),
    "kl_to_final": ("KL to final", "mean over counted tokens of KL(final layer's distribution || this layer's), "
                    "in nats: 0 when the layer reads as the final layer"),
    "agreement": ("agreement with final", "share of counted tokens whose top prediction is the final layer's"),
}
BOOTSTRAP_RESAMPLES = 2000
INTERVAL = "95% percentile bootstrap over sentences (2000 resamples, seed 0)"


def bootstrap_interval(values: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                       chunk_cells: int = 20_000_000) -> tuple[np.ndarray, np.ndarray]:
    """95% percentile-bootstrap interval of the column means of ``values`` ``(n, k)``: resample the ``n`` rows
    with replacement ``resamples`` times (seeded). Each bound is a mean of the rows' own values, so an interval
    of accuracies never leaves [0, 1]. The draws are made in chunks of at most ``chunk_cells`` indices (flat
    memory for many sentences) and are the same as one ``rng.integers(0, n, (resamples, n))``
    (:func:`analysis.core.scores.bootstrap_counts`)."""
    n, k = values.shape
    if n < 2:
        return np.full(k, np.nan), np.full(k, np.nan)
    means = np.empty((resamples, k))
    for start, counts in bootstrap_counts(n, resamples, seed, chunk_cells):
        means[start:start + len(counts)] = counts @ values / n
    low, high = np.percentile(means, [2.5, 97.5], axis=0)
    return low, high


def label_rows(rows: dict, labels: list[tuple[int, str]], half: str) -> dict:
    """A batch's per-token rows (``layers`` = state index) with each state's layer, and its ``halves`` when the
    attention halves are read."""
    if half == "output":
        return rows
    layer_of = np.array([layer for layer, _ in labels])
    half_of = np.array([h for _, h in labels])
    return rows | {"layers": layer_of[rows["layers"]], "halves": half_of[rows["layers"]]}


def state_names(layer_names: list[str], labels: list[tuple[int, str]]) -> list[str]:
    """Each state's name: its layer's (:meth:`models.anatomy.Anatomy.layer_names`), "+ attention" for an
    attention half."""
    return [layer_names[layer] + (" attention half" if half == "attention" else "") for layer, half in labels]


def layer_table(correct: np.ndarray, counted: np.ndarray, seed: int = 0,
                divergence: tuple[np.ndarray, np.ndarray] | None = None,
                labels: list[tuple[int, str]] | None = None) -> pd.DataFrame:
    """Per layer: tokens, correct, micro accuracy, sentence mean and its :data:`INTERVAL` (``ci_low``,
    ``ci_high``; blank with fewer than two sentences). ``correct`` ``(texts, layers)``, ``counted`` ``(texts,)``.
    ``divergence``: per text and layer the summed KL to the final layer and the count of top-1 agreements,
    giving the columns :data:`DIVERGENCE_COLUMNS` (means over all counted tokens). ``labels`` (the attention
    halves read, :func:`~analysis.core.activations.state_labels`): each column of ``correct`` is that state, the
    ``layer`` column its layer and a ``half`` column after it says which half."""
    has = counted > 0
    acc = correct[has] / counted[has][:, None]
    low, high = bootstrap_interval(acc, seed=seed)
    tokens = int(counted.sum())
    rows = []
    for layer in range(correct.shape[1]):
        right = int(correct[:, layer].sum())
        rows.append({"layer": layer, "tokens": tokens, "correct": right,
                     "accuracy": right / tokens if tokens else math.nan,
                     "sentence_mean": float(acc[:, layer].mean()) if len(acc) else math.nan,
                     "ci_low": float(low[layer]), "ci_high": float(high[layer])})
    frame = pd.DataFrame(rows, columns=LAYER_COLUMNS)
    if labels is not None:
        frame["layer"] = [layer for layer, _ in labels]
        frame.insert(1, "half", [half for _, half in labels])
    if divergence is not None:
        for column, per_text in zip(DIVERGENCE_COLUMNS, divergence, strict=True):
            frame[column] = per_text.sum(axis=0) / tokens if tokens else math.nan
    return frame


def decoded_table(tokenizer, predicted: dict[int, np.ndarray], n_states: int,
                  labels: list[tuple[int, str]] | None = None) -> pd.DataFrame:
    """The predicted text of every layer, word pieces joined (Kao et al., Table 1); with ``labels`` (attention
    halves read) a ``half`` column after ``layer``.

    Every (text, state) row is decoded at once (:func:`analysis.probe.decoding.decode_rows`: the vocabulary decoded
    once, the rows joined from it), not with two Python calls per row (issue 44: 260,000 of them took 10 s of a GPU
    run); the columns are built as arrays. Equal to the per-row decoding on every row for WordPiece, SentencePiece
    and byte-level BPE (``tests/unit/probe/test_decoded.py``)."""
    text_ids = sorted(predicted)
    flat = np.concatenate([predicted[t].ravel() for t in text_ids]) if text_ids else np.zeros(0, np.int64)
    lengths = np.repeat([predicted[t].shape[1] for t in text_ids], n_states).astype(np.int64)
    texts = decode_rows(tokenizer, flat, lengths)
    states = np.tile(np.arange(n_states), len(text_ids))
    frame = pd.DataFrame({"text_id": np.repeat(np.asarray(text_ids, dtype=np.int64), n_states)})
    if labels:
        frame["layer"] = np.asarray([layer for layer, _ in labels], dtype=np.int64)[states]
        frame["half"] = [labels[state][1] for state in states]
    else:
        frame["layer"] = states.astype(np.int64)
    frame["text"] = texts  # the dtype pandas gives text (as the per-row table had)
    return frame
