"""Compare checkpoints layer by layer (Merchant et al. 2020; Kao et al. 2020 Fig. 2): what changed, where, and for
which examples; two checkpoints, a fine-tuning job's epochs, or the runs of a sweep."""

import dataclasses

import numpy as np
import streamlit as st

from analysis.compare.options import CompareConfig
from analysis.compare.plots import (
    aligned_map,
    epoch_colours,
    epoch_curves,
    pair_labels,
    paired_accuracy_curves,
    paired_cka_curve,
)
from analysis.core.csvout import to_csv
from analysis.core.dataroots import browser_model
from analysis.core.figures import cka_heatmap, plain
from analysis.core.inputs import InputError, max_rows
from analysis.core.task import Tables
from analysis.tasks.comparing import compare
from analysis.tasks.epochs import compare_epochs, validation_rows
from analysis.tasks.modelref import resolve_group
from analysis.training.runs import job_run
from models.anatomy import layer_name
from models.loading import ModelLoadError, ModelSpec
from ui.inputs import labelled_inputs
from ui.jobs import jobs_of
from ui.report import result_report_button
from ui.results import (
    COMPARE_HELP,
    chart,
    compared_model,
    md_plain,
    result_key,
    shared_result,
    stop_button,
    table,
    wait_for_run,
)
from ui.sidebar import model_cache, start_page

loaded = start_page("Compare checkpoints", (
    "Two checkpoints read the same rows with the same tokenizer: **A** (the reference) and **B** (a model fine-tuned "
    "from A, `job:N`, a duplicated or further pre-trained copy, a seed of the same run), or a fine-tuning job's "
    "**epochs** against the model it started from, or every run of a **sweep**. Per layer: the **CKA** of A's and "
    "B's sentence vectors (1 = the same geometry up to rotation and scale), each model's **reconstruction accuracy** "
    "through its MLM head (Kao et al. Fig. 2) and **linear-probe accuracy**, with paired McNemar tests, how far each "
    "example **moved** (cosine distance after rotating B onto A) and whether its **nearest neighbours** changed; "
    "and one map per layer shared by both. Layer 0 is the embedding output."))

MODES = {"pair": "Two checkpoints", "epochs": "A job's epochs", "group": "A sweep group"}
what = st.radio("Compare", list(MODES), format_func=MODES.get, horizontal=True, key="compare_what",
                help="Two checkpoints: the sidebar's model is A. A job's epochs: the vectors each epoch of a "
                "fine-tuning job saved, against the model it started from. A sweep group: each finished run of a "
                "sweep against the model they started from.")


PAIRINGS = {"index": "by index", "relative": "by relative depth"}


def options(pooling_choice: bool = True, own_pooling: str | None = None) -> CompareConfig:
    """The shared options row: pooling (``own_pooling``: A's sentence-transformers pooling, offered and chosen by
    default, as the atlas offers it), debiased CKA, reconstruction, how layers of another depth pair."""
    c1, c2, c3, c4 = st.columns([1.3, 1, 1, 1.3])
    if pooling_choice:
        choices = ["cls", "mean", *(["model"] if own_pooling else [])]
        if st.session_state.get("compare_pool") not in (None, *choices):
            st.session_state.pop("compare_pool")  # the previous model's own pooling: not offered for this one
        pooling = c1.radio("Vector", choices, index=len(choices) - 1 if own_pooling else 0, horizontal=True,
                           key="compare_pool", format_func={"cls": "[CLS]", "mean": "mean",
                                                            "model": f"model's ({own_pooling})"}.get,
                           help="mean: over the text's own tokens; model's: each model's own sentence-transformers "
                           "pooling, as sentence-transformers computes it (A's is the default when it has one)")
    else:
        pooling = "cls"
        c1.caption("Vector: [CLS] (what each epoch saved)")
    debiased = c2.checkbox("Debiased CKA", key="compare_debiased", help="Nguyen et al. 2021: the plain estimator "
                           "is biased upwards when there are few rows for the width; the debiased one is not. It "
                           "changes the per-layer CKA (its curve and the table); the cross-layer matrix stays linear "
                           "CKA.")
    recon = c3.checkbox("Reconstruction accuracy", True, key="compare_recon", help="Each model's layers read by its "
                        "MLM head (Kao et al.): costs one probe per model, about as long as reading the vectors. A "
                        "pair is read only when both models have a head (their own or a lent one).")
    pairing = c4.radio("Pair layers", list(PAIRINGS), format_func=PAIRINGS.get, horizontal=True,
                       key="compare_pairing", help="Only for models of different depth: by index (layer l of A with "
                       "layer l of B, up to the shallower model's last) or by relative depth (layer / L: every layer "
                       "of the shallower model with the deeper one's nearest, both last layers paired). The "
                       "cross-layer matrix has every pair either way.")
    return CompareConfig(pooling=pooling, debiased=debiased, reconstruction=recon, pairing=pairing)


def progress_of(report):
    return lambda stage, done, n: report(done / max(n, 1), f"{stage} {done}/{n}")


def head_note(result) -> None:
    """Which head read each model, and what predicted (run.json says the same)."""
    info = result.info
    lines = []
    for name, why in (info.get("reconstruction") or {}).items():
        if name == "epochs":
            lines.append(f"Reconstruction of the epochs: {why}.")
            continue
        text = why
        if "no MLM head of its own" in why and name != info["names"][0]:
            text = ("not read: it has no MLM head of its own. Name the masked LM it was fine-tuned from under "
                    "*Read B's layers with the MLM head of* (A's own, usually) to read it")
        elif "no MLM head of its own" in why:
            text = ("not read: it has no MLM head of its own. Lend one in the sidebar (*Revision, device, precision, "
                    "MLM head*)")
        lines.append(f"**{md_plain(name)}**: {text}.")
    for name, head in (info.get("head_predictions") or {}).items():
        if head:
            lines.append(f"Predictions of **{md_plain(name)}** in the movers table (*head*): {md_plain(head)}.")
    if lines:
        st.caption("  \n".join(lines))


HEADERS = {
    "cka": ("CKA", "linear CKA of A's and B's layer (debiased if chosen)"),
    "cka_ci_low": ("CKA low", "95% jackknife interval over rows"), "cka_ci_high": ("CKA high", ""),
    "layer_b": ("B's layer", "the layer of B paired with A's (models of different depth)"),
    "mean_movement": ("mean movement", "cosine distance after Procrustes alignment of B onto A (uncentred: a "
                      "direction every row shares weighs in it)"),
    "median_movement": ("median movement", ""),
    "neighbours_mostly_changed": ("neighbours changed", "share of rows keeping fewer than half of their 10 nearest "
                                  "neighbours"),
    "probe_accuracy_a": ("probe A", "linear probe, out-of-fold, same folds for A and B"),
    "probe_ci_low_a": ("probe A low", "95% Wilson interval"), "probe_ci_high_a": ("probe A high", ""),
    "probe_accuracy_b": ("probe B", ""), "probe_ci_low_b": ("probe B low", ""), "probe_ci_high_b": ("probe B high", ""),
    "probe_change": ("probe B - A", ""),
    "mcnemar_p": ("probe McNemar p", "exact test on the rows one model's probe gets right and the other's wrong"),
    "probe_majority_baseline": ("majority class", "accuracy of always predicting the most frequent class: what the "
                                "probe accuracies are read against"),
    "recon_accuracy_a": ("recon A", "token accuracy through the MLM head (Kao et al.), non-special tokens"),
    "recon_ci_low_a": ("recon A low", "95% Wilson interval over tokens"), "recon_ci_high_a": ("recon A high", ""),
    "recon_accuracy_b": ("recon B", ""), "recon_ci_low_b": ("recon B low", ""), "recon_ci_high_b": ("recon B high", ""),
    "recon_change": ("recon B - A", "change in token accuracy"),
    "recon_change_ci_low": ("recon change low", "95% paired bootstrap over sentences (2,000 resamples)"),
    "recon_change_ci_high": ("recon change high", ""),
    "recon_mcnemar_p": ("recon McNemar p", "exact test on the tokens one model reconstructs and the other does not"),
}
MOVER_HEADERS = {"layer_b": ("B's layer", "the layer of B paired with A's"),
                 "movement": ("moved", "cosine distance after aligning B onto A"),
                 "movement_raw": ("moved (raw)", "without the alignment"),
                 "neighbour_overlap": ("neighbours kept", "share of the 10 nearest kept"),
                 "probe_prediction_a": ("probe A", "the linear probe's out-of-fold prediction at this layer, A"),
                 "probe_prediction_b": ("probe B", "the same for B"),
                 "head_prediction_a": ("head A", "A's own classifier head (the same at every layer)"),
                 "head_prediction_b": ("head B", "B's own classifier head (the same at every layer)")}


def layer_names_of(info: dict, model: int, depth: int) -> list[str]:
    """Model ``model``'s (0 = A) own layer names as the comparison recorded them, else generic ones."""
    recorded = info.get("layer_names") or []
    return recorded[model] if model < len(recorded) else [layer_name(i, depth) for i in range(depth + 1)]


def pairing_note(pairing: dict, a_name: str) -> str | None:
    """How the layers of two models of different depth were paired, and which were left out (None: equal depths)."""
    la, lb = pairing["depths"]
    if la == lb:
        return None
    how = ("paired by index (layer l of A with layer l of B)" if pairing["pairing"] == "index" else
           "paired by relative depth (layer / L: each layer of the shallower model with the deeper one's nearest)")
    pairs = ", ".join(f"{i}↔{j}" for i, j in pairing["pairs"])
    out = [f"{side}'s {', '.join(map(str, pairing[f'left_out_{side.lower()}']))}" for side in "AB"
           if pairing[f"left_out_{side.lower()}"]]
    return (f"A ({md_plain(a_name)}) has {la} layers and B ({md_plain(pairing['model_b'])}) {lb}: the per-layer "
            f"curves, table, movers and map are {how}: {pairs}; left out: {'; '.join(out) or 'none'} (they appear "
            "only in the cross-layer matrix, which has every layer of both).")


def undefined_note(summary, names: list[str], info: dict) -> None:
    """Why some per-layer cells are empty: a layer whose vectors are the same for every row (layer 0's [CLS])."""
    empty = sorted(set(summary.loc[summary["cka"].isna(), "layer"]))
    if empty:
        where = ", ".join(names[i] if i < len(names) else str(i) for i in empty)
        st.caption(f"Empty cells at {where}: there a model's vector is the same vector for every text ([CLS] at the "
                   "embeddings is the [CLS] embedding plus position 0, whatever the text), so CKA, its interval, "
                   "movement and neighbours are undefined (not \"nothing moved\"); the probe there can only guess.")
    if info.get("few_rows"):
        st.warning(f"{md_plain(info['few_rows'])}.")


def show(result, texts: dict, epochs: bool = False) -> None:
    """Everything a comparison shows: curves, the cross matrix, the per-layer table, movers and the shared map, with
    each model's own layer names; the cross-layer matrix first when the models' depths differ."""
    summary, info = result.layer_summary, result.info
    a_name = info["names"][0]
    bs = list(dict.fromkeys(summary["model_b"]))
    names = layer_names_of(info, 0, int(result.cka_cross["layer_a"].max()))
    pick = bs[0]
    if len(bs) > 1 and not epochs:
        pick = st.selectbox("B for the cross matrix, movers and map", bs, key="compare_pick")
    b_index = 0 if epochs else info["names"].index(pick, 1)
    cross = result.cka_cross[result.cka_cross["model_b"] == (pick if not epochs else bs[-1])]
    names_b = names if epochs else layer_names_of(info, b_index, int(cross["layer_b"].max()))
    pairings = {p["model_b"]: p for p in info.get("layer_pairs") or []}
    st.caption(f"A = {md_plain(a_name)}; {len(bs)} compared ({md_plain(', '.join(bs[:3]))}"
               f"{', …' if len(bs) > 3 else ''}); {info['rows']:,} rows"
               + (f" ({md_plain(info['rows_are'])})" if info.get("rows_are") else "")
               + (f"; vector: each model's own pooling ({md_plain(info['poolings'][0])} for A)"
                  if info.get("poolings") else "")
               + f"; CKA interval: {info['cka_interval']}; computed in {info['seconds']:.1f} s.")
    for note in filter(None, (pairing_note(p, a_name) for p in pairings.values())):
        st.caption(note)
    head_note(result)
    zoom = st.checkbox("Zoom the accuracy axes to the data", key="compare_zoom", help="The accuracy axes run from 0 "
                       "to 1 by default, so small differences are not blown up; zoom in to see close curves apart.")

    def accuracy_chart(fig, name):
        if zoom:
            fig.update_yaxes(range=None, autorange=True)
        chart(fig, name)

    differ = any(p["depths"][0] != p["depths"][1] for p in pairings.values())
    views = {"pairs": "Layer by layer (paired layers)", "cross": "Every layer of A against every layer of B"}
    order = ["cross", "pairs"] if differ else ["pairs", "cross"]
    tabs = dict(zip(order, st.tabs([views[v] for v in order]), strict=True))
    by_epoch = summary.assign(model_b="epoch " + summary["epoch"].astype(str)) if epochs else summary
    with tabs["pairs"]:
        if epochs:
            chart(epoch_curves(summary, "cka", names, "CKA of each layer to the base's, per epoch (95% jackknife "
                               "interval)", "linear CKA", band=("cka_ci_low", "cka_ci_high")), "compare_epochs_cka")
            if "probe_accuracy_b" in summary:
                accuracy_chart(paired_accuracy_curves(by_epoch, "probe", names, "Linear-probe accuracy per layer: "
                                                      "the base (A, dashed) and each epoch (out-of-fold, 95% Wilson)",
                                                      epoch_colours(len(bs))), "compare_epochs_probe")
        else:
            chart(paired_cka_curve(summary, names, names_b), "compare_cka")
            if "probe_accuracy_b" in summary:
                accuracy_chart(paired_accuracy_curves(summary, "probe", names, "Linear-probe accuracy per layer "
                                                      "(out-of-fold, 95% Wilson)", layer_names_b=names_b),
                               "compare_probe")
        if "recon_accuracy_a" in summary and summary["recon_accuracy_a"].notna().any():
            shown = by_epoch[summary["recon_accuracy_b"].notna()] if summary["recon_accuracy_b"].notna().any() else \
                by_epoch[summary["model_b"] == bs[0]]
            accuracy_chart(paired_accuracy_curves(shown, "recon", names, "Reconstruction accuracy per layer through "
                                                  "the MLM head (95% Wilson over tokens)", layer_names_b=names_b),
                           "compare_recon")
    with tabs["cross"]:
        matrix = cross.pivot(index="layer_a", columns="layer_b", values="cka").to_numpy()
        chart(cka_heatmap(matrix, names, "Linear CKA: every layer of A against every layer of B"
                          + (f" ({plain(bs[-1])})" if epochs else ""), names_b[:matrix.shape[1]],
                          x_title=f"B ({plain(pick)})" if not epochs else "B", y_title=f"A ({plain(a_name)})"),
              "compare_cka_cross")
        st.caption("Linear CKA whatever *Debiased CKA* says; blank cells: a layer whose vectors are the same for every "
                   "text.")

    st.subheader("Per layer")
    drop = ["model_a"] + (["model_b"] if len(bs) == 1 else [])
    table(summary.drop(columns=drop), HEADERS)
    if ((summary["cka"] < 0.9) & (summary["mean_movement"] < 0.01)).any():  # both defined, and they disagree
        st.caption("Read movement with CKA: at a layer where CKA is low but the rows barely moved, the two models "
                   "share one direction that every row points along, and the rotation lines those up. Movement is an "
                   "uncentred cosine distance, so that direction dominates it; CKA and the neighbours changed say "
                   "how differently the rows are arranged (docs/compare.md, 'How to read movement').")
    st.download_button("layer_summary.csv", to_csv(summary), "layer_summary.csv", key="compare_dl")
    result_report_button(Tables("compare", {"layer_summary.csv": summary, "cka_cross.csv": cross}, info),
                         "compare")
    undefined_note(summary[summary["model_b"] == pick] if not epochs else summary, names, info)

    st.subheader("Movers and the shared map")
    c1, c2, c3 = st.columns([3, 3, 1])
    rows_of_pick = summary[summary["model_b"] == pick] if not epochs else summary[summary["model_b"] == bs[0]]
    labels = dict(zip(rows_of_pick["layer"], pair_labels(rows_of_pick, names, names_b), strict=True))
    layers = sorted(labels)
    layer = c1.select_slider("Layer", options=layers, value=layers[-1], format_func=labels.get,
                             key="compare_layer")
    if epochs:
        numbers = sorted(set(summary["epoch"]))
        epoch = c2.select_slider("Epoch", options=numbers, value=numbers[-1], key="compare_epoch",
                                 help="The map keeps each point's place from epoch to epoch: one PCA per layer of the "
                                 "base's and every epoch's vectors pooled.")
        pick = summary.loc[summary["epoch"] == epoch, "model_b"].iloc[0]
    top_n = int(c3.number_input("Examples shown", 1, 100, 10, key="compare_topn"))
    m = result.movers
    movers = m[(m["layer"] == layer) & (m["model_b"] == pick)].sort_values("movement", ascending=False)
    columns = [c for c in ("example_id", "text", "label", "movement", "movement_raw", "neighbour_overlap",
                           "probe_prediction_a", "probe_prediction_b", "head_prediction_a", "head_prediction_b")
               if c in movers.columns and not (c.startswith("head_") and movers[c].isna().all())]
    where = labels[layer]
    st.caption(f"Moved most at {where}" + (f", {md_plain(pick)}" if len(bs) > 1 else "") + ": probe A / probe B "
               "are the linear probe's out-of-fold predictions at this layer; head A / head B a classifier's own "
               "prediction (the same at every layer), where a model has one."
               + (" Movement and neighbours are undefined at this layer (the same vector for every text)."
                  if movers["movement"].isna().all() else ""))
    table(movers[columns].head(top_n), MOVER_HEADERS)
    st.caption(f"Moved least at {where}")
    table(movers[columns].tail(top_n).iloc[::-1], MOVER_HEADERS)
    if len(result.coords):
        coords = result.coords[(result.coords["layer"] == layer) & (result.coords["model_b"] == pick)]
        chart(aligned_map(coords, (a_name, pick), texts, list(np.asarray(movers["example_id"])[:top_n])),
              "compare_map")
        st.caption("Exact PCA of A's vectors and B's rotated onto A's (the orthogonal Procrustes rotation the "
                   "movement is measured after), pooled" + (" over the base and every epoch, so a point whose "
                   "vectors do not change keeps its place as you move the epoch slider; " if epochs else "; ")
                   + "so the map shows what the movement numbers measure (a copy of A in another basis lies on A's "
                   "points). Each layer's map is rotated onto the previous one, so a point keeps its place as you "
                   "move the layer slider too. Lines join the examples that moved most from A to B.")


def run_and_show(key, label: str, compute, texts: dict, request_key: str, epochs: bool = False) -> None:
    """The comparison under ``key`` (computed under a progress bar with a Stop that forgets ``request_key``), then
    shown."""
    stop = stop_button("The comparison", request_key)
    try:
        result = shared_result(key, label, compute)
    except (InputError, ModelLoadError, ValueError) as exc:  # different tokenizers, a bad checkpoint: a message
        st.error(str(exc))
        st.stop()
    except Exception as exc:  # never a traceback in the UI
        st.error(f"The comparison failed: {type(exc).__name__}: {exc}")
        st.stop()
    finally:
        stop.empty()
    show(result, texts, epochs)


def finished_jobs() -> list:
    return [j for j in jobs_of("finetune", limit=10_000) if j.status == "succeeded"]


def checked(spec: ModelSpec) -> ModelSpec:
    """``spec`` when the browser may load its model and the head it borrows (:func:`browser_model`, the check the
    sidebar and the *Compare with* field apply); an :class:`InputError` otherwise. A job's recorded base and lent
    head come from a job that may have been submitted from the CLI, which loads any path: they are checked here as a
    typed name is."""
    browser_model(spec.name)
    if spec.head_from:
        browser_model(spec.head_from)
    return spec


def load_checkpoint_model(spec):
    """A job's fine-tuned encoder with the head it can borrow; without it (and said) when the head cannot be lent."""
    try:
        return model_cache().get(spec)
    except ModelLoadError as exc:
        st.warning(f"{exc}: its reconstruction is left blank.")
        return model_cache().get(dataclasses.replace(spec, head_from=None))


if what == "pair":
    inputs = labelled_inputs("compare", max_rows())
    c1, c2 = st.columns([3, 2])
    other = c1.text_input("Compare with (B)", key="compare_model", persist_state="session",  # kept across models
                          placeholder="hub id, local directory, job:N or random",
                          help=f"The checkpoint to set against the sidebar's model: {COMPARE_HELP}.").strip()
    head_from = c2.text_input("Read B's layers with the MLM head of", key="compare_head_from", persist_state="session",
                              placeholder="B's own (a job:N: its base's)",
                              help="For the reconstruction columns, when B has no MLM head of its own (a fine-tuned "
                              "classifier): a masked LM of the same family, hidden size and vocabulary, usually the "
                              "model B was fine-tuned from (A). A model with its own head keeps it.").strip()
    config = options(own_pooling=loaded.pooling)
    wait_for_run("compare_request", inputs is not None and bool(other) and st.button(
        "Compare", type="primary", key="compare_run"), (inputs, other, head_from, config),
        "Choose the rows and the checkpoint B, then compare. Vectors are cached on disk per model and data: a model "
        "the atlas already read is not read again.")
    try:
        name, lent, label = compared_model(other, loaded.spec.name)
        if head_from:
            browser_model(head_from)  # a folder only under the model roots
    except (InputError, ModelLoadError) as exc:
        st.error(str(exc))
        st.stop()
    spec_b = dataclasses.replace(loaded.spec, name=name, revision=None, head_from=lent or head_from or None)

    def compute(report):
        b = model_cache().get(spec_b)
        if b.mlm_head is None and head_from and config.reconstruction:
            b = model_cache().get(dataclasses.replace(spec_b, head_from=head_from))
        return compare([loaded, b], inputs, config, progress=progress_of(report), names=[loaded.spec.name, label])

    key = result_key("pair", loaded.spec.resolved().to_dict(), spec_b.resolved().to_dict(), label,
                     inputs.content_hash(), inputs.ids, config.to_dict())
    run_and_show(key, "Comparing", compute, dict(zip(inputs.ids, inputs.texts, strict=True)), "compare_request")

elif what == "epochs":
    runs, refused = {}, {}
    for job in finished_jobs():
        try:
            runs[job.id] = (job, job_run(job.artifacts, job.config, job.metrics, job.label))
        except InputError as exc:
            refused[job.id] = str(exc)
    wanted = st.session_state.get("compare_epochs_job")
    if wanted is not None and wanted not in runs:
        st.warning(refused.get(wanted, f"Job #{wanted} is not a finished fine-tuning job."))
        st.session_state.pop("compare_epochs_job")
    if not runs:
        st.info("No finished fine-tuning job with per-epoch vectors yet: run one on the **Fine-tuning jobs** page "
                "(it saves each epoch's validation [CLS] vectors unless *save vectors* is off).")
        st.stop()
    job_id = st.selectbox("Fine-tuning job", list(runs), key="compare_epochs_job",
                          format_func=lambda i: f"#{i} {runs[i][0].name} · {len(runs[i][1].epochs())} epochs")
    job, run = runs[job_id]
    st.caption(f"A = **{md_plain(run.config.get('model'))}**, the model {md_plain(job.label)} started from (the "
               "sidebar's model is not used here); B = the job's [CLS] vectors after each epoch, as the job saved "
               "them, on its validation rows.")
    try:  # the job's recorded base and the head it lends: the same check as a model typed in the browser
        base_spec = checked(dataclasses.replace(run.base_spec(), device=loaded.spec.device, dtype=loaded.spec.dtype))
        spec = run.checkpoint_spec(loaded.spec.device)
        spec = checked(spec) if spec is not None else None
    except InputError as exc:
        st.error(f"{md_plain(job.label)}: {exc}")
        st.stop()
    config = options(pooling_choice=False)
    wait_for_run("compare_epochs_request", st.button("Compare the epochs", type="primary", key="compare_epochs_run"),
                 (job_id, config), "Compare each epoch of the job with the model it started from: only the base's "
                 "vectors are computed (and cached); the epochs' are read from the job's files.")

    def compute(report):
        base = model_cache().get(base_spec)
        checkpoint = load_checkpoint_model(spec) if spec is not None and spec.head_from else None
        return compare_epochs(base, run, config, checkpoint, progress=progress_of(report))

    try:
        rows = validation_rows(run)
    except InputError as exc:
        st.error(str(exc))
        st.stop()
    key = result_key("epochs", job.id, job.finished, base_spec.resolved().to_dict(), config.to_dict())
    run_and_show(key, "Comparing the epochs", compute, dict(zip(rows.ids, rows.texts, strict=True)),
                 "compare_epochs_request", epochs=True)

else:
    jobs = finished_jobs()
    groups = sorted({j.group for j in jobs if j.group})
    if not groups:
        st.info("No sweep group has a finished run yet: submit a sweep on the **Fine-tuning jobs** page (the *Sweep* "
                "field queues one job per combination in one group).")
        st.stop()
    group = st.selectbox("Sweep group", groups, key="compare_group")
    try:  # the one resolver of a group, as `layerlens compare --group` resolves it
        found = resolve_group(jobs, group)
        members = list(found.members)
    except InputError as exc:
        st.error(md_plain(str(exc)))
        st.stop()
    base_name = members[0].config.get("model")
    st.caption(f"A = **{md_plain(base_name)}**, the model the group's {len(members)} finished runs started from (the "
               "sidebar's model is not used here); B = each run's fine-tuned model, read by A's MLM head.")
    st.session_state.setdefault("compare_job", members[0].id)  # offers its held-out rows as the data
    split = ("train", "val", "test", "val_fraction", "seed", "folds")
    differ = [j.id for j in members[1:] if any(j.config.get(k) != members[0].config.get(k) for k in split)]
    if differ and st.session_state.get("compare_source") == f"Held-out rows of job #{st.session_state['compare_job']}":
        st.warning(f"Runs {', '.join(f'#{i}' for i in differ)} held out other rows than job #{members[0].id} (another "
                   "seed or split): they trained on some of its held-out rows. For rows none of them saw, choose "
                   "another data set (the *Demo word-order set*, or your own).")
    inputs = labelled_inputs("compare", max_rows())
    config = options()
    wait_for_run("compare_group_request", inputs is not None and st.button(
        "Compare the group", type="primary", key="compare_group_run"), (group, inputs, config),
        f"Choose the rows (the held-out rows of job #{members[0].id} are offered), then compare.")
    try:  # each run's fine-tuned encoder, read by the head of the model it started from when it had one
        specs = [(ref.name, ref.head_from, ref.label) for ref in found.refs()]
        for name, lent, _ in specs:
            checked(ModelSpec(name, head_from=lent))
        base_spec = dataclasses.replace(loaded.spec, name=browser_model(base_name), revision=None, head_from=None)
    except InputError as exc:
        st.error(str(exc))
        st.stop()

    def compute(report):
        models = [model_cache().get(base_spec)]
        for name, lent, _ in specs:
            models.append(load_checkpoint_model(dataclasses.replace(loaded.spec, name=name, revision=None,
                                                                    head_from=lent)))
        return compare(models, inputs, config, progress=progress_of(report),
                       names=[base_name, *(label for _, _, label in specs)])

    key = result_key("group", group, [j.id for j in members], base_spec.resolved().to_dict(), inputs.content_hash(),
                     inputs.ids, config.to_dict())
    run_and_show(key, "Comparing the group", compute, dict(zip(inputs.ids, inputs.texts, strict=True)),
                 "compare_group_request")
