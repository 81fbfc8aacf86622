"""Layer atlas: each layer's sentence vectors, projected to 2-D, and how separable the classes are per layer.

Song et al. (2020) §3.3.1 / Fig. 2: PCA of every layer's [CLS] vector, coloured by class. Sun et al. (2019)
§5.3.2 / Tab. 3: which layer's features classify best. For every hidden state ``0..L`` (0 = embeddings) this
module puts together

- the sentence vector: the first token's state ([CLS], ``<s>``) or the mean over counted (non-special) tokens
  (:mod:`analysis.core.vectors`, cached by :mod:`analysis.core.store`);
- 2-D coordinates by exact PCA, UMAP or t-SNE (:mod:`analysis.core.projection`). PCA axes may be sign-flipped
  to line up with the previous layer's; nothing else changes the coordinates (a layer whose vectors are all the
  same, as [CLS] at the embeddings, is drawn at the origin rather than as rounding noise);
- separability on the full vectors (:mod:`analysis.core.separability`): silhouette and a linear probe with its
  majority-class baseline;
- a layer x layer linear CKA matrix (Kornblith et al. 2019, :mod:`analysis.core.cka`).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd
import torch

from analysis.atlas.options import AtlasConfig
from analysis.core.activations import (
    encode,
    make_batch,
    max_input_length,
)
from analysis.core.cka import constant_layers, linear_cka
from analysis.core.inputs import InputError, TextInputs, check_row_limit, max_rows
from analysis.core.layers import parse_layers
from analysis.core.parallel import ONE, Ranks
from analysis.core.precision import model_mode
from analysis.core.projection import METHOD_NAMES, project_layers
from analysis.core.separability import SEPARABILITY_COLUMNS, SILHOUETTE_MAX_ROWS, check_labels, separability
from analysis.core.store import ArrayStore
from analysis.core.vectors import Progress, extract, representations
from models.loading import LoadedModel, load_model, split_pooling

# --- representations ---------------------------------------------------------------------------------------


# --- projections ---------------------------------------------------------------------------------------------


# --- separability and similarity -----------------------------------------------------------------------------


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


def atlas(loaded: LoadedModel, inputs: TextInputs, config: AtlasConfig | None = None,
          progress: Progress | None = None, store: ArrayStore | None = None,
          ranks: Ranks = ONE, row_limit: int | None = None) -> AtlasResult | None:
    """Representations (cached), projections of the chosen layers, separability of every layer and CKA.
    Under a launcher the processes share the extraction; the main process does the rest and alone gets the
    result (others get None)."""
    config = config or AtlasConfig()
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
