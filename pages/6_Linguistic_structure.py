"""Linguistic structure per layer (issue 27): UPOS and relation probes with control tasks, structural probes."""

import json
from pathlib import Path

import streamlit as st

from analysis.csvout import to_csv
from analysis.dataroots import data_roots, save_upload, server_file_picker_label, within_roots
from analysis.inputs import InputError
from analysis.precision import mode
from analysis.projection import parse_layers
from analysis.structure.options import TASKS, StructureOptions
from analysis.structure.plots import sentence_trees, task_curves, upos_across_layers
from analysis.structure.run import run_structure
from analysis.structure.treebank import read_conllu
from ui.results import chart, result_key, shared_result, stop_button, wait_for_run
from ui.sidebar import start_page

loaded = start_page("Linguistic structure", (
    "What each layer knows about syntax, on Universal Dependencies treebanks (CoNLL-U): **UPOS** per word and the "
    "**dependency relation** per arc (an edge probe, Tenney et al. 2019) with **control tasks** and selectivity "
    "(Hewitt & Liang 2019), the **MDL** online codelength (Voita & Titov 2020), and the **structural probes** "
    "(Hewitt & Manning 2019): tree distances (UUAS) and depths (root accuracy). Probes are trained on one file "
    "and scored on another. Layer 0 is the embedding output."))


def treebanks() -> list[Path]:
    """The .conllu / .conllu.gz files under the data roots (resolved inside them)."""
    found = []
    for root in data_roots():
        if root.is_dir():
            for path in sorted(root.rglob("*.conllu*")):
                if path.name.endswith((".conllu", ".conllu.gz")) and path.is_file():
                    try:
                        found.append(within_roots(path))
                    except InputError:
                        continue
    return list(dict.fromkeys(found))


files = treebanks()
with st.expander("Upload a treebank"):
    upload = st.file_uploader("CoNLL-U file", type=["conllu", "gz"], key="structure_upload")
    if upload is not None:
        files = list(dict.fromkeys([save_upload(upload.getvalue(), upload.name), *treebanks()]))
if not files:
    st.info("No CoNLL-U treebanks on the server: upload one, or put .conllu(.gz) files under "
            f"{', '.join(map(str, data_roots()))} (LAYERLENS_DATA_DIRS).")
    st.stop()


def default(name: str) -> int:
    return next((i for i, f in enumerate(files) if f.name.startswith(name)), 0)


c1, c2 = st.columns(2)
train = c1.selectbox("Train on", files, index=default("en_ewt-ud-dev"), key="structure_train",
                     format_func=server_file_picker_label)
test = c2.selectbox("Score on", files, index=default("en_ewt-ud-test"), key="structure_test",
                    format_func=server_file_picker_label)
c1, c2, c3, c4, c5 = st.columns([2.2, 1.2, 1.2, 1, 1])
tasks = c1.multiselect("Tasks", TASKS, default=list(TASKS), key="structure_tasks")
word_vector = c2.radio("Word vector", ["first", "mean"], horizontal=True, key="structure_vector",
                       help="a word's vector: its first subword's, or the mean of its subwords'")
probe = c3.radio("Label probe", ["linear", "mlp"], horizontal=True, key="structure_probe",
                 help="multinomial logistic regression, or one hidden layer of 256 units")
layers = c4.text_input("Layers", "all", key="structure_layers", help="all, a slice (-6:) or a list 0,4,8")
limit = c5.number_input("Max sentences", 0, 100_000, 0, key="structure_max", help="0: every sentence of each file")
try:
    options = StructureOptions(tasks=",".join(tasks) or "none", word_vector=word_vector, probe=probe, layers=layers,
                               max_sentences=int(limit) or None)
    parse_layers(layers, loaded.num_layers + 1)
except InputError as exc:
    st.error(str(exc))
    st.stop()


def compute(report):
    train_bank = read_conllu(train, options.max_sentences)
    test_bank = read_conllu(test, options.max_sentences)
    return run_structure(loaded, train_bank, test_bank, options,
                         progress=lambda stage, done, n: report(done / max(n, 1), f"{stage} {done}/{n}"))


request = (str(train), str(test), options.to_dict())
wait_for_run("structure_request", st.button("Probe the layers", type="primary", key="structure_run"), request,
             "Choose the treebanks and tasks, then probe. Word vectors are cached on disk per model and file.")
stat = [(Path(p).stat().st_mtime_ns, Path(p).stat().st_size) for p in (train, test)]
key = result_key(loaded.spec.resolved().to_dict(), request, stat)
stop = stop_button("Linguistic structure", "structure_request")
try:
    result = shared_result(key, "Probing", compute)
except InputError as exc:
    stop.empty()
    st.error(str(exc))
    st.stop()
stop.empty()

info = result.info
dropped = info["test"]["dropped_too_long"] + info["train"]["dropped_too_long"]
st.caption(f"Word vector: **{info['word_vector_text']}** · {info['test_sentences_scored']:,} test sentences scored"
           f" · {dropped} sentence(s) longer than the model's {info['max_tokens']} tokens dropped (not cut) · "
           f"{mode(str(loaded.model.dtype).removeprefix('torch.'))}")
chart(task_curves(result.probes), "structure_curves")
st.subheader("Where each task lives")
st.dataframe(result.summary, hide_index=True, key="structure_summary")
st.caption("Best layer and the center of gravity (Tenney et al.'s expected layer under cumulative gains), with "
           "95% bootstrap intervals over test sentences.")

if result.trees and any(r["layers"] for r in result.trees):
    st.subheader("One sentence")
    ids = list(range(len(result.trees)))
    pick = st.selectbox("Sentence", ids, key="structure_sentence",
                        format_func=lambda i: " ".join(result.trees[i]["words"])[:120])
    record = result.trees[pick]
    shown = sorted(record["layers"], key=int)
    if shown:
        layer = st.select_slider("Layer", shown, value=shown[-1], key="structure_layer")
        chart(sentence_trees(record, layer), "structure_tree")
    if any("predicted_upos" in v for v in record["layers"].values()):
        st.dataframe(upos_across_layers(record), hide_index=True, key="structure_upos")

with st.expander("Tables and downloads"):
    st.dataframe(result.probes, hide_index=True)
    d1, d2, d3, d4, d5 = st.columns(5)
    d1.download_button("probes.csv", to_csv(result.probes), "probes.csv", "text/csv", key="dl_structure_probes")
    d2.download_button("mdl.csv", to_csv(result.mdl), "mdl.csv", "text/csv", key="dl_structure_mdl")
    d3.download_button("summary.csv", to_csv(result.summary), "summary.csv", "text/csv", key="dl_structure_summary")
    d4.download_button("trees.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in result.trees),
                       "trees.jsonl", "application/jsonl", key="dl_structure_trees")
    d5.download_button("run.json", json.dumps(info, indent=2, default=str), "run.json", "application/json",
                       key="dl_structure_run")
