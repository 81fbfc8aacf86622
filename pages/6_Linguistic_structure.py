"""Linguistic structure per layer (issue 27): UPOS and relation probes with control tasks, structural probes."""

import dataclasses
import json
from pathlib import Path

import streamlit as st

from analysis.core.csvout import to_csv
from analysis.core.dataroots import TREEBANK_SUFFIXES, data_roots, save_upload, server_file_picker_label, server_files
from analysis.core.entry import file_digest
from analysis.core.inputs import InputError, max_rows
from analysis.core.layers import parse_layers
from analysis.core.precision import mode
from analysis.core.treebank import read_conllu
from analysis.structure.options import SAMPLE, TASKS, StructureOptions
from analysis.structure.output import read_outputs
from analysis.structure.plots import sentence_trees, task_curves, upos_across_layers
from analysis.tasks import TASKS as ALL_TASKS
from analysis.tasks.structure import StructureRun
from models.loading import ModelLoadError
from ui.inputs import labelled_inputs, uploads_panel
from ui.jobs import finished_structure_jobs, jobs_running, structure_job_form, unfinished_structure_jobs
from ui.navigation import prefill
from ui.report import result_report_button
from ui.results import chart, compared_model, md_plain, result_key, stop_button, wait_for_run
from ui.sidebar import start_page
from ui.tasks import page_options, task_result

STRUCTURE = ALL_TASKS["structure"]

loaded = start_page("Linguistic structure", (
    "What each layer knows about syntax, on Universal Dependencies treebanks (CoNLL-U): **UPOS** per word and the "
    "**dependency relation** per arc (an edge probe, Tenney et al. 2019) with **control tasks** and selectivity "
    "(Hewitt & Liang 2019), the **MDL** online codelength (Voita & Titov 2020), and the **structural probes** "
    "(Hewitt & Manning 2019): tree distances (UUAS) and depths (root accuracy). Probes are trained on one file "
    "and scored on another. Layer 0 is the embedding output."))
SAMPLE_NOTE = ("**A small sample**: the first 300 sentences of UD English-EWT dev (train) and 150 of its test split "
               "(score), bundled with LayerLens (CC BY-SA 4.0, `analysis/data/ud_english_ewt_sample/README.md`). "
               "With so few sentences the numbers are noisy (intervals several points wide): use it to try the "
               "page, and a whole treebank (upload one, or the full EWT) for results.")
SAMPLE_TIME = (" Every task with MDL takes a couple of minutes on a 2-core CPU; untick MDL or drop tasks for a "
               "quicker first look.")


def show(run: StructureRun, about: str, key: str = "structure", sample_note: bool = False, reference=None) -> None:
    """A run's results (the task's :class:`StructureRun`: a page's run, or a finished job's files): the curves (with
    ``reference``, the random-weights twin's probes.csv, as a grey line), where each task lives, one sentence's
    trees, the tables and downloads, the report."""
    result, info = run.result, run.info
    dropped = info["test"]["dropped_too_long"] + info["train"]["dropped_too_long"]
    st.caption(f"{about} · word vector: **{info['word_vector_text']}** · {info['test_sentences_scored']:,} test "
               f"sentences scored · {dropped} sentence(s) longer than the model's {info['max_tokens']} tokens "
               "([CLS] and [SEP] or the model's own special tokens included) dropped (not cut)")
    if sample_note and SAMPLE.resolve() in {Path(info[n]["path"]).resolve().parent for n in ("train", "test")}:
        st.caption(SAMPLE_NOTE.replace("**A small sample**", "Scored on **the bundled small sample**"))
    chart(task_curves(result.probes, reference=reference), f"{key}_curves")
    if "position_baseline" in result.probes and result.probes.position_baseline.notna().any():
        st.caption("Brown dash-dot: what positions alone give on the same test sentences: for UUAS the "
                   "right-branching chain (each word linked to the next), for root accuracy the training file's "
                   "most frequent root position (punctuation excluded in both, as in the probes' scores).")
    if reference is not None:
        st.caption("Grey crosses: the same architecture and tokenizer with seeded random weights (seed 0), probed "
                   "with the same options on the same words: what a probe reads from the input alone.")
    st.subheader("Where each task lives")
    st.dataframe(result.summary, hide_index=True, key=f"{key}_summary", placeholder="—")
    interval = info.get("summary_interval") or ("95% percentile bootstrap over the test sentences with the probes "
                                                "trained once: the test set's sampling error only, not the spread "
                                                "over training seeds")
    st.caption(f"Best layer and the center of gravity (Tenney et al.'s expected layer under cumulative gains). "
               f"**What the intervals cover**: {interval}. The center of gravity is undefined when no layer scores "
               "above the first one: then its interval is empty too; a resample where a statistic is undefined is "
               "left out of its interval, and the share of such resamples is in the *_undefined* columns.")

    if result.trees and any(r["layers"] for r in result.trees):
        st.subheader("One sentence")
        ids = list(range(len(result.trees)))
        pick = st.selectbox("Sentence", ids, key=f"{key}_sentence",
                            format_func=lambda i: " ".join(result.trees[i]["words"])[:120])
        record = result.trees[pick]
        shown = sorted(record["layers"], key=int)
        if shown:
            layer = st.select_slider("Layer", shown, value=shown[-1], key=f"{key}_layer")
            chart(sentence_trees(record, layer), f"{key}_tree")
        if any("predicted_upos" in v for v in record["layers"].values()):
            st.dataframe(upos_across_layers(record), hide_index=True, key=f"{key}_upos", placeholder="—")

    with st.expander("Tables and downloads"):
        st.dataframe(result.probes, hide_index=True, placeholder="—")
        d1, d2, d3, d4, d5 = st.columns(5)
        d1.download_button("probes.csv", to_csv(result.probes), "probes.csv", "text/csv", key=f"dl_{key}_probes")
        d2.download_button("mdl.csv", to_csv(result.mdl), "mdl.csv", "text/csv", key=f"dl_{key}_mdl")
        d3.download_button("summary.csv", to_csv(result.summary), "summary.csv", "text/csv", key=f"dl_{key}_summary")
        d4.download_button("trees.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in result.trees),
                           "trees.jsonl", "application/jsonl", key=f"dl_{key}_trees")
        d5.download_button("run.json", json.dumps(info, indent=2, default=str), "run.json", "application/json",
                           key=f"dl_{key}_run")
    result_report_button(run, key)


MODES = ["Run the probes", "Open a finished job"]
if st.radio("Results", MODES, horizontal=True, key="structure_mode", label_visibility="collapsed") == MODES[1]:
    running = jobs_running("structure")
    ended = unfinished_structure_jobs()
    if ended:
        with st.expander(f"Jobs that did not finish ({len(ended)})"):
            for j in ended[:10]:
                why = ((j.error or "").strip().splitlines() or [""])[-1]
                why = f" · {md_plain(why)}" if why else ""
                st.caption(f"#{j.id} {md_plain(j.name)}: **{j.status}**{why} (log on the Fine-tuning jobs page)")
    done = finished_structure_jobs()
    if not done:
        st.info("No finished linguistic-structure job yet: the job above is offered here as soon as it finishes "
                "(this view refreshes itself)." if running else "No finished linguistic-structure job yet: choose "
                "**Run the probes** above, set the treebanks and tasks, and submit it under **Run it as a "
                "background job**.")
        st.stop()
    by_id = {j.id: j for j in done}
    chosen = by_id[st.selectbox("Finished job", list(by_id), key="structure_job",
                                format_func=lambda i: f"#{i} {by_id[i].name}")]
    try:
        opened = read_outputs(chosen.artifacts)
    except InputError as exc:
        st.error(f"Job #{chosen.id}: its results cannot be opened: {exc}")
        st.stop()
    show(StructureRun(opened, opened.info), f"Job #{chosen.id} · model **{md_plain(opened.info.get('model', '?'))}** · "
         f"{opened.info.get('precision', '')}", key="structure_job", sample_note=True)
    st.stop()



def treebanks() -> list[Path]:
    """The .conllu / .conllu.gz files under the data roots (the bundled sample first, resolved inside them)."""
    return server_files(TREEBANK_SUFFIXES)


files = treebanks()
with st.expander("Upload a treebank"):
    upload = st.file_uploader("CoNLL-U file", type=["conllu", "gz"], key="structure_upload")
    if upload is not None:
        try:
            saved = save_upload(upload.getvalue(), upload.name)
        except InputError as exc:
            st.error(str(exc))
            st.stop()
        files = list(dict.fromkeys([saved, *treebanks()]))
        st.caption(f"Saved as `{saved.name}` under the uploads folder: choose it under **Train on** or **Score on**.")
    uploads_panel("structure")
if not files:
    st.info("No CoNLL-U treebanks on the server: upload one, or put .conllu(.gz) files under "
            f"{', '.join(map(str, data_roots()))} (LAYERLENS_DATA_DIRS).")
    st.stop()


def default(name: str) -> int:
    """The bundled sample's file when it is offered (a first look in seconds), else the full EWT file."""
    sample = [i for i, f in enumerate(files) if f.parent == SAMPLE.resolve() and f.name.startswith(name)]
    return sample[0] if sample else next((i for i, f in enumerate(files) if f.name.startswith(name)), 0)


c1, c2 = st.columns(2)
train = c1.selectbox("Train on", files, index=default("en_ewt-ud-dev"), key="structure_train",
                     format_func=server_file_picker_label)
test = c2.selectbox("Score on", files, index=default("en_ewt-ud-test"), key="structure_test",
                    format_func=server_file_picker_label)
if SAMPLE.resolve() in (Path(train).parent, Path(test).parent):
    st.caption(SAMPLE_NOTE + SAMPLE_TIME)
if st.button("Heads vs probes: attention heads as parsers on this treebank ↗", key="structure_to_heads",
             help="Open the Attention heads page on the 'Score on' treebank: which single head points from each "
             "word to its head (per relation, against the best fixed offset), and each head's attention tree's UUAS "
             "beside the structural probe's."):
    prefill("pages/9_Attention_heads.py", {"heads_corpus": "A treebank (CoNLL-U): heads as parsers too",
                                           "heads_treebank": test})
tasks = st.multiselect("Tasks", TASKS, default=list(TASKS), key="structure_tasks")  # a row of its own: every chip
c2, c3, c4, c5, c6, c7 = st.columns([1.2, 1.2, 1, 1, 0.8, 0.7])  # shows (squeezed beside the others, two hid)
word_vector = c2.radio("Word vector", ["first", "mean"], horizontal=True, key="structure_vector",
                       help="a word's vector: its first subword's, or the mean of its subwords'")
probe = c3.radio("Label probe", ["linear", "mlp"], horizontal=True, key="structure_probe",
                 help="multinomial logistic regression, or one hidden layer of 256 units")
layers = c4.text_input("Layers", "all", key="structure_layers", help="all, a slice (-6:) or a list 0,4,8")
limit = c5.number_input("Max sentences", 0, 100_000, 0, key="structure_max", help="0: every sentence of each file")
seeds = c6.number_input("Seeds", 1, 20, 1, key="structure_seeds", help="train the probes whose training depends "
                        "on the seed (structural, MLP, the labelled set's folds) with this many seeds: the summary's "
                        "intervals then cover the spread over seeds too (every other number is the first seed's); "
                        "multiplies their time")
with_mdl = c7.checkbox("MDL", True, key="structure_mdl", help="the online codelength of the label tasks (Voita & "
                       "Titov): 10 more fits per task and layer")
with_random = (not loaded.spec.random_init) and st.checkbox(
    "Also probe the same architecture with random weights (grey crosses: what the probe reads without a trained "
    "encoder)",
    False, key="structure_random", help="compared_model('random'): the sidebar model's config and tokenizer with "
    "seeded random weights (seed 0), probed with the same options; doubles the time")
labelled, label_pooling = None, "cls"
with st.expander("The task label beside syntax (optional): a labelled set's label as one more task, 'label'"):
    if st.checkbox("Add a labelled set", key="structure_with_label", help="its texts pooled per layer and probed as "
                   "the Layer atlas probes them (5-fold out-of-fold linear probe); the summary then says where the "
                   "task label peaks beside POS and syntax"):
        labelled = labelled_inputs("structure_label", max_rows())
        label_pooling = st.radio("Sentence vector", ["cls", "mean"], horizontal=True, key="structure_label_pool",
                                 format_func={"cls": "[CLS]", "mean": "mean"}.get)
        if labelled is None:
            st.stop()
try:
    options = StructureOptions(tasks=",".join(tasks) or "none", word_vector=word_vector, probe=probe, layers=layers,
                               max_sentences=int(limit) or None, mdl=with_mdl, seeds=int(seeds))
    parse_layers(layers, loaded.num_layers + 1)
except InputError as exc:
    st.error(str(exc))
    st.stop()


def label_job_config() -> dict:
    """The job's fields for the page's labelled set: its rows (a sample as drawn) saved whole under the uploads
    folder as JSON lines (text, label, pair), which the job reads with the same columns."""
    rows = zip(labelled.texts, labelled.labels, labelled.pairs or [None] * len(labelled), strict=True)
    data = "".join(json.dumps({"text": t, "label": y, **({"pair": p} if p is not None else {})}, ensure_ascii=False)
                   + "\n" for t, y, p in rows)
    saved = save_upload(data.encode("utf-8"), "labelled.jsonl")
    return {"label_data": str(saved), "text_column": "text", "label_column": "label",
            "pair_column": "pair" if labelled.pairs else None, "label_pooling": label_pooling}


def treebanks():
    """The page's inputs as the task reads them: the two treebanks (read when a run is not stored yet) and the
    labelled set."""
    return read_conllu(train, options.max_sentences), read_conllu(test, options.max_sentences), labelled


def probed(spec, key: str, label: str) -> StructureRun:
    """The structure task's run of ``spec`` (its :class:`StructureRun`), shared across sessions under ``key``."""
    task_options = page_options(STRUCTURE, spec, labelled, "label_data", train=str(train), test=str(test),
                                **options.to_dict(), label_pooling=label_pooling)
    return task_result(STRUCTURE, spec, treebanks, task_options, label, key)


with st.expander("Run it as a background job (bert-base on a GPU or on Slurm; progress, Cancel and log on the "
                 "Fine-tuning jobs page)"):
    if labelled is not None:
        st.caption(f"The labelled set above goes with the job: its {len(labelled):,} texts and labels"
                   f"{' and second texts' if labelled.pairs else ''} are saved as a JSON-lines file under the uploads "
                   "folder, which the job reads.")
    structure_job_form(loaded.spec, train, test, options, None if labelled is None else label_job_config)

asked = (str(train), str(test), options.to_dict(),
         None if labelled is None else (labelled.content_hash(), list(labelled.ids), label_pooling))
request = (*asked, with_random)  # ticking the random-weights twin waits for the button too
wait_for_run("structure_request", st.button("Probe the layers", type="primary", key="structure_run"), request,
             "Choose the treebanks and tasks, then probe. Word vectors are cached on disk per model and file.")
content = [file_digest(p) for p in (train, test)]  # the treebanks' content, never their paths (issue 53 item 1)
key = result_key(loaded.spec.resolved().to_dict(), asked, content)
stop = stop_button("Linguistic structure", "structure_request")
reference = None
try:
    run = probed(loaded.spec, key, "Probing")
    if with_random:
        name, _, label = compared_model("random", loaded.spec.name)
        twin_spec = dataclasses.replace(loaded.spec, name=name, revision=None, head_from=None)
        twin_key = result_key(twin_spec.resolved().to_dict(), asked, content)
        reference = probed(twin_spec, twin_key, "Probing the random-weights twin").result.probes
except (InputError, ModelLoadError) as exc:
    stop.empty()
    st.error(str(exc))
    st.stop()
stop.empty()

show(run, f"Model **{md_plain(loaded.spec.name)}** · {mode(str(loaded.model.dtype).removeprefix('torch.'))}",
     reference=reference)
