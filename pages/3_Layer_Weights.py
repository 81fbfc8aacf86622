"""Layer weights of a finished fine-tuning job (attention pooling, scalar mix), its atlas by epoch, and links."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from analysis.atlas.plots import atlas_grid
from analysis.core.figures import label_colours
from analysis.core.inputs import InputError
from analysis.core.projection import project_layers
from analysis.training.heads import near_uniform
from analysis.training.plots import layer_weight_heatmap, mean_weight_lines
from analysis.training.runs import epoch_vectors
from analysis.training.train import read_weights
from models.anatomy import layer_name
from ui.jobs import jobs_of, score_line
from ui.navigation import prefill
from ui.report import report_button
from ui.results import chart, md_plain
from ui.sidebar import start_page

loaded = start_page("Layer weights", (
    "What a fine-tuned **attention-pooling** (Song et al. 2020) or **scalar-mix** head learned: how much "
    "weight each layer's [CLS] gets, per example, per class and across epochs; and the validation set's "
    "[CLS] vectors of the last layers after the first and the last epoch (PCA, as in Song et al. Fig. 2)."))
finished = [j for j in jobs_of("finetune") if j.status == "succeeded"]  # a damaged jobs.db: one line, the page stops
jobs = [j for j in finished if (j.artifacts / "metrics.json").is_file()]
if len(jobs) < len(finished):
    st.caption(f"{len(finished) - len(jobs)} finished job(s) not listed: their artifacts were deleted "
               f"({', '.join(f'#{j.id}' for j in finished if j not in jobs)}).")
if not jobs:
    st.info("No finished job yet: start one on the **Fine-tuning jobs** page (head *attention* or *scalar-mix* "
            "for layer weights).")
    st.stop()
weighted = [j for j in jobs if (j.directory / "artifacts" / "layer_weights.csv").is_file()]
default = jobs.index(weighted[0]) if weighted else 0
job = st.selectbox("Finished job", jobs, index=default, key="lw_job", format_func=lambda j: f"#{j.id} {j.name} · "
                   f"{score_line(j.metrics)}")
art = job.artifacts
try:
    metrics = json.loads((art / "metrics.json").read_text())
    weights = read_weights(art / "layer_weights.csv") if (art / "layer_weights.csv").is_file() else None
except (OSError, ValueError, InputError) as exc:
    st.error(f"{md_plain(job.label)}: its artifacts cannot be read ({exc}).")
    st.stop()
names = metrics["labels"]
colours = label_colours(names)
st.caption(f"{metrics.get('evaluated_on', '')} set: {score_line(metrics)}")
epochs = sorted(int(p.name) for p in (art / "epochs").iterdir() if p.is_dir()) if (art / "epochs").is_dir() else []

if weights is not None:
    n_states = max(int(c.split("_")[1]) for c in weights.columns if c.startswith("layer_")) + 1
    layer_names = [layer_name(i, n_states - 1) for i in range(n_states)]
    preds = pd.read_csv(art / "predictions.csv", keep_default_na=False).set_index("example_id")
    labels = preds.loc[weights.example_id, "label"].reset_index(drop=True)
    st.caption(f"{len(weights)} examples of the {metrics.get('evaluated_on', '')} set; weights sum to 1 per example"
               + (" (a scalar mix has one set of weights for all examples)" if job.config.get("head") == "scalar-mix"
                  else ""))
    left, right = st.columns(2)
    values = weights[[c for c in weights.columns if c.startswith("layer_")]].to_numpy()
    if near_uniform(values):
        st.info(f"Every weight is within 1% of the uniform 1/{values.shape[1]} = {1 / values.shape[1]:.3f}: this head "
                "learned no preference between layers.")
    chart(layer_weight_heatmap(weights, labels, layer_names), f"layer_weights_{job.id}", left)
    by_class = {c: weights[labels.to_numpy() == c] for c in sorted(set(labels)) if c}
    chart(mean_weight_lines(by_class or {"all": weights}, layer_names, "Mean weight per layer, by class", colours),
          f"layer_weights_by_class_{job.id}", right)
    per_epoch = {f"epoch {e}": pd.read_csv(art / "epochs" / str(e) / "layer_weights.csv") for e in epochs
                 if (art / "epochs" / str(e) / "layer_weights.csv").is_file()}
    if len(per_epoch) > 1:
        chart(mean_weight_lines(per_epoch, layer_names, "Mean weight per layer on the validation set, by epoch"),
              f"layer_weights_by_epoch_{job.id}")
    st.download_button("layer_weights.csv", (art / "layer_weights.csv").read_bytes(), f"layer_weights_{job.id}.csv")
else:
    st.info(f"Head `{job.config.get('head', 'cls')}` learns no layer weights (only `attention` and `scalar-mix` "
            "do); the atlas by epoch and the links below still apply.")
report_button(art, f"lw_{job.id}")


@st.cache_data(max_entries=8, show_spinner="Projecting the validation vectors…")
def epoch_coords(artifacts: str, epoch: int, layers: tuple[int, ...]) -> pd.DataFrame:
    vectors = epoch_vectors(Path(artifacts), epoch).array(mmap=False).astype(np.float32)
    meta = json.loads((Path(artifacts) / "epochs" / str(epoch) / "val_ids.json").read_text())
    coords = project_layers(vectors, list(layers))
    return pd.concat([pd.DataFrame({"layer": i, "example_id": meta["example_id"], "x": c[:, 0], "y": c[:, 1],
                                    "label": [names[y] for y in meta["label"]]}) for i, c in zip(layers, coords,
                                                                                               strict=True)])


if len(epochs) >= 1 and (first := epoch_vectors(art, epochs[0])) is not None:
    st.subheader(f"Validation [CLS] vectors: epoch {epochs[0]} vs epoch {epochs[-1]} (PCA)" if len(epochs) > 1
                 else f"Validation [CLS] vectors after epoch {epochs[0]} (PCA)")
    n = len(first.layers)
    layers = tuple(range(max(1, n - 6), n))
    for e in dict.fromkeys([epochs[0], epochs[-1]]):
        if epoch_vectors(art, e) is None:
            st.caption(f"Epoch {e}'s vectors are missing or damaged.")
            continue
        coords = epoch_coords(str(art), e, layers)
        chart(atlas_grid(coords, {}, [layer_name(i, n - 1) for i in range(n)], f"after epoch {e}"),
              f"job{job.id}_atlas_epoch{e}", key=f"lw_atlas_{e}")

st.subheader("Look further")
if not metrics.get("mlm_head_from"):
    st.caption("The model this job started from has no MLM head of its own (or the job used k-fold and kept no "
               "checkpoint), so its fine-tuned layers cannot be read by a pre-trained head here.")
else:
    base = job.config.get("model", "demo")
    st.caption(f"Opens the page with {md_plain(job.label)} (its fine-tuned layers read by the pre-trained MLM head "
               f"of {md_plain(metrics['mlm_head_from'])}) as the "
               f"comparison; the sidebar's model, {md_plain(loaded.spec.name)}, stays the main one. The atlas uses "
               "the rows the job never trained on.")
    if loaded.spec.name != base:
        st.warning(f"The job was fine-tuned from {base}: choose it in the sidebar to compare pre-trained with "
                   "fine-tuned.")
    c1, c2 = st.columns(2)

    def compare_with(prefix: str) -> dict:
        """The target page's fields: this job as its second model (and, for the atlas, its held-out rows)."""
        values = {f"{prefix}_compare": f"job:{job.id}"}
        if prefix == "atlas":
            values |= {"atlas_job": job.id, "atlas_source": f"Held-out rows of job #{job.id}"}
        return values

    if c1.button("Reconstruction: pre-trained vs fine-tuned", key="lw_go_probe_compare"):
        prefill("pages/1_Reconstruction.py", compare_with("probe"))
    if c2.button("Layer atlas: pre-trained vs fine-tuned (held-out rows)", key="lw_go_atlas_compare"):
        prefill("pages/2_Layer_Atlas.py", compare_with("atlas"))
