"""Compare checkpoints layer by layer on the same rows (issue 28; Merchant et al. 2020, "What happens to BERT
embeddings during fine-tuning?"; Kao et al. 2020 Fig. 2): the first model is the reference A, each other model B is
compared with it.

Per pair and per pair of layers (:func:`analysis.compare.checks.layer_pairs`: by index, ``0 .. min(L_A, L_B)``, or
by relative depth; the cross matrix has every pair of layers):
- linear CKA of A's and B's layer-l sentence vectors with a bootstrap interval (debiased CKA as an option),
  :mod:`analysis.core.cka`;
- with labels: each model's linear-probe accuracy (the atlas's probe, the same folds for both, Wilson interval)
  and an exact McNemar test on the paired out-of-fold predictions;
- movers: each example's cosine distance after Procrustes alignment, raw, and its 10-nearest-neighbour overlap
  (:mod:`analysis.compare.movers`);
- one aligned map: PCA of A's vectors and B's rotated onto them (the rotation the movement is measured after),
  pooled, each layer's map rotated onto the previous one.
A layer whose vectors are the same for every row (layer 0's [CLS]) has no CKA, movement or neighbour overlap.
Before anything is read: the same tokenizer and the same input ids on every row, and enough rows
(:mod:`analysis.compare.checks`).
Vectors come from the atlas's cache (:func:`analysis.atlas.atlas.representations`): a model already extracted on
these rows is not extracted again.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd
from scipy.linalg import orthogonal_procrustes
from threadpoolctl import threadpool_limits

from analysis.compare.checks import check_rows, layer_pairs, pairing_info, same_tokenizer, same_tokens
from analysis.compare.movers import mcnemar, movement, neighbour_overlap, procrustes_rotation
from analysis.compare.options import CompareConfig
from analysis.compare.recon import COLUMNS, RESAMPLES, reconstruction_rows
from analysis.core.cka import constant_layer, cross_cka, paired_cka
from analysis.core.inputs import InputError, TextInputs
from analysis.core.scores import majority_baseline, wilson_interval
from models.loading import LoadedModel

CHANGED = 0.5  # an example whose neighbours "mostly changed": fewer than half of its 10 nearest are kept


@dataclasses.dataclass
class CompareResult:
    """``cka_cross``: model_b, layer_a, layer_b, cka; ``layer_summary``: one row per (model_b, layer);
    ``movers``: one row per (model_b, layer, example); ``coords``: model, layer, example_id, x, y (per pair and
    layer A's rows, then B's, in the same order: :func:`pair_coords`); ``info``. ``layer`` is A's layer; when the
    depths differ a ``layer_b`` column (B's layer paired with it) follows it."""

    cka_cross: pd.DataFrame
    layer_summary: pd.DataFrame
    movers: pd.DataFrame
    coords: pd.DataFrame
    info: dict


def aligned_maps(a: np.ndarray, b: np.ndarray, layers: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer, 2-D coordinates of A's and B's rows in one space: exact PCA of A's vectors and B's rotated onto
    them (:func:`analysis.compare.movers.procrustes_rotation`, as the movement is measured), pooled, then rotated (or
    reflected) onto the previous layer's map by 2-D orthogonal Procrustes, so a point whose vectors do not change
    keeps its place from layer to layer."""
    return [(c[0], c[1]) for c in aligned_maps_many(a, [b], layers)]


def aligned_maps_many(a, others: list, layers: list[int], layers_b: list[int] | None = None) -> list[list[np.ndarray]]:
    """:func:`aligned_maps` for A and several states of B at once (a job's epochs): per layer one exact PCA of A's
    and every other state's rows (each rotated onto A's) pooled, so moving between the states (an epoch slider)
    moves only what changed; each layer's map rotated onto the previous one. Returns per layer ``[A's coords, each
    other's coords]``. ``a`` and each of ``others`` are indexed by layer (arrays, or anything read one layer at a
    time); ``layers_b``: the others' layer paired with each of ``layers`` (default the same)."""
    out, previous = [], None
    for layer, other_layer in zip(layers, layers_b or layers, strict=True):
        x = np.asarray(a[layer], np.float64)
        ys = [np.asarray(o[other_layer], np.float64) for o in others]
        coords = map_layer(x, ys, [procrustes_rotation(x, y) for y in ys], previous)
        previous = np.concatenate(coords)
        out.append(coords)
    return out


def map_layer(x: np.ndarray, ys: list[np.ndarray], rotations: list[np.ndarray], previous: np.ndarray | None,
              ) -> list[np.ndarray]:
    """One layer of the shared map: ``[A's coords, each other's]`` from A's vectors ``x`` and the others' ``ys``
    rotated by ``rotations`` (each onto ``x``): exact PCA of them pooled, rotated onto ``previous`` (the layer
    before's pooled coords) by 2-D Procrustes. All zeros where a side's vectors are the same for every row (no
    direction to draw)."""
    from analysis.core.projection import exact_pca

    parts = [x, *(np.asarray(y, np.float64) @ r for y, r in zip(ys, rotations, strict=True))]
    pooled = np.concatenate(parts)
    flat = constant_layer(x) or any(constant_layer(y) for y in ys) or not np.ptp(pooled, axis=0).max() > 0
    coords = np.zeros((len(pooled), 2)) if flat else exact_pca(pooled)
    if previous is not None:
        coords = coords @ orthogonal_procrustes(coords, previous)[0]
    n = len(x)
    return [coords[i * n:(i + 1) * n] for i in range(len(parts))]


def pair_coords(coords: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One pair's and layer's rows of ``CompareResult.coords`` split into A's and B's by position (A's first, then
    B's, in the same row order), never by model name: a model compared with itself has the same name twice."""
    n = len(coords) // 2
    a, b = coords.iloc[:n], coords.iloc[n:]
    if len(coords) % 2 or not np.array_equal(a["example_id"].to_numpy(), b["example_id"].to_numpy()):
        raise ValueError("the shared map's rows are not one pair's A rows then B rows")
    return a, b


def compare_pair(a: np.ndarray, b: np.ndarray, names: tuple[str, str], inputs: TextInputs,
                 config: CompareConfig | None = None, oof_a: dict | None = None,
                 maps: bool = True) -> tuple[list, list, list, list]:
    """One pair's tables from the vectors ``a`` ``(L_A + 1, n, d)`` and ``b`` of the same rows of ``inputs`` (arrays
    or memory-mapped files: read two layers at a time, one of each, so memory stays bounded by two layers' vectors):
    ``(cross, summary, movers, coords)`` as lists of rows / frames (:class:`CompareResult`), per pair of layers
    (:func:`analysis.compare.checks.layer_pairs` under ``config.pairing``; ``layer_b`` columns when the depths
    differ). ``oof_a`` caches A's out-of-fold probe predictions per layer across pairs. ``maps=False``: no aligned
    map (a job's epochs share one, :func:`aligned_maps_many`). Where either side's vectors are the same for every
    row (:func:`analysis.core.cka.constant_layer`: layer 0's [CLS]) movement and neighbour overlap are NaN, as
    CKA is: nothing can move or have neighbours there (``movement_raw`` is kept: the two constants' distance).

    Its linear algebra is on ``hidden x hidden`` matrices (Procrustes' SVD, PCA's eigendecomposition): run it under
    ``threadpoolctl.threadpool_limits(1, "blas")`` (as :func:`compare` does). Measured on the 2-core machine with
    another process busy: OpenBLAS's two threads took 3.6 s for a 768 x 768 ``eigh`` that one thread does in 0.11 s
    (its threads spin-wait for the busy core)."""
    config = config or CompareConfig()
    from analysis.core.separability import out_of_fold

    name_a, name_b = names
    labels = np.asarray(inputs.labels) if inputs.labels else None
    baseline = majority_baseline(labels, labels)["accuracy"] if labels is not None else None
    ids = np.asarray(inputs.ids)
    oof_a = {} if oof_a is None else oof_a
    same_width = a.shape[2] == b.shape[2]
    pairs = layer_pairs(len(a), len(b), config.pairing)
    depths_differ = len(a) != len(b)
    matrix = cross_cka(a, b)
    cross = [{"model_b": name_b, "layer_a": i, "layer_b": j, "cka": float(matrix[i, j])}
             for i in range(len(a)) for j in range(len(b))]
    cka = paired_cka(a, b, [i for i, _ in pairs], config.seed, debiased=config.debiased,
                     layers_b=[j for _, j in pairs])
    maps = maps and same_width
    summary, movers, coords, previous = [], [], [], None
    for (layer, layer_b), row in zip(pairs, cka, strict=True):
        where = {"layer": layer, **({"layer_b": layer_b} if depths_differ else {})}
        nan = np.full(len(ids), np.nan)
        x, y = np.array(a[layer], np.float32), np.array(b[layer_b], np.float32)  # one layer each, read once
        rotation = procrustes_rotation(x, y) if same_width else None
        aligned, raw = movement(x, y, rotation) if same_width else (nan, nan)
        overlap = neighbour_overlap(x, y, config.neighbours)
        if constant_layer(x) or constant_layer(y):  # no direction: undefined, as CKA is
            aligned, overlap = nan, nan
        with np.errstate(invalid="ignore"):
            changed = float(np.mean(overlap < CHANGED)) if np.isfinite(overlap).all() else np.nan
        entry = {"model_a": name_a, "model_b": name_b, **where, "cka": row["cka"],
                 "cka_ci_low": row["ci_low"], "cka_ci_high": row["ci_high"],
                 "mean_movement": float(np.mean(aligned)), "median_movement": float(np.median(aligned)),
                 "neighbours_mostly_changed": changed}
        if labels is not None:
            if layer not in oof_a:
                oof_a[layer] = out_of_fold(x, labels, config.folds, config.seed)[0]
            predicted_a, predicted_b = oof_a[layer], out_of_fold(y, labels, config.folds, config.seed)[0]
            right_a, right_b = predicted_a == labels, predicted_b == labels
            low_a, high_a = wilson_interval(int(right_a.sum()), len(right_a))
            low_b, high_b = wilson_interval(int(right_b.sum()), len(right_b))
            test = mcnemar(right_a, right_b)
            entry |= {"probe_accuracy_a": float(right_a.mean()), "probe_ci_low_a": low_a, "probe_ci_high_a": high_a,
                      "probe_accuracy_b": float(right_b.mean()), "probe_ci_low_b": low_b, "probe_ci_high_b": high_b,
                      "probe_change": float(right_b.mean() - right_a.mean()), "mcnemar_a_only": test["a_only"],
                      "mcnemar_b_only": test["b_only"], "mcnemar_p": test["p_value"],
                      "probe_majority_baseline": baseline}
        summary.append(entry)
        movers.append(pd.DataFrame({"model_b": name_b, **where, "example_id": ids, "text": inputs.texts,
                                    **({"label": labels} if labels is not None else {}),
                                    "movement": aligned, "movement_raw": raw, "neighbour_overlap": overlap,
                                    **({"probe_prediction_a": predicted_a, "probe_prediction_b": predicted_b}
                                       if labels is not None else {})}))
        if maps:
            xy = map_layer(x.astype(np.float64), [y.astype(np.float64)], [rotation], previous)
            previous = np.concatenate(xy)
            for name, c in zip((name_a, name_b), xy, strict=True):
                coords.append(pd.DataFrame({"model_b": name_b, "model": name, **where, "example_id": ids,
                                            "x": c[:, 0], "y": c[:, 1]}))
    return cross, summary, movers, coords


def run_info(config: CompareConfig) -> dict:
    """What run.json says of every comparison: the options and what each number is."""
    info = {**config.to_dict(),
            "layers": "paired by index, 0 .. min(L_A, L_B); cka_cross.csv has every pair" if config.pairing == "index"
            else "paired by relative depth (layer / L): every hidden state of the shallower model with the deeper "
                 "one's nearest; cka_cross.csv has every pair",
            "cka_interval": "delete-one jackknife over the rows (of at most 1,000 of them, seeded), 95%, centred on "
                            "the CKA of all rows, clipped to CKA's range",
            "movement": "cosine distance after orthogonal Procrustes of B onto A, fitted on all rows",
            "neighbours_mostly_changed": f"share of rows keeping fewer than {CHANGED:.0%} of their "
                                         f"{config.neighbours} nearest neighbours (cosine)",
            "undefined_layers": "a layer whose vectors are the same for every row (constant: layer 0's [CLS] is the "
                                "[CLS] embedding plus position 0 whatever the text) has no CKA, interval, movement "
                                "or neighbour overlap: blank",
            "aligned_map": "per layer, exact PCA of A's vectors and B's rotated onto them (the rotation movement is "
                           "measured after), pooled; each layer's map rotated onto the previous layer's"}
    if config.reconstruction:
        info["reconstruction_scores"] = (
            f"token accuracy, unmasked, special tokens not counted; Wilson 95% per model; the change B - A with a "
            f"paired {RESAMPLES}-resample percentile bootstrap over sentences (seed = --seed) and an exact McNemar "
            "test on the same tokens; a pair is read only when both models have an MLM head (own or lent)")
    return info


def few_rows(n: int, models: list[LoadedModel]) -> dict:
    """``{"few_rows": why}`` when there are fewer rows than a model's hidden size (else nothing): the Procrustes
    rotation of B onto A is then fitted in more dimensions than the rows pin down."""
    width = max(m.anatomy.hidden_size for m in models)
    if n >= width:
        return {}
    return {"few_rows": f"{n:,} rows, fewer than the hidden size ({width:,}): the rotation of B onto A is fitted in "
                        "more dimensions than these rows pin down, so it fits more of the difference than it would "
                        "on more rows and movement comes out smaller (docs/compare.md); plain CKA is biased upward "
                        "too (debiased CKA is not)"}


def add_reconstruction(summary: list[dict], tokens_a, tokens_b, n_texts: int, seed: int) -> None:
    """Add :data:`analysis.compare.recon.COLUMNS` to a pair's per-layer rows, at each row's pair of layers
    (``layer``, ``layer_b``); blank unless both sides were read."""
    if tokens_a is not None and tokens_b is not None:
        pairs = [(e["layer"], e.get("layer_b", e["layer"])) for e in summary]
        rows = reconstruction_rows(tokens_a, tokens_b, n_texts, seed, pairs=pairs)
    else:
        rows = []
    for entry, row in zip(summary, rows, strict=False):
        entry |= {c: row.get(c, np.nan) for c in COLUMNS}
    for entry in summary[len(rows):]:
        entry |= dict.fromkeys(COLUMNS, np.nan)


def add_head_predictions(movers: list[pd.DataFrame], a: list[str] | None, b: list[str] | None) -> None:
    """``head_prediction_a``/``_b`` (each model's own classifier's prediction, the same at every layer; blank for a
    model without one) in a pair's movers frames, when either model has a classifier head."""
    if a is None and b is None:
        return
    for frame in movers:
        at = frame.columns.get_loc("neighbour_overlap") + 1
        frame.insert(at, "head_prediction_b", b if b is not None else None)
        frame.insert(at, "head_prediction_a", a if a is not None else None)


def compare(models: list[LoadedModel], inputs: TextInputs, config: CompareConfig | None = None,
            progress=None, names: list[str] | None = None, reconstruct=None, predict=None) -> CompareResult:
    """Compare ``models[1:]`` each with ``models[0]`` on ``inputs`` (module docstring). ``names``: how the tables
    name each model (default its ``spec.name``; ``job #3 (cls, demo)`` for a job's checkpoint). What another
    technique reads is passed in (the task layer's :func:`analysis.tasks.comparing.compare` passes both):
    ``reconstruct(models, inputs, config, progress, names=...)``, each model's reconstruction probe as
    ``({model index: per-token table}, {model index: how it was read, or why not})``, and ``predict(model, inputs,
    max_length, batch_size)``, a model's own classifier's ``(class per row, which head)``. Without them the
    reconstruction columns are blank (run.json says why) and there are no head predictions."""
    config = config or CompareConfig()
    from analysis.core.vectors import representations

    names = list(names) if names is not None else [m.spec.name for m in models]
    if len(models) < 2:
        raise InputError("comparing needs at least two models")
    twice = [n for n in dict.fromkeys(names[1:]) if names[1:].count(n) > 1]
    if twice:
        raise InputError(f"'{twice[0]}' is given twice as a model to compare with the first: give each once")
    check_rows(inputs, config.folds, config.debiased)
    for other in models[1:]:
        same_tokenizer(models[0], other)
    same_tokens(models, inputs, config.max_length, names)
    start = time.perf_counter()
    # memory-mapped from the cache: the comparison reads two layers at a time (compare_pair)
    reps = [representations(m, inputs, config.pooling, config.max_length, config.batch_size, progress,
                            mmap=True)[0] for m in models]
    if not config.reconstruction:
        tokens, why = {}, {}
    elif reconstruct is None:
        tokens, why = {}, dict.fromkeys(range(len(models)), "not read: no reconstruction probe was given")
    else:
        tokens, why = reconstruct(models, inputs, config, progress, names=names)
    own = [predict(m, inputs, config.max_length, config.batch_size) if predict else (None, None) for m in models]
    cross, summary, movers, coords = [], [], [], []
    oof_a: dict = {}
    for i, b in enumerate(reps[1:], start=1):
        with threadpool_limits(1, user_api="blas"):  # see compare_pair
            parts = compare_pair(reps[0], b, (names[0], names[i]), inputs, config, oof_a)
        if config.reconstruction:
            add_reconstruction(parts[1], tokens.get(0), tokens.get(i), len(inputs), config.seed)
        add_head_predictions(parts[2], own[0][0], own[i][0])
        for whole, part in zip((cross, summary, movers, coords), parts, strict=True):
            whole += part
    states = [len(r) for r in reps]
    info = {**run_info(config), "models": [m.spec.name for m in models], "names": names,
            "fingerprints": [m.fingerprint for m in models], "rows": len(inputs),
            "layer_names": [m.anatomy.layer_names() for m in models],
            "layer_pairs": [pairing_info(states[0], states[i], layer_pairs(states[0], states[i], config.pairing),
                                         config.pairing, names[i]) for i in range(1, len(models))],
            **few_rows(len(inputs), models),
            **({"poolings": [m.pooling for m in models]} if config.pooling == "model" else {}),
            "head_predictions": {name: o[1] for name, o in zip(names, own, strict=True)},
            "seconds": round(time.perf_counter() - start, 3)}
    if config.reconstruction:
        info |= {"mlm_heads": {name: m.mlm_head for name, m in zip(names, models, strict=True)},
                 "reconstruction": {name: why[i] for i, name in enumerate(names)}}
    return CompareResult(pd.DataFrame(cross), pd.DataFrame(summary),
                         pd.concat(movers, ignore_index=True) if movers else pd.DataFrame(),
                         pd.concat(coords, ignore_index=True) if coords else pd.DataFrame(), info)
