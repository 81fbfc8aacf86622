"""Layer atlas (Song et al. 2020 Fig. 2; Sun et al. 2019 Tab. 3): each layer's sentence vectors by class."""



import streamlit as st

from analysis.atlas.options import COLOR_BY, AtlasConfig
from analysis.atlas.plots import atlas_grid, separability_curve
from analysis.core.csvout import to_csv
from analysis.core.figures import cka_heatmap
from analysis.core.inputs import InputError, max_rows
from analysis.core.layers import layers_note, parse_layers
from analysis.core.precision import precision_line
from analysis.core.projection import METHOD_NAMES, METHODS
from analysis.core.separability import SEPARABILITY_HEADERS
from analysis.tasks import TASKS
from models.loading import ModelSpec
from models.spec import short_name
from ui.inputs import labelled_inputs
from ui.navigation import compare_link
from ui.report import result_report_button
from ui.results import (
    COMPARE_HELP,
    chart,
    for_each_model,
    md_plain,
    table,
    wait_for_run,
)
from ui.sidebar import start_page
from ui.tasks import page_options, task_result

ATLAS = TASKS["atlas"]

loaded = start_page("Layer atlas", (
    "Each layer's sentence vector (the **[CLS]** / first token's hidden state, or the **mean** of the text's "
    "tokens) for a labelled dataset, projected to 2-D and coloured by class, as in Song et al. (2020, Fig. 2). "
    "Beside it, how separable the classes are in each layer's full vectors (a k-fold **linear probe** and the "
    "**silhouette**), a layer-selection curve without any fine-tuning (Sun et al. 2019, Tab. 3), and the "
    "**CKA** similarity of every pair of layers. Layer 0 is the embedding output."))

inputs = labelled_inputs("atlas", max_rows())
c1, c2, c3, c4, c5 = st.columns([1.2, 1.6, 1, 0.8, 2.4])
# a sentence encoder's own pooling is the default for it (issue 53 item 17: MiniLM pools by mean, and its [CLS]
# separates the classes less: 0.47 at the last layer against 0.80); [CLS] for a masked LM
if st.session_state.get("atlas_pool_model") != loaded.spec.name:
    st.session_state["atlas_pool"] = "model" if loaded.pooling else "cls"
    st.session_state["atlas_pool_model"] = loaded.spec.name
pooling = c1.radio("Vector", ["cls", "mean", *(["model"] if loaded.pooling else [])], key="atlas_pool",
                   format_func={"cls": "[CLS]", "mean": "mean", "model": f"model's ({loaded.pooling})"}.get,
                   horizontal=True, help="mean: over the text's own tokens; model's: a sentence encoder's own "
                   "pooling, as sentence-transformers computes it")
method = c2.radio("Projection", METHODS, format_func=METHOD_NAMES.get, horizontal=True, key="atlas_method",
                  help="PCA is exact and fast; UMAP and t-SNE take longer and run only when you press the button.")
layers = c3.text_input("Layers", "-6:", key="atlas_layers", help="all, a slice (-6: is the last six) or a list 0,4,8")
folds = c4.number_input("Folds", 2, 10, 5, key="atlas_folds", help="folds of the linear probe")
compare = c5.text_input("Compare with (optional)", key="atlas_compare",
                        placeholder="hub id, local directory, job:N or random",
                        help=f"A second model on the same data (Fig. 2 a-d): {COMPARE_HELP}.").strip()
source = st.session_state.get("atlas_source")
compare_link(c5, "atlas", compare, {"compare_source": source, **({"compare_job": st.session_state["atlas_job"]}
                                                               if st.session_state.get("atlas_job") is not None
                                                               else {})} if source != "Upload a file" else None)
colour_by = "label"
if loaded.task == "SequenceClassification":
    colour_by = st.radio("Colour points by", COLOR_BY, horizontal=True, key="atlas_colour", format_func={
        "label": "the data's label", "prediction": f"{short_name(loaded.spec.name)}'s own prediction",
        "correct": "whether its prediction is right"}.get, help="This checkpoint is a classifier: its own head "
        "can colour the points, to see at which layer its errors separate.")
try:
    config = AtlasConfig(pooling=pooling, method=method, layers=layers, folds=int(folds), color_by=colour_by)
    parse_layers(layers, loaded.num_layers + 1)
    if note := layers_note(layers, loaded.num_layers + 1):
        st.caption(note)
except InputError as exc:
    st.error(str(exc))
    st.stop()


def run(spec: ModelSpec, label: str):
    """The atlas task's run for ``spec`` on the inputs (its :class:`analysis.tasks.atlas.AtlasRun`), shared across
    sessions."""
    own = config if spec.name == loaded.spec.name else config.replace(color_by="label")
    return task_result(ATLAS, spec, inputs, page_options(ATLAS, spec, inputs, **own.to_dict()), label)


wait_for_run("atlas_request", inputs is not None and st.button(f"Draw the atlas ({METHOD_NAMES[method]})",
                                                               type="primary", key="atlas_run"),
             (inputs, config, compare), "Choose the data and options, then draw the atlas. Vectors are cached on "
             "disk per model and data, so changing the projection or the layers is quick.")
runs = for_each_model("The atlas", "atlas_request", loaded, compare, run)
results = {label: run.result for label, run in runs.items()}

main = next(iter(results.values()))  # the sidebar's model comes first
info = main.info
classes = ", ".join(f"{md_plain(k)} ({v})" for k, v in info["classes"].items())
if "classifier_correct" in info:
    st.caption("Only the colours follow the classifier: the separability curves below still measure how well "
               "the layers separate the data's labels.")
    st.caption(f"{short_name(loaded.spec.name)}'s own head is right on {info['classifier_correct']:,} of "
               f"{info['classifier_rows']:,} rows ({info['classifier_correct'] / info['classifier_rows']:.3f}; the "
               f"majority class alone: {max(info['classes'].values()) / info['rows']:.3f}).")
st.caption(f"{info['rows']:,} rows · classes: {classes} · "
           + ("vectors read from the disk cache" if info["cache_hit"] else
              f"vectors computed in {info['vectors_seconds']:.2f} s")
           + f" · scoring {info['scoring_seconds']:.2f} s · projection ({METHOD_NAMES[method]}) "
           f"{info['projection_seconds']:.2f} s")
st.caption(precision_line(info.get("precision", {})))
names = info["layer_names"]  # each result carries its own model's layer names
if info["constant_layers"]:
    st.info(f"{', '.join(names[i] for i in info['constant_layers'])}: the vector is the same for every text "
            "(at the embeddings, [CLS] is just its token and position embedding), so its plot is a single "
            "point, its silhouette about 0 (rounding), its probe the majority class (a fold's mean can sit a hair "
            "below the overall majority rate) and its CKA undefined (blank).")
if info["silhouette_sample"]:
    st.caption(f"Silhouette computed on a random sample of {info['silhouette_sample']:,} rows (seed {config.seed}).")

texts = dict(zip(inputs.ids, inputs.texts, strict=True))
for i, (label, result) in enumerate(results.items()):
    title = f"{label}: {METHOD_NAMES[method]} of the {result.info['pooling_name']}"
    explained = dict(zip(result.info["layers"], result.info["explained_variance"] or [], strict=False))
    chart(atlas_grid(result.coords, texts, result.info["layer_names"], title,
                     colour_by=result.info.get("color_by", "label"), explained=explained),
          f"atlas_{method}" + ("_compared" if i else ""),
          key=f"atlas_grid_{i}")
    if len(inputs) > 2000:
        st.caption(f"All {len(inputs):,} points are drawn (WebGL).")

left, right = st.columns([3, 2])
relative = len(results) > 1 and left.checkbox(
    "Relative depth (layer / L)", key="atlas_relative", help="Place each model's layers at layer / L (0 = "
    "embeddings, 1 = its last layer) to compare models of different depth; otherwise each sits at its own "
    "layer indices.")
chart(separability_curve({k: r.separability for k, r in results.items()},
                         {k: r.info["layer_names"] for k, r in results.items()}, relative), "separability", left)
view = right.radio("CKA of", list(results), horizontal=True, key="atlas_cka") if len(results) > 1 else None
shown = results.get(view, main)
chart(cka_heatmap(shown.cka, shown.info["layer_names"]), "cka", right)

for i, (label, result) in enumerate(results.items()):
    with st.expander(f"Tables and downloads: {label}", expanded=False):
        table(result.separability, SEPARABILITY_HEADERS)
        suffix = "" if i == 0 else "_compared"
        d1, d2, d3 = st.columns(3)
        d1.download_button("coords.csv", to_csv(result.coords), f"coords{suffix}.csv", "text/csv",
                           key=f"dl_coords_{i}")
        d2.download_button("separability.csv", to_csv(result.separability),
                           f"separability{suffix}.csv", "text/csv", key=f"dl_sep_{i}")
        d3.download_button("cka.csv", to_csv(result.cka_frame(), index=True), f"cka{suffix}.csv", "text/csv",
                           key=f"dl_cka_{i}")
for column, (i, label) in zip(st.columns(len(results)), enumerate(results), strict=True):  # outside the expanders
    if len(results) > 1:
        column.caption(f"Report of {label}")
    result_report_button(runs[label], f"atlas_{i}", column)
