"""Compare checkpoints layer by layer on the same rows (issue 28; Merchant et al. 2020, "What happens to BERT
embeddings during fine-tuning?"; Kao et al. 2020 Fig. 2): the first model is the reference A, each other model B is
compared with it.

Per pair and per layer (paired by index, ``0 .. min(L_A, L_B)``; the cross matrix has every pair of layers):
- linear CKA of A's and B's layer-l sentence vectors with a bootstrap interval (debiased CKA as an option),
  :mod:`analysis.compare.cka`;
- with labels: each model's linear-probe accuracy (the atlas's probe, the same folds for both, Wilson interval)
  and an exact McNemar test on the paired out-of-fold predictions;
- movers: each example's cosine distance after Procrustes alignment, raw, and its 10-nearest-neighbour overlap
  (:mod:`analysis.compare.movers`);
- one aligned map: PCA of A's and B's vectors pooled, each layer's map rotated onto the previous one.
Vectors come from the atlas's cache (:func:`analysis.projection.representations`): a model already extracted on
these rows is not extracted again.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd
from scipy.linalg import orthogonal_procrustes
from threadpoolctl import threadpool_limits

from analysis.compare.cka import cross_cka, paired_cka
from analysis.compare.movers import mcnemar, movement, neighbour_overlap
from analysis.compare.predictions import own_predictions
from analysis.compare.recon import COLUMNS, RESAMPLES, one_sided_rows, reconstruction_rows
from analysis.inputs import InputError, TextInputs
from analysis.scores import wilson_interval
from models.loading import LoadedModel

NEIGHBOURS = 10
CHANGED = 0.5  # an example whose neighbours "mostly changed": fewer than half of its 10 nearest are kept


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    pooling: str = "cls"
    max_length: int | None = None
    batch_size: int = 32
    folds: int = 5
    seed: int = 0
    debiased: bool = False
    neighbours: int = NEIGHBOURS
    reconstruction: bool = True  # each model read by its MLM head (own or lent): analysis.compare.recon

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class CompareResult:
    """``cka_cross``: model_b, layer_a, layer_b, cka; ``layer_summary``: one row per (model_b, layer);
    ``movers``: one row per (model_b, layer, example); ``coords``: model, layer, example_id, x, y; ``info``."""

    cka_cross: pd.DataFrame
    layer_summary: pd.DataFrame
    movers: pd.DataFrame
    coords: pd.DataFrame
    info: dict


def same_tokenizer(a: LoadedModel, b: LoadedModel) -> None:
    """Refuse a pair whose tokenizers differ (vocabulary or class): their token positions do not correspond."""
    ta, tb = a.tokenizer, b.tokenizer
    if type(ta).__name__ != type(tb).__name__ or ta.get_vocab() != tb.get_vocab():
        raise InputError(f"'{a.spec.name}' and '{b.spec.name}' use different tokenizers: a layer-by-layer comparison "
                         "needs the same tokens; only sentence-level comparisons would be possible between them")


def aligned_maps(a: np.ndarray, b: np.ndarray, layers: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer, 2-D coordinates of A's and B's rows in one space: exact PCA of the two pooled, then rotated (or
    reflected) onto the previous layer's map by 2-D orthogonal Procrustes, so a point whose vectors do not change
    keeps its place from layer to layer."""
    return [(c[0], c[1]) for c in aligned_maps_many(a, [b], layers)]


def aligned_maps_many(a, others: list, layers: list[int]) -> list[list[np.ndarray]]:
    """:func:`aligned_maps` for A and several states of B at once (a job's epochs): per layer one exact PCA of A's
    and every other state's rows pooled, so moving between the states (an epoch slider) moves only what changed;
    each layer's map rotated onto the previous one. Returns per layer ``[A's coords, each other's coords]``.
    ``a`` and each of ``others`` are indexed by layer (arrays, or anything read one layer at a time)."""
    from analysis.projection import exact_pca

    out, previous = [], None
    for layer in layers:
        parts = [np.asarray(a[layer], np.float64), *(np.asarray(o[layer], np.float64) for o in others)]
        n = len(parts[0])
        pooled = np.concatenate(parts)
        coords = exact_pca(pooled) if np.ptp(pooled, axis=0).max() > 0 else np.zeros((len(pooled), 2))
        if previous is not None:
            coords = coords @ orthogonal_procrustes(coords, previous)[0]
        previous = coords
        out.append([coords[i * n:(i + 1) * n] for i in range(len(parts))])
    return out


def compare_pair(a: np.ndarray, b: np.ndarray, names: tuple[str, str], inputs: TextInputs,
                 config: CompareConfig = CompareConfig(), oof_a: dict | None = None,
                 maps: bool = True) -> tuple[list, list, list, list]:
    """One pair's tables from the vectors ``a`` ``(L_A + 1, n, d)`` and ``b`` of the same rows of ``inputs`` (arrays
    or memory-mapped files: read two layers at a time, one of each, so memory stays bounded by two layers' vectors):
    ``(cross, summary, movers, coords)`` as lists of rows / frames (:class:`CompareResult`). ``oof_a`` caches A's
    out-of-fold probe predictions per layer across pairs. ``maps=False``: no aligned map (a job's epochs share one,
    :func:`aligned_maps_many`).

    Its linear algebra is on ``hidden x hidden`` matrices (Procrustes' SVD, PCA's eigendecomposition): run it under
    ``threadpoolctl.threadpool_limits(1, "blas")`` (as :func:`compare` does). Measured on the 2-core machine with
    another process busy: OpenBLAS's two threads took 3.6 s for a 768 x 768 ``eigh`` that one thread does in 0.11 s
    (its threads spin-wait for the busy core)."""
    from analysis.projection import out_of_fold

    name_a, name_b = names
    labels = np.asarray(inputs.labels) if inputs.labels else None
    ids = np.asarray(inputs.ids)
    oof_a = {} if oof_a is None else oof_a
    same_width = a.shape[2] == b.shape[2]
    layers = list(range(min(len(a), len(b))))
    matrix = cross_cka(a, b)
    cross = [{"model_b": name_b, "layer_a": i, "layer_b": j, "cka": float(matrix[i, j])}
             for i in range(len(a)) for j in range(len(b))]
    cka = paired_cka(a, b, layers, config.seed, debiased=config.debiased)
    maps = aligned_maps(a, b, layers) if same_width and maps else []
    summary, movers, coords = [], [], []
    for layer, row in zip(layers, cka, strict=True):
        nan = np.full(len(ids), np.nan)
        x, y = np.array(a[layer], np.float32), np.array(b[layer], np.float32)  # one layer each, read once
        aligned, raw = movement(x, y) if same_width else (nan, nan)
        overlap = neighbour_overlap(x, y, config.neighbours)
        entry = {"model_a": name_a, "model_b": name_b, "layer": layer, "cka": row["cka"],
                 "cka_ci_low": row["ci_low"], "cka_ci_high": row["ci_high"],
                 "mean_movement": float(np.mean(aligned)), "median_movement": float(np.median(aligned)),
                 "neighbours_mostly_changed": float(np.mean(overlap < CHANGED))}
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
                      "mcnemar_b_only": test["b_only"], "mcnemar_p": test["p_value"]}
        summary.append(entry)
        movers.append(pd.DataFrame({"model_b": name_b, "layer": layer, "example_id": ids, "text": inputs.texts,
                                    **({"label": labels} if labels is not None else {}),
                                    "movement": aligned, "movement_raw": raw, "neighbour_overlap": overlap,
                                    **({"probe_prediction_a": predicted_a, "probe_prediction_b": predicted_b}
                                       if labels is not None else {})}))
        if maps:
            for name, c in ((name_a, maps[layer][0]), (name_b, maps[layer][1])):
                coords.append(pd.DataFrame({"model_b": name_b, "model": name, "layer": layer, "example_id": ids,
                                            "x": c[:, 0], "y": c[:, 1]}))
    return cross, summary, movers, coords


def run_info(config: CompareConfig) -> dict:
    """What run.json says of every comparison: the options and what each number is."""
    info = {**config.to_dict(),
            "layers": "paired by index, 0 .. min(L_A, L_B); cka_cross.csv has every pair",
            "cka_interval": "delete-one jackknife over the rows (of at most 1,000 of them, seeded), 95%, clipped to "
                            "CKA's range",
            "movement": "cosine distance after orthogonal Procrustes of B onto A, fitted on all rows",
            "neighbours_mostly_changed": f"share of rows keeping fewer than {CHANGED:.0%} of their "
                                         f"{config.neighbours} nearest neighbours (cosine)"}
    if config.reconstruction:
        info["reconstruction_scores"] = (
            f"token accuracy, unmasked, special tokens not counted; Wilson 95% per model; the change B - A with a "
            f"paired {RESAMPLES}-resample percentile bootstrap over sentences (seed = --seed) and an exact McNemar "
            "test on the same tokens")
    return info


def reconstructions(models: list[LoadedModel], inputs: TextInputs, config: CompareConfig,
                    progress=None) -> tuple[dict[int, object], dict[int, str]]:
    """Each model's reconstruction probe on ``inputs`` (:mod:`analysis.compare.recon`): ``({model index: per-token
    table}, {model index: which head read it, or why it was not read})``. A model listed twice is probed once."""
    from analysis.reconstruction import ProbeConfig, probe, require_mlm_head

    probe_config = ProbeConfig(top_k=1, batch_size=config.batch_size, max_length=config.max_length)
    tokens, why, done = {}, {}, {}
    for i, m in enumerate(models):
        try:
            require_mlm_head(m)
        except InputError as exc:
            why[i] = f"not read: {exc}"
            continue
        key = m.spec.resolved()
        if key not in done:
            report = (lambda k, n, name=m.spec.name: progress(f"reconstruction of {name}", k, n)) if progress else None
            done[key] = probe(m, inputs, probe_config, progress=report).tokens
        tokens[i] = done[key]
        why[i] = "read by its own MLM head" if m.mlm_head == "own" else f"read by the MLM head {m.mlm_head}"
    return tokens, why


def add_reconstruction(summary: list[dict], tokens_a, tokens_b, n_texts: int, seed: int) -> None:
    """Add :data:`analysis.compare.recon.COLUMNS` to a pair's per-layer rows (blank on a side not read)."""
    layers = len(summary)
    if tokens_a is not None and tokens_b is not None:
        rows = reconstruction_rows(tokens_a, tokens_b, n_texts, seed)
    elif tokens_a is not None or tokens_b is not None:
        rows = one_sided_rows(tokens_a if tokens_a is not None else tokens_b, n_texts,
                              "a" if tokens_a is not None else "b", layers)
    else:
        rows = [dict.fromkeys(COLUMNS, np.nan) for _ in range(layers)]
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


def compare(models: list[LoadedModel], inputs: TextInputs, config: CompareConfig = CompareConfig(),
            progress=None, names: list[str] | None = None) -> CompareResult:
    """Compare ``models[1:]`` each with ``models[0]`` on ``inputs`` (module docstring). ``names``: how the tables
    name each model (default its ``spec.name``; ``job #3 (cls, demo)`` for a job's checkpoint)."""
    from analysis.projection import representations

    names = list(names) if names is not None else [m.spec.name for m in models]
    if len(models) < 2:
        raise InputError("comparing needs at least two models")
    for other in models[1:]:
        same_tokenizer(models[0], other)
    start = time.perf_counter()
    # memory-mapped from the cache: the comparison reads two layers at a time (compare_pair)
    reps = [representations(m, inputs, config.pooling, config.max_length, config.batch_size, progress,
                            mmap=True)[0] for m in models]
    tokens, why = reconstructions(models, inputs, config, progress) if config.reconstruction else ({}, {})
    own = [own_predictions(m, inputs, config.max_length, config.batch_size) for m in models]
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
    info = {**run_info(config), "models": [m.spec.name for m in models], "names": names,
            "fingerprints": [m.fingerprint for m in models], "rows": len(inputs),
            "head_predictions": {name: o[1] for name, o in zip(names, own, strict=True)},
            "seconds": round(time.perf_counter() - start, 3)}
    if config.reconstruction:
        info |= {"mlm_heads": {name: m.mlm_head for name, m in zip(names, models, strict=True)},
                 "reconstruction": {name: why[i] for i, name in enumerate(names)}}
    return CompareResult(pd.DataFrame(cross), pd.DataFrame(summary),
                         pd.concat(movers, ignore_index=True) if movers else pd.DataFrame(),
                         pd.concat(coords, ignore_index=True) if coords else pd.DataFrame(), info)
