"""Classifier lens: every layer of a fine-tuned classifier read through the classifier's own head."""

from pathlib import Path

import streamlit as st

from analysis.classifier_lens.plots import accuracy_curves, decision_histogram, example_figure, kl_curves
from analysis.core.csvout import to_csv
from analysis.core.inputs import max_rows
from analysis.tasks.classifier_lens import ClassifierLens, ClassifierLensKnobs, ClassifierLensOptions
from ui.inputs import labelled_inputs
from ui.jobs import finished_classifier_jobs
from ui.report import result_report_button
from ui.results import chart, result_key, result_store, table
from ui.sidebar import start_page
from ui.tasks import kept, run_on_page, task_form

HEADERS = {
    "accuracy": ("accuracy", "the prediction at this layer is the row's label"),
    "accuracy_low": ("95% CI low (Wilson)", ""), "accuracy_high": ("95% CI high (Wilson)", ""),
    "majority_baseline": ("majority baseline", "always the most frequent label of these rows (optimistic: it knows "
                          "their label counts)"),
    "agreement": ("agreement with the final prediction", "the prediction at this layer is the last layer's"),
    "agreement_low": ("agreement CI low", ""), "agreement_high": ("agreement CI high", ""),
    "kl_to_final": ("KL(final || layer)", "mean over rows, in nats (Belrose et al. 2023)"),
    "top_class_share": ("share of its top class", "the share of rows this layer predicts as its most predicted class: "
                        "near 1, the layer guesses one class for every row"),
}

TUNED_HEADERS = {
    "held_out_kl_raw": ("KL to final, raw", "on the held-out rows (nats)"),
    "held_out_kl_tuned": ("KL to final, tuned", "through the layer's trained translator"),
    "held_out_agreement_raw": ("agreement, raw", "with the final prediction, held-out rows"),
    "held_out_agreement_tuned": ("agreement, tuned", ""),
    "held_out_accuracy_raw": ("accuracy, raw", ""), "held_out_accuracy_tuned": ("accuracy, tuned", ""),
    "n_held_out": ("held-out rows", "20% of the rows, seeded; the translators trained on the rest"),
}

loaded = start_page("Classifier lens", (
    "**When does a fine-tuned classifier decide?** Each layer's states are read through the classifier's **own "
    "head** (the pooler or the job's pooling head, then the classifier), as if the model stopped at that layer: "
    "the logit lens with the classifier in place of the unembedding. Per layer: accuracy with its interval and the "
    "majority baseline, agreement with the final prediction and the KL divergence to the final distribution; per "
    "example the **decision layer**, the first from which its prediction is the final one and stays so."))

choices: dict[str, str] = {}
job_ids: dict[str, int] = {}
if loaded.task == "SequenceClassification":
    choices[f"the sidebar's model ({loaded.spec.name})"] = loaded.spec.source
for job in finished_classifier_jobs():
    choices[f"job #{job.id} {job.name}"] = str(job.artifacts / "checkpoint")
    job_ids[f"job #{job.id} {job.name}"] = job.id
if not choices:
    st.info(f"The sidebar's model ({loaded.spec.name}) has no classification head of its own, and no fine-tuning "
            "job has finished with a saved classifier yet. Fine-tune one on the **Fine-tuning jobs** page (under a "
            "minute on the demo model here), or choose a checkpoint saved as *ForSequenceClassification in the "
            "sidebar.")
    st.stop()
left, right = st.columns(2)
first = left.selectbox("Classifier", list(choices), key="clens_first")
second = right.selectbox("Beside it (optional): another classifier on the same rows", ["(none)"] +
                         [c for c in choices if c != first], key="clens_second",
                         help="e.g. a cls job beside an attention-pooling job of the same data")
if first in job_ids:  # the data box then offers the job's held-out rows
    st.session_state["clens_job"] = job_ids[first]
    st.caption(f"Rows the job trained on inflate its accuracy: read it on **Held-out rows of job #{job_ids[first]}** "
               "(the rows it was scored on), or on data it never saw.")
else:
    st.session_state.pop("clens_job", None)
inputs = labelled_inputs("clens", max_rows())
knobs = task_form("clens", ClassifierLensKnobs, ["batch_size", "tuned", "tuned_epochs", "seed"], columns=4)
if inputs is None or knobs is None:
    st.stop()
picked = [first] + ([second] if second != "(none)" else [])


def options_for(label: str) -> ClassifierLensOptions:
    values = {**knobs.model_dump(), "model": choices[label], "device": loaded.spec.device,
              "data": Path(getattr(inputs, "name", None) or "rows on the page")}
    return ClassifierLensOptions(**values)


keys = {label: result_key("lens classifier", choices[label], knobs.model_dump(mode="json"), inputs.content_hash())
        for label in picked}
if st.button("Read every layer", type="primary", key="clens_run"):
    run_on_page({keys[label]: (f"classifier lens: {label}", lambda ctx, label=label: kept(ClassifierLens().read(
        options_for(label), inputs, ctx), options_for(label), inputs)) for label in picked}, "Reading the layers")

runs = {label: result_store().get(keys[label]) for label in picked}
runs = {label: run for label, run in runs.items() if run is not None}
if not runs:
    st.stop()
for label, run in runs.items():
    if run.facts.get("rows_trained_on"):
        st.warning(f"{label}: {run.facts['rows_trained_on']:,} of the {run.facts['rows']:,} rows are rows it was "
                   "trained on: its accuracy on them is inflated. Its held-out rows are the first data choice.")
one = next(iter(runs.values()))
classes, depth = one.facts["classes"], one.facts["layers"]
st.caption(f"{one.facts['rows']:,} rows; classes: {', '.join(classes)}. Each layer is read as if the model stopped "
           "there: the layers after it pass their input on unchanged, and the head reads what comes out.")
if one.layers["top_class_share"].iloc[0] == 1:
    st.caption("At layer 0 the first token's state is its token and position embedding, the same vector for every "
               "text, so a head that reads it gives every row the same answer there.")
chart(accuracy_curves({label: run.layers for label, run in runs.items()}), "clens_accuracy")
a, b = st.columns(2)
chart(kl_curves({label: run.layers for label, run in runs.items()}), "clens_kl", a)
chart(decision_histogram({label: run.examples for label, run in runs.items()}, depth), "clens_decision", b)
for label, run in runs.items():
    guessing = run.layers[(run.layers["top_class_share"] >= 0.95) & (run.layers["layer"] < depth)]["layer"].tolist()
    if guessing:
        b.caption(f"{label}: layer(s) {', '.join(map(str, guessing))} predict one class for at least 95% of the rows. "
                  "A row \"decided\" there is decided by that one guess (its final class happens to be it), not by "
                  "what the layer knows.")
for label, run in runs.items():
    with st.expander(f"{label}: per layer"):
        table(run.layers, HEADERS)
        st.download_button("layers.csv", to_csv(run.layers), "layers.csv", "text/csv", key=f"clens_dl_l_{label}")
        st.download_button("examples.csv", to_csv(run.examples), "examples.csv", "text/csv",
                           key=f"clens_dl_e_{label}")
    if run.tuned is not None:
        with st.expander(f"{label}: the tuned classifier lens (held-out rows)"):
            table(run.tuned, TUNED_HEADERS)

label = st.selectbox("Examples of", list(runs), key="clens_examples_of") if len(runs) > 1 else first
examples = runs[label].examples
late = examples.sort_values(["decision_layer", "row"], ascending=[False, True])
late = late[late["decision_layer"] > 0]
st.subheader("Decided late")
st.caption("The rows whose final prediction is reached last (decision layer, highest first): the model changed its "
           "mind until then.")
table(late[["row", "decision_layer", "text", *(["label"] if "label" in late else []), "prediction"]].head(20), {})
position = st.selectbox("One example", range(len(examples)), key="clens_example",
                        format_func=lambda i: f"row {examples['row'].iloc[i]}: {examples['text'].iloc[i][:80]}")
chart(example_figure(examples, position, classes), "clens_one")
for column, (label, run) in zip(st.columns(len(runs)), runs.items(), strict=True):  # outside any expander: item 11
    column.caption(f"Report of {label}")
    result_report_button(run, f"clens_{label}", column)
