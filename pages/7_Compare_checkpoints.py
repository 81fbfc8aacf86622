"""Compare checkpoints layer by layer (Merchant et al. 2020; Kao et al. 2020 Fig. 2): what changed, where, and for
which examples."""

import dataclasses

import numpy as np
import streamlit as st

from analysis.compare.run import CompareConfig, compare
from analysis.csvout import to_csv
from analysis.plots import aligned_map, cka_heatmap, paired_cka_curve
from analysis.projection import max_rows
from ui.inputs import labelled_inputs
from ui.results import COMPARE_HELP, chart, compared_model, result_key, shared_result, table, wait_for_run
from ui.sidebar import model_cache, start_page

loaded = start_page("Compare checkpoints", (
    "The sidebar's model is **A**; the checkpoint named below is **B** (a model fine-tuned from A, `job:N`, a "
    "duplicated or further pre-trained copy, a seed of the same run). Both read the same rows with the same "
    "tokenizer. Per layer: the **CKA** of A's and B's sentence vectors (1 = the same geometry up to rotation and "
    "scale), each model's **linear-probe accuracy** and a paired McNemar test, how far each example **moved** "
    "(cosine distance after rotating B onto A) and whether its **nearest neighbours** changed; and one map per "
    "layer shared by both models. Layer 0 is the embedding output."))

inputs = labelled_inputs("compare", max_rows())
c1, c2, c3 = st.columns([3, 1.2, 1.2])
other = c1.text_input("Compare with (B)", key="compare_model", placeholder="hub id, local directory, job:N or random",
                      help=f"The checkpoint to set against the sidebar's model: {COMPARE_HELP}.").strip()
pooling = c2.radio("Vector", ["cls", "mean"], horizontal=True, key="compare_pool",
                   format_func={"cls": "[CLS]", "mean": "mean"}.get)
debiased = c3.checkbox("Debiased CKA", key="compare_debiased", help="Nguyen et al. 2021: the plain estimator "
                       "is biased upwards when there are few rows for the width; the debiased one is not.")
config = CompareConfig(pooling=pooling, debiased=debiased)

wait_for_run("compare_request", inputs is not None and bool(other) and st.button("Compare", type="primary",
                                                                                 key="compare_run"),
             (inputs, other, config), "Choose the rows and the checkpoint B, then compare. Vectors are cached on "
             "disk per model and data: a model the atlas already read is not read again.")
name, head_from, label = compared_model(other, loaded.spec.name)
spec_b = dataclasses.replace(loaded.spec, name=name, revision=None, head_from=head_from)
key = result_key(loaded.spec.resolved().to_dict(), spec_b.resolved().to_dict(), inputs.content_hash(), inputs.ids,
                 config.to_dict())
try:
    result = shared_result(key, "Comparing", lambda report: compare(
        [loaded, model_cache().get(spec_b)], inputs, config,
        progress=lambda stage, done, n: report(done / max(n, 1), f"{stage} {done}/{n}")))
except Exception as exc:  # a bad checkpoint, different tokenizers: a message, never a traceback
    st.error(str(exc))
    st.stop()

summary, names = result.layer_summary, loaded.anatomy.layer_names()
st.caption(f"A = {loaded.spec.name}, B = {label}; {result.info['rows']:,} rows; layers {result.info['layers']}; "
           f"CKA interval: {result.info['bootstrap']}; computed in {result.info['seconds']:.1f} s.")
chart(paired_cka_curve(summary.assign(model_b=label), names), "compare_cka")
cross = result.cka_cross.pivot(index="layer_a", columns="layer_b", values="cka").to_numpy()
b_names = [str(i) for i in range(cross.shape[1])] if cross.shape[1] != len(names) else names
chart(cka_heatmap(cross, names, "Linear CKA: every layer of A against every layer of B", b_names,
                  x_title=f"B ({label})", y_title=f"A ({loaded.spec.name})"), "compare_cka_cross")

st.subheader("Per layer")
table(summary.drop(columns=["model_a", "model_b"]), {
    "cka": ("CKA", "linear CKA of A's and B's layer (debiased if chosen)"),
    "cka_ci_low": ("CKA low", "95% bootstrap interval over rows"), "cka_ci_high": ("CKA high", ""),
    "mean_movement": ("mean movement", "cosine distance after Procrustes alignment of B onto A"),
    "neighbours_mostly_changed": ("neighbours changed", f"share of rows keeping fewer than half of their "
                                  f"{config.neighbours} nearest neighbours"),
    "probe_accuracy_a": ("probe A", "linear probe, out-of-fold, same folds for A and B"),
    "probe_accuracy_b": ("probe B", ""), "probe_change": ("B - A", ""),
    "mcnemar_p": ("McNemar p", "exact test on the rows one model's probe gets right and the other's wrong")})
to_csv_bytes = to_csv(summary)
st.download_button("layer_summary.csv", to_csv_bytes, "layer_summary.csv", key="compare_dl")

st.subheader("Movers and the shared map")
layer = st.select_slider("Layer", options=list(summary["layer"]), value=int(summary["layer"].iloc[-1]),
                         format_func=lambda i: names[i] if i < len(names) else str(i), key="compare_layer")
movers = result.movers[result.movers["layer"] == layer].sort_values("movement", ascending=False)
top_n = st.number_input("Examples shown", 1, 100, 10, key="compare_topn")
left, right = st.columns(2)
columns = [c for c in ("example_id", "text", "label", "movement", "movement_raw", "neighbour_overlap")
           if c in movers.columns]
headers = {"movement": ("moved", "cosine distance after aligning B onto A"),
           "movement_raw": ("moved (raw)", "without the alignment"),
           "neighbour_overlap": ("neighbours kept", "share of the 10 nearest kept")}
left.caption(f"Moved most at {names[layer] if layer < len(names) else layer}")
table(movers[columns].head(int(top_n)), headers, container=left)
right.caption("Moved least")
table(movers[columns].tail(int(top_n)).iloc[::-1], headers, container=right)
if len(result.coords):
    coords = result.coords[result.coords["layer"] == layer]
    texts = dict(zip(inputs.ids, inputs.texts, strict=True))
    chart(aligned_map(coords, (loaded.spec.name, label), texts, list(np.asarray(movers["example_id"])[:int(top_n)])),
          "compare_map")
    st.caption("Exact PCA of both models' vectors at this layer, pooled; each layer's map is rotated onto the "
               "previous one, so a point whose vectors do not change keeps its place as you move the slider. "
               "Lines join the examples that moved most from A to B.")
