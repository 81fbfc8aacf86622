"""Fine-tuning jobs: submit background runs, watch them live, stop them, compare heads, vote an ensemble."""

import os

import numpy as np
import pandas as pd
import streamlit as st

from analysis.core.dataroots import LABELLED_SUFFIXES, browser_model, browser_source, save_upload
from analysis.core.figures import plain
from analysis.core.inputs import FORMATS, InputError, columns_of
from analysis.core.options import kind as schema_kind
from analysis.core.scores import classification_metrics
from analysis.training.finetune import majority_vote
from analysis.training.heads import head_names
from analysis.training.options import (
    PRESETS,
    SWEEPABLE,
    FinetuneConfig,
    FinetuneOptions,
    grid,
    model_config,
    model_defaults,
    resolve,
    sources,
)
from analysis.training.plots import confusion_matrix, history_chart, runs_compared
from jobs import backends, kinds
from jobs.store import FINISHED, JobStore, StoreError
from jobs.submit import SubmitError, submit, submit_sweep
from ui.inputs import server_file, uploads_panel
from ui.jobs import comparison_table, job_table, open_values, score_line, shown, tokens_summary
from ui.navigation import prefill
from ui.options import option_input, reset_form
from ui.report import report_button
from ui.results import chart, md_plain
from ui.sidebar import ANALYSES, start_page

loaded = start_page("Fine-tuning jobs", (
    "Fine-tune the encoder with a **layer-pooling head** as a background job: it runs in its own process, "
    "keeps running when you close the browser, and can be stopped. Heads: the final [CLS] (`cls`), one layer "
    "(`layer-K`), pooled layers (`last4-mean`, ...), LSTM or attention pooling over the layers' [CLS] "
    "(Song et al. 2020), a scalar mix, or GRUBERT's GRU fusion. Finished attention and scalar-mix runs show "
    "their learned layer weights on the **Layer weights** page."))
try:
    store = JobStore()
    store.list()
except StoreError as exc:  # a damaged or unreadable jobs.db: one line naming it and what to do
    st.error(str(exc))
    st.stop()

st.subheader("New job")
source = st.radio("Training data", ["Demo sentiment set", "Upload a file", "A file on the server",
                                    "Hugging Face dataset"], horizontal=True, key="job_source")
text_col, pair_col, label_col, train = "text", None, "label", None
try:
    if source == "Demo sentiment set":
        train = "demo"
        pair_col = "aspect" if st.checkbox("Aspect as the second text", key="job_demo_pair") else None
    elif source == "Upload a file":
        upload = st.file_uploader("A .csv, .tsv or .jsonl file", type=list(FORMATS[1:]), key="job_upload")
        if upload is not None:
            data = upload.getvalue()
            columns = columns_of(data, upload.name)
            train = str(save_upload(data, upload.name))  # whole or absent; the job process reads it from there
            c1, c2, c3 = st.columns(3)
            text_col = c1.selectbox("Text column", columns, key="job_text_col")
            pair_col = c2.selectbox("Second text", ["(none)", *columns], key="job_pair_col")
            label_col = c3.selectbox("Label column", columns, index=len(columns) - 1, key="job_label_col")
            pair_col = None if pair_col == "(none)" else pair_col
        uploads_panel("job")
    else:
        hub = source == "Hugging Face dataset"
        if hub:
            train = browser_source(st.text_input("Dataset", "hf:glue/sst2:train", key="job_path",
                                                 help="hf:NAME[/CONFIG]:SPLIT, a dataset name from the hub"))
        else:
            train = server_file("job_server_file", suffixes=LABELLED_SUFFIXES)  # a job needs a label column
        c1, c2, c3 = st.columns(3)
        text_col = c1.text_input("Text column", "sentence" if hub else "text", key="job_text_col_t")
        pair_col = c2.text_input("Second text column (optional)", key="job_pair_col_t") or None
        label_col = c3.text_input("Label column", "label", key="job_label_col_t")
except InputError as exc:
    st.error(str(exc))

MAIN = ["head", "epochs", "lr", "batch_size", "layer_decay", "max_length"]
WHERE = ["backend", "num_processes", "slurm_partition", "slurm_time", "slurm_gpus", "revision", "dtype"]
# every other training option, from the schema: a new option is on the form unless the schema keeps it from the
# browser with its reason (FinetuneOptions.kept_from_browser; tests/integration/test_job_forms.py)
MORE = [name for name in FinetuneConfig.model_fields if name not in MAIN + WHERE
        and name not in FinetuneOptions.kept_from_browser()]
st.session_state.setdefault("job_model", loaded.spec.name)  # Layer duplication may prefill its export
st.session_state.setdefault("job_preset", "(none)")


def allowed_model(name: str) -> str | None:
    """``name`` when the browser may use it (a hub id or a folder under the model roots), else None: nothing
    of a folder outside them is read, not even its config."""
    try:
        return browser_model(name)
    except InputError:
        return None


def reset() -> None:
    preset = st.session_state["job_preset"]
    reset_form("job", MAIN + MORE + WHERE, allowed_model(st.session_state["job_model"]) or loaded.spec.name,
               None if preset == "(none)" else preset)


if "job_epochs" not in st.session_state or st.session_state.pop("job_reset", False):
    reset()  # first visit, or a model handed over by another page (its own defaults, said in the caption)
c1, c2 = st.columns([3, 1])
model = c1.text_input("Model", key="job_model", on_change=reset, help="the sidebar's model by default; any hub id "
                      "or a local directory under the dashboard's model folders (LAYERLENS_MODEL_DIRS; always the "
                      "exports of Layer duplication and the fine-tuned jobs)")
preset = c2.selectbox("Preset", ["(none)", *PRESETS], key="job_preset", on_change=reset,
                      help="the papers' settings (Sun et al. 2019; GRUBERT): choosing one fills in the fields below; "
                      "what you then change wins")
try:
    model_ok = bool(browser_model(model))
except InputError as exc:
    model_ok = False
    st.error(str(exc))
target = model_config(model) if model_ok else None  # the form's model (it may differ from the sidebar's)
cols = st.columns(len(MAIN))
values = {name: option_input(col, name, "job", head_names(target.num_hidden_layers if target is not None
                                                          else loaded.num_layers) if name == "head" else None)
          for col, name in zip(cols, MAIN, strict=True)}
positions = getattr(target, "max_position_embeddings", None)
if positions and values["max_length"] > positions:
    st.caption(f"Max tokens {values['max_length']} is more than {model}'s {positions} positions: texts are cut at "
               f"{positions} (run.json records the length used).")
if target is not None and (preset_lr := PRESETS.get(preset, {}).get("lr")) and model_defaults(model) \
        and preset_lr < model_defaults(model)["lr"]:
    st.warning(f"The preset's learning rate {preset_lr:g} is bert-base's; {model} (hidden size "
               f"{target.hidden_size}) learns little at it (its own default is {model_defaults(model)['lr']:g}).")
with st.expander("More options: schedule, regularisation, folds, further pre-training, saved checkpoints"):
    numbers = [n for n in MORE if schema_kind(n, FinetuneOptions) != "bool"]
    switches = [n for n in MORE if schema_kind(n, FinetuneOptions) == "bool"]  # a row of their own: labels whole
    cols = st.columns(5)
    values |= {name: option_input(cols[i % 5], name, "job") for i, name in enumerate(numbers)}
    cols = st.columns(len(switches) or 1)
    values |= {name: option_input(cols[i], name, "job") for i, name in enumerate(switches)}
    st.caption("A series across fine-tuning (the Across checkpoints page) needs **save each epoch's encoder**; "
               "**further pre-training steps** first trains the masked LM on the training texts, and its head then "
               "reads the saved epochs.")
with st.expander("Where it runs: this machine or Slurm, processes"):
    cols = st.columns(len(WHERE))
    values |= {name: option_input(col, name, "job") for col, name in zip(cols, WHERE, strict=True)}
    st.caption("Slurm: one Slurm job per LayerLens job (through submitit); the dashboard must run on a Slurm login "
               "node and LAYERLENS_HOME must be on a filesystem the nodes share (README: 'More than one process, and "
               "clusters'). With several processes the batch size stays the global batch.")
sweep = st.text_input("Sweep (optional)", key="job_grid", placeholder="head=cls,attention lr=2e-5,5e-5",
                      help="one job per combination, in one group the comparison below can pick: option=value,value "
                      "... separated by spaces; the values replace the form's. A sweep varies the training options "
                      f"only ({', '.join(SWEEPABLE)}); the data, the columns, the model, the preset and where it "
                      "runs are the form's")
config = {"model": model, "train": train, "text_column": text_col, "pair_column": pair_col, "label_column": label_col,
          "preset": None if preset == "(none)" else preset, **values}
try:
    if not model_ok:
        raise InputError("the model is refused above")
    origin = sources(resolve(config))
    notes = {}
    for name, where in origin.items():
        if where != "given":
            notes.setdefault(where, []).append(name.replace("_", " "))
    st.caption("Defaults: LayerLens's own" + "".join(f"; {', '.join(names)} from the {where}" for where, names
                                                      in notes.items()) + ". The README's option table lists them.")
except InputError:
    pass  # shown when submitting
try:
    points = grid(sweep.split(), allowed=SWEEPABLE) if sweep.strip() else []
except InputError as exc:
    points = None
    st.error(str(exc))
if points and len(points) == 1:  # one point is one job with those values, not a sweep group of one (item 17)
    config, points = {**config, **points[0]}, []
label = f"Submit {len(points)} jobs" if points else "Submit the job"
if st.button(label, type="primary", key="job_submit", disabled=not train or points is None or not model_ok):
    start = not os.environ.get("LAYERLENS_JOBS_NO_WORKER")
    try:
        if points:
            group, ids = submit_sweep(config, points, store, start_worker=start, browser=True)
            st.success(f"{len(ids)} jobs queued in group '{group}' (jobs {ids[0]}–{ids[-1]}).")
            job_id = ids[0]
        else:
            job_id = submit(config, store, start_worker=start, browser=True)
            st.success(f"Job {job_id} queued ({store.get(job_id).where}): it starts as soon as the device is free.")
        st.session_state["job_view"] = job_id  # show the new job below
    except SubmitError as exc:
        st.error(f"Not queued: {exc}")


def show_scores(job, container, matrix_container) -> None:
    """The finished job's score with its baseline, a one-class warning and its confusion matrix."""
    m = job.metrics
    container.markdown(f"**{m.get('evaluated_on', '')} set**: {score_line(m)}")
    if m.get("one_class"):
        only = md_plain(m["baseline"]["class"]) if m.get("baseline") else "?"
        container.warning(f"Every prediction is '{only}' or one other single class: the accuracy is a class rate, "
                          "not a sign that the model learned.")
    if m.get("confusion_matrix"):
        names = [plain(n) for n in m["labels"]]
        chart(confusion_matrix(m["confusion_matrix"], names), f"job{job.id}_confusion", matrix_container,
              key=f"confusion_{job.id}")


@st.fragment(run_every=2)
def live() -> None:
    backends.refresh(store)  # Slurm jobs that ended without recording a result
    jobs = store.list()
    done = sum(j.status in FINISHED for j in jobs)
    if st.session_state.setdefault("jobs_done", done) != done:  # a job ended: redraw the comparison below too
        st.session_state["jobs_done"] = done
        st.rerun(scope="app")
    st.subheader("Jobs")
    if not jobs:
        st.caption("No jobs yet.")
        return
    table = job_table(jobs)
    table["progress"] = (100 * table["progress"]).round()  # whole percents: "49%", not "49.36%"
    st.dataframe(shown(table), hide_index=True, width="stretch", column_config={
        "progress": st.column_config.ProgressColumn("progress", min_value=0, max_value=100, format="%d%%",
                                                    width="small"),
        "name": st.column_config.TextColumn("name", width="medium"),
        "stage": st.column_config.TextColumn("stage", width="large"),
        "batch loss": st.column_config.TextColumn("batch loss", help="the last mini-batch's loss (live); the "
                                                    "curves below show each epoch's mean")})
    labels = {j.id: f"#{j.id} {j.name} ({j.status})" for j in jobs}
    chosen = st.selectbox("Job", list(labels), format_func=labels.get, key="job_view")
    job = store.get(chosen)
    left, right = st.columns([3, 1])
    if stage := kinds.stage(job):  # 'extract: shard 3 of 9 (...) · 30% of the job', 'cancelling…', 'resumed after 4'
        left.caption(stage)
    if (opens := kinds.opened_on(job)) is not None:  # its kind's page opens it (a tokens job: the Token atlas)
        page, how = opens
        title = next((p.title for p in ANALYSES if p.file == page), page)
        if summary := tokens_summary(job):
            left.caption(summary)
        if left.button(f"Open it on the {title} page ↗", key=f"job_open_{job.id}", help=f"{how[0].upper()}{how[1:]}"):
            prefill(page, open_values(job, page))
    elif job.status == "succeeded" and not (job.metrics and "accuracy" in job.metrics):  # a task's files
        left.caption(f"Its files ({', '.join((job.metrics or {}).get('files', [])) or 'none listed'}) are in "
                     f"`{job.artifacts}`.")
        report_button(job.artifacts, f"job_{job.id}_files", left)
    if job.progress.get("history"):
        chart(history_chart(job.progress["history"]), f"job{job.id}_curves", left, key=f"curve_{job.id}")
    if job.status not in FINISHED and right.button("Cancel", key=f"cancel_{job.id}"):
        right.info(f"Job {job.id}: {backends.cancel(store, job.id)}")
    if job.error:
        right.error(job.error[-600:])
    if job.metrics and "accuracy" in job.metrics:
        show_scores(job, *st.columns(2))
    with st.expander("Log"):
        st.code(job.log_path.read_text(errors="replace")[-5000:] if job.log_path.is_file() else "(no log yet)")


live()


def compare_buttons(finished: list, group: str | None) -> None:
    """Open the Compare checkpoints page on a finished run against the model it started from (its epochs, from the
    vectors each epoch saved; else its fine-tuned model on its held-out rows), or on the picked sweep group."""
    from analysis.training.runs import job_run

    c1, c2, c3, c4 = st.columns([3, 2, 2, 2])
    by_id = {j.id: j for j in finished}
    ids, default = list(by_id), st.session_state.get("job_view")
    chosen = c1.selectbox("Finished run", ids, index=ids.index(default) if default in ids else 0,
                          key="job_compare_one", format_func=lambda i: f"#{i} {by_id[i].name}",
                          label_visibility="collapsed")
    job = by_id[chosen]
    if c2.button("Compare with its base", key="job_go_compare_base", help="Layer by layer against the model it was "
                 "fine-tuned from: every epoch's saved validation vectors, and its final model's reconstruction and "
                 "predictions (Compare checkpoints page)."):
        try:
            job_run(job.artifacts, job.config, job.metrics, job.label)
            values = {"compare_what": "epochs", "compare_epochs_job": job.id}
        except InputError:  # no per-epoch vectors: its fine-tuned model against its base on its held-out rows
            values = {"compare_what": "pair", "compare_model": f"job:{job.id}", "compare_job": job.id,
                      "compare_source": f"Held-out rows of job #{job.id}"}
        prefill("pages/7_Compare_checkpoints.py", values)
    if c4.button("Head importance ↗", key="job_go_heads", disabled=not (job.artifacts / "checkpoint" /
                                                                        "head.json").is_file(),
                 help="Which attention heads this classifier needs: each head's importance for its loss and the "
                 "pruning curve on its held-out rows (Michel et al. 2019; Attention heads page). Needs the saved "
                 "classifier (not k-fold)."):
        prefill("pages/9_Attention_heads.py", {"heads_job": job.id, "heads_open_job": True})
    report_button(job.artifacts, f"job_{job.id}")
    if group is not None:
        members = sorted(j.id for j in finished if j.group == group)
        if c3.button("Compare the group", key="job_go_compare_group", help=f"Each finished run of group '{group}' "
                     "against the model they started from, on the held-out rows of its first run (Compare "
                     "checkpoints page)."):
            prefill("pages/7_Compare_checkpoints.py", {
                "compare_what": "group", "compare_group": group, "compare_job": members[0],
                "compare_source": f"Held-out rows of job #{members[0]}"})
    else:
        c3.caption("Pick a sweep group above to compare its runs.")

finished = [j for j in store.list() if j.status == "succeeded" and j.metrics and "accuracy" in j.metrics]
if finished:
    st.subheader("Compare finished runs")
    groups = sorted({j.group for j in finished if j.group})
    if groups:
        picked_group = st.selectbox("Runs", ["all finished runs", *groups], key="job_compare_group",
                                    format_func=lambda g: g if g == "all finished runs" else f"group: {g}")
        if picked_group != "all finished runs":
            finished = [j for j in finished if j.group == picked_group]
    table = comparison_table(finished)
    st.dataframe(shown(table), hide_index=True, width="stretch")
    compare_buttons(finished, None if not groups or picked_group == "all finished runs" else picked_group)
    st.caption("majority class: the accuracy of always predicting the most frequent class of the run's training "
               "rows, scored on the rows it was evaluated on (the same baseline as the ensemble's below).")
    if table["evaluated on"].nunique() > 1:
        st.caption("These runs were scored on different kinds of rows (see 'evaluated on'): compare like with like.")
    chart(runs_compared(table), "jobs_compared")
    picked = st.multiselect("Majority-vote ensemble of", [j.id for j in finished], key="job_ensemble",
                            help="runs evaluated on the same examples; ties go to the first label")
    if len(picked) >= 2:
        by_id = {j.id: j for j in finished}
        preds = [pd.read_csv(store.directory(i) / "artifacts" / "predictions.csv", keep_default_na=False)
                 for i in picked]
        if any(not p.example_id.equals(preds[0].example_id) for p in preds):
            st.error("These runs were evaluated on different examples; pick runs on the same data.")
        else:
            # the baseline is each run's own: its training rows' majority class, scored on the evaluated rows
            classes = {(by_id[i].metrics.get("baseline") or {}).get("class") for i in picked}
            names = sorted(set(preds[0].label) | {x for p in preds for x in p.prediction} | (classes - {None}))
            vote = majority_vote([np.array([names.index(x) for x in p.prediction]) for p in preds])
            if len(classes) == 1 and None not in classes:
                majority = names.index(classes.pop())
                scores = classification_metrics(vote, [names.index(x) for x in preds[0].label], names, majority)
                st.markdown(f"**Ensemble** on the {len(vote)} rows the runs share: {score_line(scores)}; the "
                            f"baseline is the majority class of the runs' training rows "
                            f"({md_plain(names[majority])}), scored on these rows, as for each run.")
            else:
                scores = classification_metrics(vote, [names.index(x) for x in preds[0].label], names, 0)
                st.markdown(f"**Ensemble** on the {len(vote)} rows the runs share: accuracy {scores['accuracy']:.3f}, "
                            f"macro-F1 {scores['macro_f1']:.3f}. No baseline: these runs' training rows have "
                            "different majority classes.")
