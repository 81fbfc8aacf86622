"""Layer duplication (Kao et al. 2020, §3): a deeper model from the pre-trained layers, previewed without training."""

from pathlib import Path

import streamlit as st

from analysis.compare.plots import duplication_sweep
from analysis.core.csvout import to_csv
from analysis.core.figures import cka_heatmap
from analysis.core.home import exports_dir
from analysis.core.inputs import InputError
from analysis.core.task import Tables
from analysis.duplication.export import EXPORT_NAME_RULE, check_export_name, default_export_name, export, loads_with
from analysis.duplication.plan import aligned_positions, duplicate_first, duplicate_last, parse_plan
from analysis.probe.plots import accuracy_curve
from analysis.probe.reconstruction import LAYER_HEADERS
from analysis.tasks.duplication import compare, sweep
from models.loading import DTYPES, checkpoint_dtype
from ui.inputs import EXAMPLES, text_inputs
from ui.navigation import prefill
from ui.report import result_report_button
from ui.results import chart, result_key, result_store, shared_result, stop_button, table
from ui.sidebar import start_page

loaded = start_page("Layer duplication", (
    "Make the model **deeper without training** by running some pre-trained layers twice, and check with the "
    "model's own MLM head whether the deeper model still reconstructs its input (Kao et al. 2020, §3). The "
    "paper's plan copies each of the first *k* layers right after itself. The preview reuses the loaded "
    "layers (no extra memory, the shared model untouched); **Export** writes a real deeper model you can "
    "fine-tune."), needs_head=True)
L, albert = loaded.num_layers, loaded.anatomy.family == "albert"

try:
    if albert:
        depth = st.number_input("Depth (ALBERT applies its one shared layer this many times)", 1, 96, L + 2,
                                key="dup_depth")
        plan = [0] * int(depth)
        st.caption(f"Trained depth {L}; {int(depth)} applications of the shared layer.")
    else:
        preset = st.radio("Plan", ["Duplicate the first k (the paper)", "Duplicate the last k", "Every layer once",
                                   "Custom"], horizontal=True, key="dup_preset")
        if preset == "Custom":
            text = st.text_input("Source layer of each new layer (0-based; repeat, drop or reorder)",
                                 ",".join(map(str, duplicate_first(L, 1))), key="dup_custom")
            plan = parse_plan(text, L)
        elif preset == "Every layer once":
            plan = duplicate_first(L, L)
        else:
            k = st.slider("k", 0, L, min(3, L), key="dup_k")
            plan = duplicate_first(L, k) if preset.startswith("Duplicate the first") else duplicate_last(L, k)
        st.caption(f"{L} -> {len(plan)} layers. Source of each new layer, numbered as the charts number them "
                   f"(1 = the first layer): {', '.join(str(p + 1) for p in plan)} (0-based, as the custom plan and "
                   f"`--plan` take it: {','.join(map(str, plan))}). `5 ← 3` is new layer 5, a copy of layer 3.")
except InputError as exc:
    st.error(str(exc))
    st.stop()

inputs = text_inputs("dup", EXAMPLES)
key = result_key(loaded.spec.resolved().to_dict(), plan, inputs.texts if inputs else None)
left, middle = st.columns(2)
what = None
if inputs is not None and left.button("Preview", type="primary", key="dup_preview"):
    what = "preview"
if inputs is not None and middle.button("Sweep k = 0..L", key="dup_sweep",
                                        help="final-layer accuracy with the first k layers duplicated (the paper)"):
    what = "sweep"
if what is not None and result_store().get(f"{key}:{what}") is None:
    stop_slot = stop_button(f"The {what}")
    try:
        if what == "preview":
            shared_result(f"{key}:preview", what, lambda report: compare(loaded, plan, inputs, progress=lambda
                          stage, done, n: report(done / n, f"probing the {stage} model: {done}/{n} texts")))
        else:
            shared_result(f"{key}:sweep", what, lambda report: sweep(loaded, inputs, progress=lambda done, n: report(
                done / n, f"k = {done - 1} of {n - 1}")))
    except InputError as exc:  # e.g. no MLM head to read the layers with: says what to pass
        st.error(str(exc))
    except Exception as exc:  # never a traceback in the UI
        st.error(f"The {what} failed: {type(exc).__name__}: {exc}")
    stop_slot.empty()

if (result := result_store().get(f"{key}:preview")) is not None:
    original, deeper = result["original"], result["deeper"]
    chart(accuracy_curve({"original": original.layers, "deeper": deeper.layers},
                         {"original": original.layer_names, "deeper": result["names"]},
                         "Reconstruction accuracy by layer (ticks: deeper layer ← source; the original's layer s "
                         "sits at its last copy)",
                         positions={"original": aligned_positions(plan, L, loaded.anatomy.family)}),
          "duplication_accuracy")
    chart(cka_heatmap(result["cka"], original.layer_names, "Linear CKA: original x deeper hidden states",
                      column_names=result["names"], x_title="deeper", y_title="original"), "duplication_cka")
    with st.expander("Tables"):
        st.caption("Original model")
        table(original.layers, LAYER_HEADERS)
        st.caption("Deeper model (source: which original layer each new one copies)")
        table(deeper.layers.assign(source=result["names"])[["layer", "source", *original.layers.columns[1:]]],
              LAYER_HEADERS)
if (table := result_store().get(f"{key}:sweep")) is not None:
    chart(duplication_sweep(table), "duplication_sweep")
    st.download_button("sweep.csv", to_csv(table), "sweep.csv", "text/csv", key="dl_sweep")
    result_report_button(Tables("duplication sweep", {"sweep.csv": table},
                                {"model_spec": loaded.spec.resolved().to_dict()}), "duplication_sweep")

st.subheader("Export")
exports = exports_dir()
name = st.text_input(f"Name (saved under {exports})", default_export_name(loaded.spec.name, plan),
                     key="dup_target", help=EXPORT_NAME_RULE[0].upper() + EXPORT_NAME_RULE[1:])
own = checkpoint_dtype(loaded.spec)
save_dtype = st.selectbox("Save in", [own, *(d for d in DTYPES if d not in ("auto", own))], key="dup_dtype",
                          format_func=lambda d: f"{d} (the checkpoint's own)" if d == own else d,
                          help=f"the preview runs in {loaded.spec.dtype}; the export copies the checkpoint's own "
                          "values, so it equals the preview bit for bit only when the two agree")
c1, c2 = st.columns(2)
if c1.button("Export the deeper model", key="dup_export"):
    try:
        st.session_state["dup_exported"] = (str(export(loaded, plan, exports / check_export_name(name),
                                                       save_dtype)), plan)
    except InputError as exc:  # the name: says the rule
        st.error(str(exc))
    except (OSError, RuntimeError) as exc:
        st.error(f"Export failed: {exc}")
exported, exported_plan = st.session_state.get("dup_exported") or (None, None)
if exported and exported_plan != plan:  # the plan changed since: that export is not what the page shows
    exported = None
if exported:
    c1.success(f"Saved to {exported} ({loads_with(Path(exported))}).")

    if c2.button("Fine-tune this model", key="dup_finetune"):  # the form shows this model's defaults
        prefill("pages/5_Fine_Tune_Jobs.py", {"job_model": exported, "job_reset": True})
