"""What a comparison of checkpoints checks before it computes anything, and how it pairs the layers of two models
(issue 34): the page and the CLI reach these through :func:`analysis.compare.run.compare` (the CLI also calls
:func:`check_rows` before it loads a model).

- :func:`same_tokenizer`: the tokenizers' class and vocabulary;
- :func:`same_tokens`: the input ids each model's tokenizer actually gives every row being compared (two tokenizers
  of the same class and vocabulary can still differ in lowercasing, accents or other normalisation: a cased copy of
  an uncased model reads "Great Battery" as ``[UNK] [UNK]``);
- :func:`check_rows`: enough rows for what is computed (the probe's stratified folds, CKA's interval);
- :func:`layer_pairs`: which layer of B is set against which layer of A when the depths differ.
"""

from __future__ import annotations

import math

from analysis.compare.options import PAIRINGS
from analysis.core.inputs import InputError, TextInputs
from models.loading import LoadedModel

MIN_ROWS = 3  # two centred rows are always one line apart: CKA 1 whatever the models


def same_tokenizer(a: LoadedModel, b: LoadedModel) -> None:
    """Refuse a pair whose tokenizers differ (vocabulary or class): their token positions do not correspond."""
    ta, tb = a.tokenizer, b.tokenizer
    if type(ta).__name__ != type(tb).__name__ or ta.get_vocab() != tb.get_vocab():
        raise InputError(f"'{a.spec.name}' and '{b.spec.name}' use different tokenizers: a layer-by-layer comparison "
                         "needs the same tokens; only sentence-level comparisons would be possible between them")


def _shown(tokens: list[str], limit: int = 12) -> str:
    return " ".join(tokens[:limit]) + (" …" if len(tokens) > limit else "")


def same_tokens(models: list[LoadedModel], inputs: TextInputs, max_length: int | None,
                names: list[str] | None = None) -> None:
    """Refuse, naming the first row that differs, when any model's tokenizer gives other input ids than the first
    model's on a row of ``inputs`` (tokenised as the extraction tokenises them: :func:`analysis.core.activations.encode`
    at each model's own length limit under ``max_length``). Only the rows being compared are checked: two
    tokenizers that differ in a way these rows never show compare as one."""
    from analysis.core.activations import encode, max_input_length

    names = names or [m.spec.name for m in models]

    def ids(m: LoadedModel) -> list[list[int]]:
        return encode(m.tokenizer, inputs, min(max_length or 10**9, max_input_length(m))).input_ids

    first = ids(models[0])
    for m, name in zip(models[1:], names[1:], strict=True):
        if m.tokenizer is models[0].tokenizer:
            continue
        other = ids(m)
        for k, (x, y) in enumerate(zip(first, other, strict=True)):
            if list(x) != list(y):
                text = inputs.texts[k]
                text = text if len(text) <= 60 else text[:57] + "…"
                raise InputError(
                    f"'{names[0]}' and '{name}' read row {inputs.ids[k]} differently ({text!r}: "
                    f"{_shown(models[0].tokenizer.convert_ids_to_tokens(list(x)))} against "
                    f"{_shown(m.tokenizer.convert_ids_to_tokens(list(y)))}): their tokenizers normalise text "
                    "differently (lowercasing, accents?), and a layer-by-layer comparison needs the same tokens on "
                    "every row")


def check_rows(inputs: TextInputs, folds: int, debiased: bool = False) -> None:
    """Refuse, in one line and before any model reads a row, rows too few for the comparison: fewer than
    :data:`MIN_ROWS` (4 for debiased CKA, Song et al.'s unbiased HSIC divides by ``n - 3``); with labels, the
    linear probe's ``StratifiedKFold(folds)`` needs ``folds`` rows of at least one class, and two classes."""
    n = len(inputs)
    least = 4 if debiased else MIN_ROWS
    if n < least:
        raise InputError(f"{n} rows: too few to compare (at least {least}{' for debiased CKA' if debiased else ''})")
    if not inputs.labels:
        return
    counts: dict[str, int] = {}
    for label in inputs.labels:
        counts[label] = counts.get(label, 0) + 1
    if len(counts) < 2:
        raise InputError(f"{n} rows, all of class '{next(iter(counts))}': the linear probe needs two classes (give "
                         "rows of two classes, or no label column)")
    if max(counts.values()) < folds:
        raise InputError(f"{n} rows: too few for the linear probe's {folds} stratified folds (its largest class has "
                         f"{max(counts.values())} rows; at least {folds} are needed): give more rows or fewer folds "
                         "(--folds)")


def layer_pairs(states_a: int, states_b: int, pairing: str = "index") -> list[tuple[int, int]]:
    """Which hidden state of B is set against which of A (``states``: ``L + 1`` each). ``index``: ``(l, l)`` for
    ``l = 0 .. min(L_A, L_B)``. ``relative``: every hidden state of the shallower model, each with the deeper
    model's state nearest in relative depth (``l / L``; ``round(l * L_deep / L_shallow)``, halves up), so both
    models' embeddings and last layers are paired. With equal depths both are ``(l, l)`` for every layer."""
    if pairing not in PAIRINGS:
        raise InputError(f"unknown layer pairing '{pairing}': choose {' or '.join(PAIRINGS)}")
    la, lb = states_a - 1, states_b - 1
    if pairing == "index" or la == lb:
        return [(i, i) for i in range(min(states_a, states_b))]
    if la < lb:
        return [(i, math.floor(i * lb / max(la, 1) + 0.5)) for i in range(states_a)]
    return [(math.floor(j * la / max(lb, 1) + 0.5), j) for j in range(states_b)]


def pairing_info(states_a: int, states_b: int, pairs: list[tuple[int, int]], pairing: str, name_b: str) -> dict:
    """What run.json and the page say of one pair's layers: both depths, the pairs, and each model's hidden states
    that no pair holds (they appear only in the cross-layer CKA matrix)."""
    return {"model_b": name_b, "pairing": pairing, "depths": [states_a - 1, states_b - 1],
            "pairs": [list(p) for p in pairs],
            "left_out_a": sorted(set(range(states_a)) - {i for i, _ in pairs}),
            "left_out_b": sorted(set(range(states_b)) - {j for _, j in pairs})}
