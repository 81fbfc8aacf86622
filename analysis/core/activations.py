"""Tokenise texts once, batch them by length, and run the encoder to get every layer's hidden states.

Length bucketing: texts are sorted by token count and cut into batches, so a batch pads only to its own
longest text. Results are always reported in input order by the callers (``Batch.indices``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
import weakref
from collections.abc import Iterator

import numpy as np
import torch
from tokenizers import Encoding, Tokenizer

from analysis.core.inputs import InputError, TextInputs
from analysis.core.interventions import intervene
from analysis.core.options import HALVES, TRUNCATIONS
from analysis.core.transfer import to_device
from models.anatomy import FAMILIES
from models.cache import free_bytes, is_out_of_memory
from models.loading import LoadedModel

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Encoded:
    """Token ids per text (special tokens included), in input order."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]] | None
    max_length: int
    truncated: int  # how many texts were cut to ``max_length``

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def n_tokens(self) -> int:
        return sum(map(len, self.input_ids))


@dataclasses.dataclass(frozen=True)
class Batch:
    """A padded batch. ``indices[b]`` is the input position of row ``b``. Tensors are ``(batch, seq)``."""

    indices: list[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None
    host_ids: np.ndarray  # the ids and mask as built on the host (make_batch), read there without a device copy
    host_mask: np.ndarray

    def model_inputs(self, input_ids: torch.Tensor | None = None) -> dict:
        out = {"input_ids": self.input_ids if input_ids is None else input_ids, "attention_mask": self.attention_mask}
        if self.token_type_ids is not None:
            out["token_type_ids"] = self.token_type_ids
        return out


def position_limit(config) -> int:
    """How many tokens the position embeddings of a model with ``config`` can number."""
    positions = getattr(config, "max_position_embeddings", 512)
    if config.model_type in ("roberta", "xlm-roberta", "camembert"):  # positions start at padding_idx + 1
        positions -= (config.pad_token_id or 0) + 1
    return positions


def max_input_length(loaded: LoadedModel) -> int:
    """The longest input the model accepts: the tokenizer's limit, capped by the position embeddings."""
    positions = position_limit(loaded.model.config)
    limit = loaded.tokenizer.model_max_length
    return positions if not limit or limit > 1_000_000 else min(limit, positions)


def truncate_indices(n: int, budget: int, strategy: str) -> list[int]:
    """Which of ``n`` token positions a text keeps under ``strategy`` with room for ``budget`` tokens:
    ``head`` the first ``budget``, ``tail`` the last ``budget``, ``head+tail`` the first
    ``round(budget * 128/510)`` and the rest from the end (128 + 382 at 512, Sun et al. §5.3.1's best)."""
    if strategy not in TRUNCATIONS:
        raise InputError(f"unknown truncation '{strategy}'; choose one of {', '.join(TRUNCATIONS)}")
    if n <= budget:
        return list(range(n))
    if strategy == "head":
        return list(range(budget))
    if strategy == "tail":
        return list(range(n - budget, n))
    head = round(budget * 128 / 510)
    return list(range(head)) + list(range(n - (budget - head), n))


def _cut(encoding: Encoding, keep: list[int], n: int) -> Encoding:
    """``encoding`` reduced to the positions ``keep`` (a head run and/or a tail run)."""
    if len(keep) == n:
        return encoding
    head = next((i for i, k in enumerate(keep) if k != i), len(keep))
    tail = len(keep) - head
    parts = []
    if head:
        first = Encoding.merge([encoding], growing_offsets=False)
        first.truncate(head, direction="right")
        parts.append(first)
    if tail:
        last = Encoding.merge([encoding], growing_offsets=False)
        last.truncate(tail, direction="left")
        parts.append(last)
    return Encoding.merge(parts, growing_offsets=False)


_BARE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BARE_LOCK = threading.Lock()


def bare_backend(tokenizer) -> Tokenizer:
    """A copy of ``tokenizer``'s backend (its ``tokenizer.json``) without the padding and truncation a checkpoint
    may store there (sentence-transformers saves fixed padding and truncation to 128), made once per tokenizer.
    A copy, never the original: the tokenizer of a cached model is shared, and transformers' ``__call__`` sets
    the original's padding and truncation for each call."""
    with _BARE_LOCK:
        bare = _BARE.get(tokenizer)
        if bare is None:
            bare = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
            bare.no_padding()
            bare.no_truncation()
            _BARE[tokenizer] = bare
        return bare


def encode_truncated(tokenizer, texts, pairs, max_length: int, strategy: str = "head") -> tuple[list, list, int]:
    """The one tokenisation of LayerLens (probe, atlas, lens, duplication, fine-tuning): ``(input_ids,
    token_type_ids, how many texts were cut)`` with the model's own special tokens ([CLS]/[SEP], <s>/</s>, ...),
    at most ``max_length`` tokens each, no padding. The checkpoint's stored padding and truncation are ignored
    (:func:`bare_backend`); ours apply: ``budget = max_length - special tokens`` tokens of the (first) text kept
    by ``strategy`` (:func:`truncate_indices`). With a text pair, the second text (an aspect, a hypothesis)
    keeps at most half the budget, cut at its end, and the first text gets the rest."""
    backend = bare_backend(tokenizer)
    budget = max_length - tokenizer.num_special_tokens_to_add(pair=pairs is not None)
    if budget < 2:
        raise InputError(f"max length {max_length} leaves no room for text")
    ids, types, cut = [], [], 0
    firsts = backend.encode_batch(list(texts), add_special_tokens=False)
    seconds = backend.encode_batch(list(pairs), add_special_tokens=False) if pairs is not None else None
    for i, a in enumerate(firsts):
        b = None
        room = budget
        if seconds is not None:
            b = seconds[i]
            if len(b) + len(a) > budget and len(b) > budget // 2:
                b = _cut(b, truncate_indices(len(b), budget // 2, "head"), len(b))
                cut += 1
            room = budget - len(b)
        keep = truncate_indices(len(a), room, strategy)
        cut += len(keep) < len(a)
        final = backend.post_process(_cut(a, keep, len(a)), b, add_special_tokens=True)
        ids.append(final.ids)
        types.append(final.type_ids)
    return ids, types, cut


_WORDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _prefix_spaces(node):
    """Set ``add_prefix_space`` on every byte-level pre-tokenizer in a serialised pipeline (in place)."""
    if isinstance(node, dict):
        if node.get("type") == "ByteLevel" and "add_prefix_space" in node:
            node["add_prefix_space"] = True
        for value in node.values():
            _prefix_spaces(value)
    elif isinstance(node, list):
        for value in node:
            _prefix_spaces(value)


def words_backend(tokenizer) -> Tokenizer:
    """:func:`bare_backend` for text already split into words. A byte-level BPE (RoBERTa, GPT-2 style) marks a
    word that follows a space with ``Ġ``; given one word at a time it would see every word as text-initial, so
    its pre-tokenizer gets ``add_prefix_space=True`` (what transformers requires for ``is_split_into_words``):
    every word, the first included, is read as if a space preceded it. WordPiece and SentencePiece (Metaspace
    prepends ``▁`` to each word) need nothing. A copy, made once per tokenizer; the shared one is never touched."""
    import json

    with _BARE_LOCK:
        backend = _WORDS.get(tokenizer)
        if backend is None:
            spec = json.loads(tokenizer.backend_tokenizer.to_str())
            _prefix_spaces(spec.get("pre_tokenizer"))
            backend = Tokenizer.from_str(json.dumps(spec))
            backend.no_padding()
            backend.no_truncation()
            _WORDS[tokenizer] = backend
        return backend


@dataclasses.dataclass(frozen=True)
class EncodedWords(Encoded):
    """:class:`Encoded` for pre-split words: ``word_ids[s][t]`` is the word of token ``t`` of sentence ``s``
    (None for special tokens). Nothing is cut: ``too_long`` lists the sentences (input positions) longer than
    ``max_length`` tokens and ``no_subword`` those with a word the tokenizer turns into no token at all; both are
    left out of the batches by the callers, which report them."""

    word_ids: list[list[int | None]] = dataclasses.field(default_factory=list)
    too_long: list[int] = dataclasses.field(default_factory=list)
    no_subword: list[int] = dataclasses.field(default_factory=list)


def encode_words(tokenizer, sentences: list[list[str]], max_length: int) -> EncodedWords:
    """Tokenise sentences given as words (``is_split_into_words``), with the model's special tokens and the
    word of each token (:func:`words_backend`). A sentence over ``max_length`` tokens is never cut: it is listed
    in ``too_long``."""
    backend = words_backend(tokenizer)
    ids, types, words, too_long, no_subword = [], [], [], [], []
    for i, e in enumerate(backend.encode_batch([list(s) for s in sentences], is_pretokenized=True,
                                               add_special_tokens=True)):
        ids.append(e.ids)
        types.append(e.type_ids)
        words.append(e.word_ids)
        if len(e.ids) > max_length:
            too_long.append(i)
        elif len({w for w in e.word_ids if w is not None}) < len(sentences[i]):
            no_subword.append(i)
    keep_types = "token_type_ids" in tokenizer.model_input_names
    return EncodedWords(ids, types if keep_types else None, max_length, 0, words, too_long, no_subword)


def encode(tokenizer, inputs: TextInputs, max_length: int, strategy: str = "head") -> Encoded:
    """Tokenise ``inputs`` with :func:`encode_truncated`, cutting texts longer than ``max_length`` (counted)."""
    ids, types, truncated = encode_truncated(tokenizer, inputs.texts, inputs.pairs, max_length, strategy)
    return Encoded(ids, types if "token_type_ids" in tokenizer.model_input_names else None, max_length, truncated)


MEMORY_FRACTION = 0.5  # of the memory free on the device when a run starts, for one batch's activations
ACCELERATOR_TOKENS = 16_384  # padded tokens per batch on a GPU (at least batch_size texts): not measured on one yet


def activation_bytes(loaded: LoadedModel, width: int, copies: int = 2) -> int:
    """Peak bytes one text of ``width`` tokens adds to a forward pass that keeps every hidden state: the
    ``L + 1`` states (``copies`` of them: the model's tuple and the caller's stacked/selected copy) and one
    layer's transient attention scores and feed-forward activations."""
    config = loaded.model.config
    hidden = loaded.anatomy.hidden_size
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", 12)
    inner = getattr(config, "intermediate_size", None) or getattr(config, "hidden_dim", 4 * hidden)
    item = loaded.model.dtype.itemsize
    return item * width * ((loaded.num_layers + 1) * hidden * copies + 3 * heads * width + 2 * inner)


def batch_budget(loaded: LoadedModel) -> int:
    """Bytes one batch's activations may take: :data:`MEMORY_FRACTION` of what the device has free now."""
    return int(free_bytes(loaded.spec.device) * MEMORY_FRACTION)


def bucket_indices(encoded: Encoded, batch_size: int, loaded: LoadedModel | None = None,
                   budget: int | None = None) -> Iterator[list[int]]:
    """Length buckets: lists of text indices covering every text once, shortest texts first.

    On an accelerator (``loaded`` on a GPU) a batch holds up to :data:`ACCELERATOR_TOKENS` tokens (padded) when
    that is more than ``batch_size`` texts: short texts make batches of hundreds, which keep a GPU busy (issue 44
    item 1; the memory cap below still holds). On the CPU ``batch_size`` is the count, as measured best there.

    With ``loaded``, a batch also stops growing before its activations (:func:`activation_bytes` at its
    longest text) would pass ``budget`` (default :func:`batch_budget`), so long texts on a small machine get
    small batches instead of an out-of-memory failure. A single text always makes a batch.
    """
    order = sorted(range(len(encoded)), key=lambda i: len(encoded.input_ids[i]))
    if loaded is not None and budget is None:
        budget = batch_budget(loaded)
    accelerator = loaded is not None and str(loaded.spec.device).split(":")[0] not in ("cpu", "meta")
    batch: list[int] = []
    cost: dict[int, int] = {}  # width -> activation bytes of one text (the model's dtype is looked up once a width)
    for i in order:  # ascending length: the text being added is the batch's longest
        width = len(encoded.input_ids[i])
        if loaded is not None and width not in cost:
            cost[width] = activation_bytes(loaded, width)
        cap = max(batch_size, ACCELERATOR_TOKENS // width) if accelerator else batch_size
        full = len(batch) >= cap or (loaded is not None and (len(batch) + 1) * cost[width] > budget)
        if batch and full:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def make_batch(encoded: Encoded, idx: list[int], pad_id: int, device: str = "cpu") -> Batch:
    """The padded batch of texts ``idx``, built on the host in one copy per tensor (numpy fills by a length mask)
    and moved to ``device``: from pinned memory without blocking on a GPU, so the copy overlaps the device's work."""
    lengths = np.fromiter((len(encoded.input_ids[i]) for i in idx), np.int64, len(idx))
    width = int(lengths.max())
    mask = np.arange(width)[None, :] < lengths[:, None]

    def padded(rows: list[list[int]], fill: int) -> np.ndarray:
        out = np.full((len(idx), width), fill, np.int64)
        out[mask] = np.fromiter(itertools.chain.from_iterable(rows[i] for i in idx), np.int64, int(lengths.sum()))
        return out

    ids = padded(encoded.input_ids, pad_id)
    types = padded(encoded.token_type_ids, 0) if encoded.token_type_ids is not None else None
    return Batch(list(idx), to_device(torch.from_numpy(ids), device),
                 to_device(torch.from_numpy(mask.astype(np.int64)), device),
                 to_device(torch.from_numpy(types), device) if types is not None else None, ids, mask)


# --- which states: each layer's output, or also the attention half of each layer ------------------------------



def state_labels(num_layers: int, half: str = "output") -> list[tuple[int, str]]:
    """``(layer, half)`` of each state :func:`hidden_states` returns, in its order: ``(0, "output")`` is the
    embedding output; with ``half="attention"`` layer ``l``'s attention half ``(l, "attention")`` comes just
    before its output ``(l, "output")``."""
    if half not in HALVES:
        raise InputError(f"unknown half '{half}'; choose one of {', '.join(HALVES)}")
    labels = [(0, "output")]
    for layer in range(1, num_layers + 1):
        labels += [(layer, "attention")] * (half == "attention") + [(layer, "output")]
    return labels


def attention_blocks(model) -> list[torch.nn.Module]:
    """The module whose output is the residual stream after a layer's attention block (the residual sum and its
    LayerNorm: BERT-family encoders are post-LN), before the feed-forward block, one entry per distinct module
    (module names from transformers' modeling code):

    - BERT, RoBERTa / XLM-R, ELECTRA: ``layer.attention.output`` (``*SelfOutput``: ``LayerNorm(dense(context) + x)``);
    - DistilBERT: ``layer.sa_layer_norm`` (``sa_layer_norm(attention(x) + x)``);
    - ALBERT: ``albert_layers[0].attention`` of each layer group (``LayerNorm(x + dense(context))``, the first of
      the tuple it returns); a shared group runs at several layers and its hook fires at each, in forward order.
    """
    config = model.config
    family = FAMILIES.get(config.model_type)
    base = model.base_model
    if family == "distilbert":
        found = [layer.sa_layer_norm for layer in base.transformer.layer]
    elif family == "albert":
        if getattr(config, "inner_group_num", 1) != 1:
            raise InputError(f"this ALBERT runs {config.inner_group_num} attention blocks per layer "
                             "(inner_group_num); the attention half is defined for one")
        found = [group.albert_layers[0].attention for group in base.encoder.albert_layer_groups]
    elif family in ("bert", "roberta", "electra"):
        found = [layer.attention.output for layer in base.encoder.layer]
    else:
        raise InputError(f"the attention half is not known for a '{config.model_type}' model")
    unique: dict[int, torch.nn.Module] = {}
    for module in found:  # a duplicated layer is one module run twice: one hook, which fires at each run
        unique.setdefault(id(module), module)
    return list(unique.values())


@contextlib.contextmanager
def attention_halves(model) -> Iterator[list[torch.Tensor]]:
    """Within the block, every forward pass of ``model`` appends each layer's attention-half state ``(batch, seq,
    hidden)`` to the yielded list, in forward order (forward hooks on :func:`attention_blocks`, removed on
    exit; :func:`analysis.core.interventions.intervene`)."""
    found: list[torch.Tensor] = []
    with intervene(model, attention_blocks(model), lambda layer, value: found.append(value)):
        yield found


def hidden_states(loaded: LoadedModel, batch: Batch, input_ids: torch.Tensor | None = None,
                  half: str = "output", check: bool = True) -> tuple[torch.Tensor, ...]:
    """Every layer's hidden states, ``L + 1`` tensors of ``(batch, seq, hidden)``; 0 is the embedding output.
    With ``half="attention"`` each layer's attention half (:func:`attention_halves`) comes just before its output:
    ``2L + 1`` tensors labelled by :func:`state_labels`.

    Runs the encoder only (``base_model``): the MLM head is applied by the caller where it is needed.
    ``input_ids`` replaces the batch's ids (for masking) while keeping its attention mask. ``check=False``: the
    caller checks the states' finiteness itself, without a host sync (:func:`finite_flag`, then this call again
    with ``check=True`` for the message when the flag is down).
    """
    return encoder_states(loaded.model, loaded.num_layers, batch, input_ids, half, check)


def encoder_states(model: torch.nn.Module, num_layers: int, batch: Batch, input_ids: torch.Tensor | None = None,
                   half: str = "output", check: bool = True) -> tuple[torch.Tensor, ...]:
    """:func:`hidden_states` of any module whose ``base_model`` is the encoder (a model, its encoder itself, or a
    copy of it such as the tuned lens's bfloat16 shadow), ``num_layers`` layers deep."""
    state_labels(0, half)  # a known half
    with attention_halves(model) if half == "attention" else contextlib.nullcontext([]) as halves:
        out = model.base_model(**batch.model_inputs(input_ids), output_hidden_states=True, return_dict=True)
    if len(out.hidden_states) != num_layers + 1:  # e.g. output hooks installed twice on shared layers
        raise RuntimeError(f"the model returned {len(out.hidden_states)} hidden states for {num_layers} layers")
    if half == "output":
        states = out.hidden_states
    else:
        if len(halves) != num_layers:
            raise RuntimeError(f"{len(halves)} attention halves for {num_layers} layers")
        states = [out.hidden_states[0]]
        for attention, output in zip(halves, out.hidden_states[1:], strict=True):
            states += [attention, output]
        states = tuple(states)
    if check:
        names = [f"hidden state {layer}" if kind == "output" else f"the attention half of layer {layer}"
                 for layer, kind in state_labels(num_layers, half)]
        check_finite(states, names, batch.attention_mask.bool()[..., None])
    return states


def finite_flag(tensors) -> torch.Tensor:
    """A 0-d bool tensor on the tensors' device: whether every value of ``tensors`` is finite (padding included;
    :func:`check_finite` then looks at the real positions). Read it with the batch's other results: no sync."""
    return torch.stack([torch.isfinite(t).all() for t in tensors]).all()


def check_finite(tensors, names: list[str], real: torch.Tensor | None) -> None:
    """THE check of non-finite activations, used by every analysis (the hidden states of
    :func:`encoder_states`; the attention weights of :func:`analysis.heads.model.attentions`): an
    :class:`InputError` naming the first of ``tensors`` (in forward order, named by ``names``) that holds NaN or
    an infinity at a real position (``real``: a bool mask broadcastable to each tensor; None: every position),
    with the count and what to do. A float16 model whose activations pass float16's range (65,504) is the usual
    cause: the same weights in float32 are finite. One host sync per call when everything is finite."""
    if not len(tensors) or bool(finite_flag(tensors)):
        return
    for tensor, name in zip(tensors, names, strict=True):
        bad = ~torch.isfinite(tensor)
        if real is not None:
            bad &= real
        count = int(bad.sum())
        if count:
            dtype = str(tensor.dtype).removeprefix("torch.")
            advice = ("its activations pass float16's range (65,504): load it in float32 (--dtype float32; the "
                      "sidebar's float32)" if tensor.dtype == torch.float16 else
                      "load it in float32 (--dtype float32), or check its weights" if tensor.dtype != torch.float32
                      else "check its weights (they hold NaN or infinities, or values that overflow float32)")
            raise InputError(f"the model's activations are not finite: {name}: {count:,} NaN or infinite values "
                             f"in a batch of {tensor.shape[0]} text(s), with the model in {dtype}; nothing is "
                             f"computed from them: {advice}")


def counted_on_host(batch: Batch, special_ids: list[int], include_special: bool) -> np.ndarray:
    """``(batch, seq)`` bool on the host: the positions that count (the attention mask, less the special tokens
    unless ``include_special``), from the batch's host copy: no device work, no sync."""
    mask = batch.host_mask.copy()
    if not include_special:
        mask &= ~np.isin(batch.host_ids, special_ids)
    return mask


def counted_mask(batch: Batch, special_ids: list[int], include_special: bool) -> torch.Tensor:
    """``(batch, seq)`` bool on the batch's device: the positions that count (:func:`counted_on_host`, copied)."""
    return to_device(torch.from_numpy(counted_on_host(batch, special_ids, include_special)), batch.input_ids.device)


def halving_on_oom(run, idx: list[int]):
    """Call ``run(idx)``; when the device (GPU or CPU) runs out of memory, split ``idx`` in halves and go on.
    Yields each result."""
    try:
        yield run(idx)
    except RuntimeError as exc:  # torch.OutOfMemoryError included
        if len(idx) == 1 or not is_out_of_memory(exc):
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        half = len(idx) // 2
        log.warning("out of memory with a batch of %d; retrying in halves", len(idx))
        yield from halving_on_oom(run, idx[:half])
        yield from halving_on_oom(run, idx[half:])
