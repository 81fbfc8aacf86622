"""Layer atlas: each layer's sentence vectors, projected to 2-D, and how separable the classes are per layer.

Song et al. (2020) §3.3.1 / Fig. 2: PCA of every layer's [CLS] vector, coloured by class. Sun et al. (2019)
§5.3.2 / Tab. 3: which layer's features classify best. For every hidden state ``0..L`` (0 = embeddings) this
module gives

- the sentence vector: the first token's state ([CLS], ``<s>``) or the mean over counted (non-special) tokens;
  cached on disk by model fingerprint, data hash, pooling and max length (:mod:`analysis.core.store`);
- 2-D coordinates by exact PCA (:func:`exact_pca`: float64, never randomized; on the GPU when there is one),
  UMAP or t-SNE. PCA axes may be sign-flipped to line up with the previous layer's; nothing else changes the
  coordinates (a layer whose vectors are all the same, as [CLS] at the embeddings, is drawn at the origin
  rather than as rounding noise);
- separability on the full vectors: silhouette (euclidean) and a linear probe (standardised logistic
  regression, stratified k-fold: mean and std of accuracy; macro-F1 and a 95% Wilson interval of the pooled
  out-of-fold predictions; the majority-class baseline);
- a layer x layer linear CKA matrix (Kornblith et al. 2019).
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from analysis.core.activations import (
    bucket_indices,
    counted_mask,
    encode,
    halving_on_oom,
    hidden_states,
    make_batch,
    max_input_length,
)
from analysis.core.cka import constant_layers, linear_cka
from analysis.core.inputs import InputError, TextInputs, check_row_limit
from analysis.core.parallel import ONE, Ranks
from analysis.core.precision import model_mode
from analysis.core.scores import wilson_interval
from analysis.core.store import ArrayStore, key_of
from analysis.options import ATLAS_METHODS, ATLAS_POOLINGS, COLOR_BY
from models.loading import LoadedModel, load_model, split_pooling

POOLINGS, METHODS = ATLAS_POOLINGS, ATLAS_METHODS
METHOD_NAMES = {"pca": "PCA", "umap": "UMAP", "tsne": "t-SNE"}
SILHOUETTE_MAX_ROWS = 10_000  # above this the silhouette is computed on a seeded sample of this size (reported)
Progress = Callable[[str, int, int], None]  # (stage, done, total)


def max_rows() -> int:
    """The atlas' row limit (``LAYERLENS_ATLAS_MAX_ROWS``, default 20,000)."""
    return int(os.environ.get("LAYERLENS_ATLAS_MAX_ROWS", 20_000))


@dataclasses.dataclass(frozen=True)
class AtlasConfig:
    pooling: str = "cls"
    method: str = "pca"
    layers: str = "-6:"  # "all", a Python slice such as "-6:", or a list such as "0,4,8"
    max_length: int | None = None
    batch_size: int = 32
    folds: int = 5
    seed: int = 0
    color_by: str = "label"  # or, for a classifier checkpoint, its own "prediction" or whether it is "correct"

    def __post_init__(self):
        if self.color_by not in COLOR_BY:
            raise InputError(f"unknown colouring '{self.color_by}'; choose one of {', '.join(COLOR_BY)}")
        if self.pooling not in POOLINGS:
            raise InputError(f"unknown pooling '{self.pooling}'; choose one of {', '.join(POOLINGS)}")
        if self.method not in METHODS:
            raise InputError(f"unknown method '{self.method}'; choose one of {', '.join(METHODS)}")
        if self.folds < 2:
            raise InputError(f"the linear probe needs at least 2 folds, got {self.folds}")
        if self.batch_size < 1 or (self.max_length is not None and self.max_length < 2):
            raise InputError("batch size must be at least 1 and max length at least 2")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def parse_layers(spec: str, n_states: int) -> list[int]:
    """Hidden-state indices from ``"all"``, a slice (``"-6:"``, ``"2:8"``) or a list (``"0,4,8"``; negatives count
    from the end). ``n_states`` is ``L + 1``."""
    text = (spec or "").strip().lower()
    if not text:
        raise InputError(f"no layers given: use all, a slice such as -6: or a list such as 0,4,8 (hidden states "
                         f"0..{n_states - 1})")
    try:
        if text == "all":
            chosen = list(range(n_states))
        elif ":" in text:
            parts = [int(p) if p.strip() else None for p in text.split(":")]
            if len(parts) > 3:
                raise ValueError
            # "-6:" on a model with fewer states means all of them (layers_note says so); any other bound
            # outside the model is an error, not a quietly clamped slice
            outside = [b for i, b in enumerate(parts[:2]) if b is not None and not -n_states <= b <= n_states
                       and not (i == 0 and b < 0 and (len(parts) < 2 or parts[1] is None))]
            if outside:
                raise InputError(f"layer {outside[0]} in '{spec}' does not exist: this model has hidden states "
                                 f"0..{n_states - 1} (-{n_states}..-1 from the end)")
            chosen = list(range(n_states))[slice(*parts)]
        else:
            chosen = []
            for p in text.split(","):
                i = int(p)
                if not -n_states <= i < n_states:
                    raise InputError(f"layer {i} does not exist: this model has hidden states 0..{n_states - 1}")
                chosen.append(i % n_states)
    except InputError:
        raise
    except ValueError:
        raise InputError(f"cannot read layers '{spec}': use all, a slice such as -6: or a list such as 0,4,8") from None
    chosen = list(dict.fromkeys(chosen))
    if not chosen:
        raise InputError(f"layers '{spec}' selects no layer of 0..{n_states - 1}")
    return chosen


def layers_note(spec: str, n_states: int) -> str | None:
    """What to tell the user when ``spec`` asks for more of the last layers than the model has (``-6:`` on 5
    hidden states: all 5 are used)."""
    text = (spec or "").strip()
    if text.startswith("-") and text.endswith(":") and text[1:-1].isdigit() and int(text[1:-1]) > n_states:
        return f"layers {text} asks for the last {text[1:-1]} hidden states; this model has {n_states}: all are shown"
    return None


def check_labels(labels: tuple[str, ...] | None, folds: int) -> dict[str, int]:
    """Class counts, or an :class:`InputError` saying why these labels cannot be analysed."""
    if labels is None:
        raise InputError("no label column: the atlas colours and scores layers by class; choose the label column")
    counts = pd.Series(labels).value_counts().to_dict()
    if len(counts) < 2:
        only = next(iter(counts), "")
        raise InputError(f"the label column has a single class ('{only}'): separability needs at least two")
    if len(labels) < folds:
        raise InputError(f"{len(labels)} rows are fewer than the {folds} folds of the linear probe")
    rare = min(counts, key=counts.get)
    if counts[rare] < folds:
        raise InputError(f"class '{rare}' has {counts[rare]} row(s); the {folds}-fold linear probe needs at least "
                         f"{folds} per class (use fewer folds, or drop or merge that class)")
    return counts


# --- representations ---------------------------------------------------------------------------------------

@torch.inference_mode()
def extract(loaded: LoadedModel, inputs: TextInputs, pooling: str = "cls", max_length: int | None = None,
            batch_size: int = 32, progress: Progress | None = None, ranks: Ranks = ONE,
            truncation: str = "head") -> np.ndarray | None:
    """``(L + 1, n, hidden)`` float32: every hidden state's sentence vector per text, in input order.

    Under a launcher (``ranks``) each process pools its share of the batches and the main process, which alone
    gets the array (others get None) and reports progress, puts them in place (:mod:`analysis.core.parallel`).

    ``pooling``: ``cls`` (the first token), ``mean`` (over counted, non-special tokens) or ``model``: a sentence
    encoder's own pooling, exactly as sentence-transformers computes it (its mean and max run over every token
    the attention mask keeps, specials included; then its ``Normalize`` module where ``modules.json`` lists
    one).

    ``truncation``: which tokens of a text over ``max_length`` are kept (``head``, ``tail``, ``head+tail``:
    :func:`analysis.core.activations.encode_truncated`); a fine-tuning job's own choice when its vectors are compared
    with these (:mod:`analysis.compare.epochs`)."""
    if pooling == "model":
        if loaded.pooling is None:
            raise InputError(f"'{loaded.spec.name}' has no pooling of its own (it is not a sentence-transformers "
                             "model): choose cls or mean")
        mode, normalize = split_pooling(loaded.pooling)
        pooling = {"cls": "cls", "mean": "mask-mean", "max": "mask-max"}[mode]
    else:
        normalize = False
    tokenizer = loaded.tokenizer
    max_length = min(max_length or 10**9, max_input_length(loaded))
    encoded = encode(tokenizer, inputs, max_length, truncation)
    if ranks.is_main:
        out = np.empty((loaded.num_layers + 1, len(encoded), loaded.anatomy.hidden_size), np.float32)
    special_ids = list(tokenizer.all_special_ids)
    done = 0

    def run(idx: list[int]):
        batch = make_batch(encoded, idx, tokenizer.pad_token_id, loaded.spec.device)
        states = torch.stack(hidden_states(loaded, batch))  # (L + 1, batch, seq, hidden)
        if pooling == "cls":
            pooled = states[:, :, 0]
        elif pooling == "mask-max":
            keep = batch.attention_mask.bool()[None, :, :, None]
            pooled = states.masked_fill(~keep, torch.finfo(states.dtype).min).amax(2)
        else:
            weights = (batch.attention_mask if pooling == "mask-mean" else
                       counted_mask(batch, special_ids, include_special=False)).to(states.dtype)
            pooled = (states * weights[None, :, :, None]).sum(2) / weights.sum(1).clamp(min=1)[None, :, None]
        if normalize:  # sentence-transformers' Normalize module: each sentence vector to unit L2 norm
            pooled = torch.nn.functional.normalize(pooled.float(), p=2, dim=-1)
        return idx, pooled.float().cpu().numpy()

    plan = ranks.broadcast(list(bucket_indices(encoded, batch_size, loaded)) if ranks.is_main else None)
    for idx in ranks.steps(plan):
        gathered = ranks.gather(list(halving_on_oom(run, idx)) if idx is not None else [])
        if not ranks.is_main:
            continue
        for part, pooled in (p for rank_parts in gathered for p in rank_parts):
            out[:, part] = pooled
            done += len(part)
        if progress:
            progress("extracting", done, len(encoded))
    return out if ranks.is_main else None


def representations(loaded: LoadedModel, inputs: TextInputs, pooling: str = "cls", max_length: int | None = None,
                    batch_size: int = 32, progress: Progress | None = None,
                    store: ArrayStore | None = None, ranks: Ranks = ONE,
                    truncation: str = "head", mmap: bool = False) -> tuple[np.ndarray | None, bool]:
    """:func:`extract`, read from the disk cache when this model, data, pooling, max length (and truncation, when
    not ``head``) were seen before. Returns ``(array, cache_hit)``. Labels and batch size do not change the
    vectors, so not the key. ``mmap``: the cached array memory-mapped (read a layer at a time; the comparison of
    checkpoints holds two layers), also right after an extraction (the array as extracted if it could not be
    cached).
    Under a launcher the processes share the extraction; the main process reads and writes the cache and alone
    gets the array."""
    store = store or ArrayStore()
    data = dataclasses.replace(inputs, labels=None, row_ids=None, skipped_empty=0, dropped_over_limit=0)
    key = key_of(model=loaded.fingerprint, data=data.content_hash(),
                 pooling=f"model:{loaded.pooling}" if pooling == "model" else pooling,
                 max_length=min(max_length or 10**9, max_input_length(loaded)),
                 **({"truncation": truncation} if truncation != "head" else {}))
    cached = store.get("representations", key, mmap=mmap) if ranks.is_main else None
    if ranks.broadcast(cached is not None and cached.shape[:2] == (loaded.num_layers + 1, len(inputs))):
        return cached, True
    reps = extract(loaded, inputs, pooling, max_length, batch_size, progress, ranks, truncation)
    if ranks.is_main:
        store.put("representations", key, reps)
        if mmap and (mapped := store.get("representations", key, mmap=True)) is not None:
            reps = mapped
    return reps, False


# --- projections ---------------------------------------------------------------------------------------------

def project(x: np.ndarray, method: str = "pca", seed: int = 0, device: str = "cpu", variance: bool = False):
    """``(n, 2)`` coordinates of ``x`` ``(n, d)``; with ``variance`` also the share of the variance on each
    axis (PCA's, :func:`exact_pca`; None for UMAP and t-SNE, whose axes explain no variance)."""
    n = x.shape[0]
    if n < 3:
        raise InputError(f"{n} row(s) are too few to project; give at least 3")
    if method == "pca":
        return exact_pca(x, device=device, variance=variance)
    if variance:
        return project(x, method, seed, device), None
    if method == "umap":
        import umap

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "n_jobs overridden by random_state" and numba chatter
            return umap.UMAP(n_components=2, n_neighbors=min(15, n - 1), random_state=seed).fit_transform(x)
    if method == "tsne":
        from sklearn.manifold import TSNE

        return TSNE(n_components=2, perplexity=min(30.0, (n - 1) / 3), init="pca", random_state=seed).fit_transform(x)
    raise InputError(f"unknown method '{method}'; choose one of {', '.join(METHODS)}")


def exact_pca(x: np.ndarray, components: int = 2, device: str = "cpu", variance: bool = False):
    """``(n, components)`` exact principal-component scores of ``x`` ``(n, d)``, in float64 whatever the size:
    the eigendecomposition of the ``d x d`` covariance when ``n >= d`` (one pass over the rows; on a GPU there
    when ``device`` is CUDA), a full SVD of the centred matrix otherwise. Never randomized: on a flat spectrum a
    randomized solver's axes drift by tens of degrees. Each axis's sign makes its largest score positive.

    With ``variance``: ``(scores, ratio)``, ``ratio`` the share of the total variance on each axis (its
    eigenvalue, or squared singular value, over their sum: scikit-learn's ``explained_variance_ratio_``)."""
    if device.startswith("cuda"):
        t = torch.as_tensor(x, device=device, dtype=torch.float64)
        t = t - t.mean(0)
        if t.shape[0] >= t.shape[1]:
            values, vectors = torch.linalg.eigh(t.T @ t)  # ascending eigenvalues
            scores, top = t @ vectors[:, -components:].flip(1), values[-components:].flip(0)
        else:
            u, s, _ = torch.linalg.svd(t, full_matrices=False)
            scores, top = u[:, :components] * s[:components], s[:components].square()
        scores, ratio = scores.cpu().numpy(), (top / t.square().sum()).cpu().numpy()
    else:
        centred = np.asarray(x, dtype=np.float64)
        centred = centred - centred.mean(0)
        if centred.shape[0] >= centred.shape[1]:
            values, vectors = np.linalg.eigh(centred.T @ centred)
            scores, top = centred @ vectors[:, ::-1][:, :components], values[::-1][:components]
        else:
            u, s, _ = np.linalg.svd(centred, full_matrices=False)
            scores, top = u[:, :components] * s[:components], s[:components] ** 2
        ratio = top / np.square(centred).sum()
    rows = np.abs(scores).argmax(0)
    scores = scores * np.sign(scores[rows, np.arange(scores.shape[1])])
    return (scores, ratio) if variance else scores


def align_signs(coords: list[np.ndarray]) -> list[np.ndarray]:
    """Flip each axis of each layer's PCA coordinates so it points the same way as the previous layer's
    (positive inner product). Only signs change."""
    out = [coords[0]] if coords else []
    for c in coords[1:]:
        signs = np.where((c * out[-1]).sum(0) < 0, -1.0, 1.0)
        out.append(c * signs)
    return out


def project_layers(reps: np.ndarray, layers: list[int], method: str = "pca", seed: int = 0, device: str = "cpu",
                   constant: list[int] | None = None, progress=None, variance: bool = False):
    """``(n, 2)`` coordinates of each of ``layers`` of ``reps`` ``(S, n, d)``: a constant layer (every row the
    same vector) at the origin rather than as projected rounding noise; PCA axes sign-aligned layer to layer.
    ``progress(done, total)`` is called with 0 before the first layer (the projection is a stage of its own)
    and after each. With ``variance``: ``(coords, ratios)``, ``ratios`` per layer the share of the variance
    on each PCA axis (:func:`exact_pca`), None for a constant layer or another method."""
    constant = constant_layers(reps) if constant is None else constant
    coords, ratios = [], []
    if progress:
        progress(0, len(layers))
    for n, layer in enumerate(layers):
        if layer in constant:
            coords.append(np.zeros((reps.shape[1], 2)))
            ratios.append(None)
        else:
            c, ratio = project(reps[layer], method, seed, device, variance=True)
            coords.append(c)
            ratios.append(None if ratio is None else tuple(float(r) for r in ratio))
        if progress:
            progress(n + 1, len(layers))
    coords = align_signs(coords) if method == "pca" else coords
    return (coords, ratios) if variance else coords


# --- separability and similarity -----------------------------------------------------------------------------

SEPARABILITY_COLUMNS = ["layer", "silhouette", "probe_accuracy", "probe_accuracy_std", "probe_macro_f1",
                        "probe_ci_low", "probe_ci_high", "majority_baseline"]


SEPARABILITY_HEADERS = {
    "probe_accuracy": ("probe accuracy", "linear probe, mean over the stratified folds"),
    "probe_accuracy_std": ("std over folds", "numpy std (ddof 0) of the fold accuracies"),
    "probe_macro_f1": ("probe macro-F1", "of the pooled out-of-fold predictions"),
    "probe_ci_low": ("95% CI low (Wilson)", "Wilson interval of the pooled out-of-fold accuracy"),
    "probe_ci_high": ("95% CI high (Wilson)", "see 95% CI low"),
    "majority_baseline": ("majority class", "accuracy of always predicting the most frequent class"),
}


def out_of_fold(x: np.ndarray, labels: np.ndarray, folds: int = 5, seed: int = 0) -> tuple[np.ndarray, list[float]]:
    """The linear probe's out-of-fold predictions of ``x`` ``(n, d)`` (every row predicted once, by the fold that
    did not train on it) and each fold's accuracy: ``StandardScaler -> LogisticRegression(max_iter=1000)``,
    ``StratifiedKFold(folds, shuffle=True, random_state=seed)``. The same folds for the same labels and seed, so
    two models' predictions of the same rows pair up (:mod:`analysis.compare`'s McNemar test)."""
    from sklearn.base import clone
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    oof, scores = np.empty_like(labels), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for fit, held in StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, labels):
            oof[held] = clone(probe).fit(x[fit], labels[fit]).predict(x[held])
            scores.append(float((oof[held] == labels[held]).mean()))
    return oof, scores


def separability(x: np.ndarray, labels: np.ndarray, folds: int = 5, seed: int = 0) -> dict:
    """Silhouette and a cross-validated linear probe of vectors ``x`` ``(n, d)`` with ``labels``.

    Silhouette: euclidean on the full vectors (a seeded sample of ``SILHOUETTE_MAX_ROWS`` above that size).
    Probe: ``StandardScaler -> LogisticRegression(max_iter=1000)``, ``StratifiedKFold(folds, shuffle=True,
    random_state=seed)``: ``probe_accuracy`` is the mean over folds and ``probe_accuracy_std`` numpy's std
    (``ddof=0``); ``probe_macro_f1`` and the 95% Wilson interval (``probe_ci_low``, ``probe_ci_high``) are of the
    pooled out-of-fold predictions (every row predicted once); ``majority_baseline`` is the accuracy of always
    predicting the most frequent class.
    """
    from sklearn.metrics import f1_score, silhouette_score

    sample = SILHOUETTE_MAX_ROWS if len(x) > SILHOUETTE_MAX_ROWS else None
    sil = float(silhouette_score(x, labels, metric="euclidean", sample_size=sample, random_state=seed))
    oof, scores = out_of_fold(x, labels, folds, seed)
    low, high = wilson_interval(int((oof == labels).sum()), len(labels))
    _, counts = np.unique(labels, return_counts=True)
    return {"silhouette": sil, "probe_accuracy": float(np.mean(scores)), "probe_accuracy_std": float(np.std(scores)),
            "probe_macro_f1": float(f1_score(labels, oof, average="macro")), "probe_ci_low": low,
            "probe_ci_high": high, "majority_baseline": float(counts.max() / len(labels))}


# --- the whole analysis --------------------------------------------------------------------------------------

@dataclasses.dataclass
class AtlasResult:
    """``coords``: layer, example_id, x, y, label (chosen layers); ``separability``: :data:`SEPARABILITY_COLUMNS`
    (every layer); ``cka``: ``(L + 1, L + 1)``; ``info``: what was run."""

    coords: pd.DataFrame
    separability: pd.DataFrame
    cka: np.ndarray
    info: dict

    def cka_frame(self) -> pd.DataFrame:
        names = list(range(len(self.cka)))
        return pd.DataFrame(self.cka, index=pd.Index(names, name="layer"), columns=names)


def classify(loaded: LoadedModel, inputs: TextInputs, max_length: int | None = None,
             batch_size: int = 32) -> tuple[list[str], np.ndarray]:
    """A classifier checkpoint's own predictions (class names from its ``id2label``) and their probabilities,
    from its sequence-classification head (loaded beside the shared encoder, used once, then dropped)."""
    from transformers import AutoModelForSequenceClassification

    if loaded.task != "SequenceClassification":
        raise InputError(f"'{loaded.spec.name}' has no classification head of its own to colour by its predictions "
                         f"({'it was saved as ' + loaded.task if loaded.task else 'it is not a classifier'}): "
                         "colour by label")
    from models.loading import DTYPES

    model = AutoModelForSequenceClassification.from_pretrained(
        loaded.spec.source, dtype=DTYPES[loaded.spec.dtype], use_safetensors=not loaded.spec.allow_pickle,
        revision=loaded.spec.revision, trust_remote_code=False).to(loaded.spec.device).eval()
    limit = min(max_length or 10**9, max_input_length(loaded))
    encoded = encode(loaded.tokenizer, inputs, limit)  # the one tokenisation, as for the vectors it colours
    names, probs = [], []
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            batch = make_batch(encoded, list(range(start, min(start + batch_size, len(inputs)))),
                               loaded.tokenizer.pad_token_id, loaded.spec.device)
            p = model(**batch.model_inputs()).logits.float().softmax(-1)
            best = p.argmax(-1)
            names += [loaded.labels[i] if loaded.labels else str(i) for i in best.tolist()]
            probs += p.max(-1).values.tolist()
    return names, np.asarray(probs)


def matches(prediction: str, label: str, names: list[str] | None) -> bool:
    """Whether a classifier's predicted class is the row's label: by name, or by class id when the data's labels
    are ids (``0``/``1``) and the model's names are not."""
    return prediction == label or (names is not None and label.isdigit() and int(label) < len(names)
                                   and names[int(label)] == prediction)


MODEL_POOLING_NAMES = {"cls": "[CLS] token", "mean": "mean of the tokens", "max": "max of the tokens"}


def pooling_name(pooling: str, model_pooling: str | None = None) -> str:
    """What the sentence vector of ``pooling`` is, for titles: ``model`` names the checkpoint's own pooling
    (``model_pooling``, :attr:`models.loading.LoadedModel.pooling`)."""
    if pooling == "model":
        mode, normalize = split_pooling(model_pooling or "")  # "mean+normalize": its Normalize module after
        return (f"checkpoint's own pooling ({MODEL_POOLING_NAMES.get(mode, mode)}"
                + (", then L2-normalised" if normalize else "") + ", sentence-transformers)")
    return {"cls": "[CLS] vector", "mean": "mean of the text's tokens"}[pooling]


def approximate_check(loaded: LoadedModel, inputs: TextInputs, config: AtlasConfig, reps: np.ndarray) -> dict:
    """For a model in bfloat16/float16 (the approximate mode, :func:`analysis.core.precision.mode`): each layer's
    vectors of the first :data:`~analysis.core.precision.AGREEMENT_ROWS` rows against the same model's in float32, by
    linear CKA (1 = the same geometry up to rotation and scale): ``{"agreement": {"rows", "cka_per_layer",
    "min_cka"}}``; ``{}`` for a float32 model."""
    from analysis.core.precision import AGREEMENT_ROWS, reference_spec

    if loaded.model.dtype == torch.float32:
        return {}
    m = min(AGREEMENT_ROWS, len(inputs))
    sample = TextInputs(inputs.texts[:m], inputs.pairs[:m] if inputs.pairs else None)
    reference = extract(load_model(reference_spec(loaded.spec)), sample, config.pooling, config.max_length,
                        config.batch_size)
    cka = [float(linear_cka(reps[i:i + 1, :m], reference[i:i + 1])[0, 0]) for i in range(len(reps))]
    return {"agreement": {"rows": m, "cka_per_layer": [round(c, 6) for c in cka], "min_cka": float(np.nanmin(cka))}}


def atlas(loaded: LoadedModel, inputs: TextInputs, config: AtlasConfig = AtlasConfig(),
          progress: Progress | None = None, store: ArrayStore | None = None,
          ranks: Ranks = ONE, row_limit: int | None = None) -> AtlasResult | None:
    """Representations (cached), projections of the chosen layers, separability of every layer and CKA.
    Under a launcher the processes share the extraction; the main process does the rest and alone gets the
    result (others get None)."""
    start = time.perf_counter()
    check_row_limit(inputs, row_limit or max_rows(), "atlas'", sample=True)  # LAYERLENS_ATLAS_MAX_ROWS
    counts = check_labels(inputs.labels, config.folds)
    n_states = loaded.num_layers + 1
    layers = parse_layers(config.layers, n_states)
    reps, hit = representations(loaded, inputs, config.pooling, config.max_length, config.batch_size, progress, store,
                                ranks)
    if not ranks.is_main:
        return None
    labels = np.asarray(inputs.labels)
    vectors_seconds = time.perf_counter() - start
    agreement = approximate_check(loaded, inputs, config, reps)

    rows = []
    if progress:
        progress("scoring layers", 0, n_states)
    for i in range(n_states):
        rows.append({"layer": i, **separability(reps[i], labels, config.folds, config.seed)})
        if progress:
            progress("scoring layers", i + 1, n_states)
    sep = pd.DataFrame(rows, columns=SEPARABILITY_COLUMNS)
    scored_at = time.perf_counter()

    constant = constant_layers(reps)
    stage = f"projecting ({METHOD_NAMES[config.method]})"
    coords, explained = project_layers(reps, layers, config.method, config.seed, loaded.spec.device, constant,
                                       (lambda done, total: progress(stage, done, total)) if progress else None,
                                       variance=True)
    projected_at = time.perf_counter()
    ids = np.asarray(inputs.ids)
    extra = {}
    if config.color_by != "label":
        predicted, probability = classify(loaded, inputs, config.max_length, config.batch_size)
        extra = {"prediction": predicted, "probability": probability,
                 "correct": [matches(p, str(y), loaded.labels) for p, y in zip(predicted, labels, strict=True)]}
    frame = pd.concat([pd.DataFrame({"layer": layer, "example_id": ids, "x": c[:, 0], "y": c[:, 1], "label": labels,
                                     **extra}) for layer, c in zip(layers, coords, strict=True)], ignore_index=True)
    scored = {"classifier_correct": int(sum(extra["correct"])), "classifier_rows": len(inputs)} if extra else {}
    info = {**config.to_dict(), **scored, "model": loaded.spec.name, "fingerprint": loaded.fingerprint,
            "rows": len(inputs),
            "classes": {str(k): int(v) for k, v in counts.items()}, "layers": layers,
            "layer_names": loaded.anatomy.layer_names(), "pooling_name": pooling_name(config.pooling, loaded.pooling),
            "explained_variance": explained if config.method == "pca" else None,
            "constant_layers": constant, "cache_hit": hit,
            "precision": {"mode": model_mode(loaded.model), **agreement},
            "silhouette_sample": SILHOUETTE_MAX_ROWS if len(inputs) > SILHOUETTE_MAX_ROWS else None,
            "vectors_seconds": round(vectors_seconds, 3),
            "scoring_seconds": round(scored_at - start - vectors_seconds, 3),
            "projection_seconds": round(projected_at - scored_at, 3),
            "seconds": round(time.perf_counter() - start, 3)}
    return AtlasResult(frame, sep, linear_cka(reps, constant=constant), info)
