"""Reconstruction probing (Kao et al. 2020, §2): how well does each layer, fed to the MLM head, rebuild the input?"""

import streamlit as st

from analysis.core.csvout import to_csv
from analysis.core.precision import bf16_units, precision_line
from analysis.probe import lens
from analysis.probe.plots import accuracy_curve, divergence_curves, mismatch_html, token_heatmap
from analysis.probe.reconstruction import LAYER_HEADERS, ProbeConfig
from analysis.tasks import TASKS
from models.loading import ModelSpec
from ui.inputs import EXAMPLES, text_inputs
from ui.jobs import lens_job_form
from ui.navigation import compare_link
from ui.report import result_report_button
from ui.results import COMPARE_HELP, chart, for_each_model, table, wait_for_run
from ui.sidebar import available_lenses, start_page
from ui.tasks import page_options, task_result

PROBE = TASKS["probe"]

loaded = start_page("Reconstruction probing", (
    "Every layer's hidden states go through the model's **pre-trained MLM head** (its own, or one lent in the "
    "sidebar); a token counts as "
    "reconstructed when the head's top prediction is the input token. Layer 0 is the embedding output. "
    "**Unmasked** is Kao et al.'s setting; **masked** masks every token once (15% at a time) and so measures "
    "each layer's real masked-LM accuracy. Special tokens ([CLS], [SEP], …) are not counted unless you ask."),
    needs_head=True)

inputs = text_inputs("probe", EXAMPLES)
lenses = available_lenses(loaded)
c1, c2, c3, c4, c5 = st.columns([2, 2, 1, 3, 2])
mode = c1.radio("Mode", ["unmasked", "masked"], horizontal=True, key="probe_mode")
include_special = c2.checkbox("Count special tokens", key="probe_special")
top_k = c3.number_input("Top-k", 1, 20, 5, key="probe_topk")
compare = c4.text_input("Compare with (optional)", key="probe_compare",
                        placeholder="hub id, local directory, job:N or random",
                        help=f"A second model probed on the same texts: {COMPARE_HELP}.").strip()
compare_link(c4, "probe", compare)
NO_LENS = "(none)"  # a real option, not None: Streamlit shows None as "Choose an option" (seen in Chromium)
if st.session_state.get("probe_lens") not in (NO_LENS, *lenses):  # a lens of the model chosen before, or None
    st.session_state["probe_lens"] = NO_LENS
lens_dir = c5.selectbox("Tuned lens", [NO_LENS, *lenses], format_func=lambda d: d if d == NO_LENS else lens.label(d),
                        key="probe_lens", help="Also read the layers through a tuned lens trained for this model "
                        "(a translator per layer, then the same head; `python -m analysis lens train` or a lens job) "
                        "and show each layer's KL to the final layer and agreement with it, raw and tuned."
                        if lenses else "No tuned lens for this model yet: train one with `python -m analysis lens "
                        "train` or on the Fine-tuning jobs page (job kind: tuned lens).")
lens_dir = None if lens_dir == NO_LENS else lens_dir
can_certify = loaded.spec.device == "cpu" and bf16_units("cpu")
certified = st.checkbox("MLM head in certified bfloat16", key="probe_certified", disabled=not can_certify,
                        help="The vocabulary product in bfloat16 where this machine has bf16 matrix units, every row "
                        "certified equal to float32 or recomputed in float32: the same tables, probabilities within "
                        "a stated bound. It pays only where bf16 is much faster than float32 and the head dominates "
                        "(docs/benchmarks.md). For the approximate mode choose bfloat16 under 'Precision' in the "
                        "sidebar." if can_certify else "Certified bf16 runs on a CPU with bf16 matrix units; "
                        "this one has none (or the model is on a GPU).")
lens_reads_halves = lens_dir is None or lens.halves(lens_dir) == "attention"
if "probe_half" in st.session_state:  # Streamlit forgets a widget's value on a run that does not draw it: kept
    st.session_state["probe_half"] = st.session_state["probe_half"]  # while a lens of the outputs only is chosen
half_box = ({"key": "probe_half"} if lens_reads_halves else  # unticked, apart from the user's choice, while it
            {"key": "probe_half_off", "value": False, "disabled": True})  # cannot apply
halves = st.checkbox("Also read each layer's attention half", **half_box,
                     help="The residual stream after each layer's attention block, before its feed-forward block, "
                     "through the same head: two points per layer on the curve, the attention half half a layer "
                     "before the layer's output." + (" Not with this tuned lens, which was trained on the layer "
                                                    "outputs only: choose (none), or a lens trained on both halves "
                                                    "(half: attention in its job's options)."
                                                    if not lens_reads_halves else ""))
config = ProbeConfig(mode=mode, include_special=include_special, top_k=int(top_k),
                     precision="certified" if certified else "float32",
                     half="attention" if halves and lens_reads_halves else "output")


def run(spec: ModelSpec, label: str):
    """The probe task's run of ``spec`` on the inputs (its :class:`analysis.tasks.probe.ProbeRun`), shared across
    sessions: the sidebar's model raw and through the chosen lens, a second model raw. With a lens chosen, every
    raw reading also measures KL to the final layer and agreement."""
    own = lens_dir if spec.name == loaded.spec.name else None
    options = page_options(PROBE, spec, inputs, **config.to_dict(), lens=own,
                           divergence=lens_dir is not None)
    return task_result(PROBE, spec, inputs, options, f"Probing {label}")


with st.expander("Train a tuned lens for this model (a background job)"):
    st.caption("A tuned lens learns one affine translator per layer so that the MLM head reads each layer as the "
               "final layer's distribution (KL at masked positions; Belrose et al. 2023, for encoders). The demo "
               "model ships one; docs/tuned_lens.md says what it shows and how to train one for bert-base.")
    lens_job_form(loaded.spec)

wait_for_run("probe_request", inputs is not None and st.button("Run the probe", type="primary", key="probe_run"),
             (inputs, config, compare, lens_dir), "Set the texts and options, then run the probe. Results are shared "
             "and cached per model, texts and options.")
runs = for_each_model("The probe", "probe_request", loaded, compare, run)
first = next(iter(runs))  # the sidebar's model comes first, by its short name
results = {first: runs[first].results["raw"]}
if lens_dir is not None:
    results[f"{first} · tuned lens ({lens.label(lens_dir)})"] = runs[first].results["tuned"]
results.update({label: r.results["raw"] for label, r in runs.items() if label != first})
main = results[first]
st.caption(precision_line(main.precision))
if main.truncated:
    st.warning(f"{main.truncated} text(s) longer than {main.max_length} tokens were cut to fit the model.")
st.caption(f"{main.n_texts} texts · {int(main.layers['tokens'].iloc[0]):,} counted tokens · {main.seconds:.2f} s"
           + (f" · every model reads these same {main.n_texts} texts" if len(results) > 1 else ""))

st.subheader("Accuracy by layer")
names = {k: r.layer_names for k, r in results.items()}  # each model's own
relative = len({len(n) for n in names.values()}) > 1 and st.checkbox(
    "Relative depth (layer / L)", key="probe_relative", help="These models have different numbers of layers: "
    "place each one's layers at layer / L (0 = embeddings, 1 = its last layer) instead of at its own indices.")
fig = accuracy_curve({k: r.layers for k, r in results.items()}, names, relative=relative)
if st.checkbox("Zoom the accuracy axis to the data", key="probe_zoom", help="The axis runs from 0 to 1 by default, "
               "so small differences are not blown up; zoom in to see close curves apart (the axis then says where "
               "it starts)."):
    fig.update_yaxes(range=None, autorange=True)
chart(fig, "reconstruction_accuracy")
if config.half == "attention":
    st.caption("The points halfway between layers are the **attention halves**: layer l's residual stream after its "
               "attention block (LayerNorm included) and before its feed-forward block, drawn at l − 0.5, read "
               "through the same head. The table's half column says which is which.")
if lens_dir is not None:
    st.markdown("**Raw head and tuned lens**: how far each layer's reading is from the final layer's distribution. "
                "A tuned lens translates each layer before the head, so its curves say what a layer knows once "
                "its basis drift is undone; the last layer is read alike by both.")
    trained_at = lens.training_positions(lens_dir)
    if mode == "unmasked" and trained_at == "masked":
        st.info("This lens was trained to match the final layer at **masked** positions, where the model has to "
                "predict. Unmasked, the final layer mostly copies its input (Kao et al.), and a lens reading can sit "
                "further from it than the raw head's: choose Mode **masked** to see what the lens was trained for.")
    chart(divergence_curves({k: r.layers for k, r in results.items()}, names, relative), "reconstruction_lens")
for i, (label, r) in enumerate(results.items()):
    with st.expander(f"Table: {label}", expanded=i == 0):
        table(r.layers, LAYER_HEADERS)
        st.download_button("Download layers.csv", to_csv(r.layers),
                           "layers.csv" if i == 0 else "layers_compared.csv", "text/csv", key=f"dl_layers_{i}")

st.subheader("One sentence, layer by layer")
label = st.radio("Model", list(results), horizontal=True, key="probe_view") if len(results) > 1 else main.model
shown = results.get(label, main)
text_id = st.selectbox("Sentence", range(shown.n_texts), format_func=lambda i: inputs.texts[i][:120],
                       key="probe_sentence")
rows = shown.tokens[shown.tokens["text_id"] == text_id]
if rows.empty:
    st.info("This text has no counted tokens.")
else:
    st.markdown("Predicted tokens per layer; wrong ones are highlighted (hover for the input token).")
    st.html(mismatch_html(rows, shown.layer_names))
    chart(token_heatmap(rows, shown.layer_names, "Probability of the input token (hover for the top-k)"),
          f"reconstruction_text{text_id}")
cols = ["text_id", "layer", *(["half"] if "half" in shown.tokens else []), "position", "input_token",
        "predicted_token", "correct", "prob", "rank"]
left, right = st.columns(2)
left.download_button("Download decoded.csv (all texts)", to_csv(shown.decoded), "decoded.csv",
                     "text/csv", key="dl_decoded")
right.download_button("Download tokens.csv (all texts)", to_csv(shown.tokens[cols]), "tokens.csv",
                      "text/csv", key="dl_tokens")
result_report_button(runs[first], "probe")
