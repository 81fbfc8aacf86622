"""Neurons (Dalvi et al. 2019): each layer's units ranked by a linear probe's weights, the top k ablated."""

import streamlit as st

from analysis.core.csvout import to_csv
from analysis.core.inputs import InputError, max_rows
from analysis.neurons.options import NeuronsConfig
from analysis.neurons.plots import ablation_curves
from analysis.tasks import TASKS
from ui.inputs import labelled_inputs
from ui.report import result_report_button
from ui.results import chart, result_store, table
from ui.sidebar import start_page
from ui.tasks import page_options, run_on_page, task_form, task_key

NEURONS = TASKS["neurons"]

HEADERS = {
    "accuracy": ("accuracy at this layer", "the layer's own probe on its held-out vectors, the units zeroed"),
    "ci_low": ("95% CI low (Wilson)", "over the held-out rows"), "ci_high": ("95% CI high (Wilson)", ""),
    "final_accuracy": ("accuracy at the last layer", "the last layer's probe after the units were zeroed at this "
                       "layer: the ablation's effect downstream"),
    "final_ci_low": ("last layer CI low", ""), "final_ci_high": ("last layer CI high", ""),
    "majority": ("majority baseline", "always the training rows' most frequent class, on the held-out rows"),
}

loaded = start_page("Neurons", (
    "Which **individual units** of each layer carry a property? A linear probe (logistic regression, elastic net) "
    "is trained on each layer's sentence vectors; its largest class weight ranks the layer's units, and the top *k* "
    "are then **zeroed inside the model** at that layer's output. The accuracy that remains is shown beside zeroing "
    "the bottom *k* and *k* random units (Dalvi et al. 2019, AAAI). Accuracy at the layer itself is the paper's "
    "measure; accuracy at the last layer shows what the ablation does downstream."))

inputs = labelled_inputs("neurons", max_rows())
config = task_form("neurons", NeuronsConfig, ["pooling", "layers", "k", "random_seeds", "test_fraction", "seed"])
if inputs is None or config is None:
    st.stop()
try:  # the task's options: the sidebar's model, the rows' source, the form's knobs
    options = page_options(NEURONS, loaded.spec, inputs, **config.to_dict())
except InputError as exc:
    st.error(str(exc))
    st.stop()
key = task_key(NEURONS, options, inputs)
if st.button("Rank and ablate", type="primary", key="neurons_run"):
    run_on_page({key: ("neurons", lambda ctx: NEURONS.compute(loaded, inputs, options, ctx))}, "Ranking and ablating")

if (run := result_store().get(key)) is not None:
    result = run.result
    info = result.info
    st.caption(f"{info['train_rows']} training rows, {info['test_rows']} held out (stratified, seed {config.seed}); "
               f"k = {config.k}; {config.random_seeds} random draws; majority class '{info['majority_class']}'.")
    if config.pooling == "cls" and 0 in info["layers"]:
        st.info("At hidden state 0 the [CLS] vector is just its token and position embedding, the same for every "
                "text: its probe can only guess, so state 0 sits at chance whatever is zeroed. Mean pooling reads "
                "the embeddings of the words.")
    for state, why in info.get("undefined", {}).items():
        st.caption(f"Hidden state {state}: undefined, {why}.")
    if info.get("not_converged"):
        st.warning(f"The probe of hidden state(s) {', '.join(map(str, info['not_converged']))} stopped at its "
                   "iteration limit before its tolerance: those rankings depend on where it stopped.")
    left, right = st.columns(2)
    chart(ablation_curves(result.ablation, "accuracy", "At the layer whose units are zeroed"), "neurons_layer",
          left)
    chart(ablation_curves(result.ablation, "final_accuracy", "At the last layer"), "neurons_final", right)
    with st.expander("Ablation table"):
        table(result.ablation, HEADERS)
        st.download_button("ablation.csv", to_csv(result.ablation), "ablation.csv", "text/csv", key="neurons_dl_a")
    with st.expander("The top units of each layer"):
        top = result.ranking[result.ranking["rank"] <= config.k]
        table(top, {"score": ("score", "largest absolute class weight of the standardised probe")})
        st.download_button("ranking.csv", to_csv(result.ranking), "ranking.csv", "text/csv", key="neurons_dl_r")
    result_report_button(run, "neurons")
