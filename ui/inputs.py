"""Text input widgets shared by the analysis pages: type texts, or upload a file and pick its columns."""

from __future__ import annotations

import streamlit as st

from analysis.csvout import safe
from analysis.dataroots import data_roots, hub_dataset_name, server_file_picker_label, server_files
from analysis.inputs import (
    DEMO_LABELLED,
    DEMO_WORDORDER,
    FORMATS,
    LABEL_HINTS,
    PROBE_ROW_LIMIT,
    InputError,
    TextInputs,
    columns_of,
    from_hub_dataset,
    from_text_area,
    guess_text_column,
    parse,
)

DEFAULT_ROW_LIMIT = PROBE_ROW_LIMIT
EXAMPLES = """the film is a charming and often affecting journey .
the acting , costumes , music and sound are all astounding .
it 's a bad movie that tries hard to be good .
my fellow citizens , the state of the union is strong ."""  # prefilled on the probe and duplication pages


def text_inputs(key: str, example: str, row_limit: int = DEFAULT_ROW_LIMIT, pairs: bool = True) -> TextInputs | None:
    """Texts from a text area or an uploaded file; None (with a message shown) when they cannot be used."""
    source = st.radio("Texts", ["Type or paste", "Upload a file"], horizontal=True, key=f"{key}_source",
                      label_visibility="collapsed")
    try:
        if source == "Type or paste":
            text = st.text_area("One text per line", example, height=150, key=f"{key}_text")
            inputs = from_text_area(text, limit=row_limit)
        else:
            upload = st.file_uploader(f"A .{', .'.join(FORMATS)} file (TSV is read with quoting off)",
                                      type=list(FORMATS), key=f"{key}_file")
            if upload is None:
                st.info("Choose a file: one text per line (.txt), or a table with a text column.")
                return None
            data = upload.getvalue()
            columns = columns_of(data, upload.name)
            column, pair_column = "text", None
            if columns:
                left, right = st.columns(2)
                guess = columns.index(guess_text_column(data, upload.name))
                column = left.selectbox("Text column", columns, index=guess, key=f"{key}_column",
                                        help="guessed from the column names, else the column with the most letters")
                if pairs:
                    choice = right.selectbox("Second text of a pair (optional)", ["(none)", *columns],
                                             key=f"{key}_pair", help="e.g. the aspect (ABSA) or the hypothesis (NLI)")
                    pair_column = None if choice == "(none)" else choice
            inputs = parse(data, upload.name, column, pair_column, limit=row_limit)
            preview(inputs, f"column '{column}'" if columns else "one text per line")
    except InputError as exc:
        st.error(str(exc))
        return None
    for note in inputs.notes():
        st.warning(note)
    return inputs


SOURCES = ["Demo sentiment set", "Demo word-order set", "Upload a file", "Hugging Face dataset"]


def preview(inputs: TextInputs, what: str, rows: int = 3) -> None:
    """Say which column is used and show its first rows, so a wrong pick is seen before anything runs."""
    import pandas as pd

    frame = {"row": list(inputs.ids[:rows]), "text": list(inputs.texts[:rows])}
    if inputs.pairs:
        frame["second text"] = list(inputs.pairs[:rows])
    if inputs.labels:
        frame["label"] = list(inputs.labels[:rows])
    st.caption(f"Using {what}: {len(inputs):,} rows; the first {min(rows, len(inputs))}:")
    st.dataframe(safe(pd.DataFrame(frame)), hide_index=True, width="stretch")  # toolbar download: no formulas


def _pick(container, label: str, columns: list[str], preferred: tuple[str, ...], key: str, optional: bool = False):
    options = (["(none)"] if optional else []) + columns
    default = next((options.index(c) for c in preferred if c in options), 0)
    choice = container.selectbox(label, options, index=default, key=key)
    return None if choice == "(none)" else choice


def labelled_inputs(key: str, row_limit: int) -> TextInputs | None:
    """Labelled texts (optionally pairs) from the bundled demo set, an upload or a hub dataset; None (with a
    message shown) when they cannot be used. Above ``row_limit`` rows the user must opt in to a random sample."""
    job_id = st.session_state.get(f"{key}_job")  # set by the Layer weights page's comparison button
    job_source = f"Held-out rows of job #{job_id}" if job_id is not None else None
    source = st.radio("Data", [*SOURCES, *([job_source] if job_source else [])], horizontal=True,
                      key=f"{key}_source")
    try:
        if source == job_source:
            inputs = _job_rows(job_id)
        elif source == "Demo sentiment set":
            pair = st.checkbox("Add the aspect term as a second text ([CLS] sentence [SEP] aspect [SEP]); keeps only "
                               "the rows that have one", key=f"{key}_demo_pair")
            inputs = parse(DEMO_LABELLED.read_bytes(), DEMO_LABELLED.name, "text", "aspect" if pair else None,
                           label_column="label")
            st.caption(f"{len(inputs)} short reviews written for LayerLens: positive, negative and neutral, five "
                       "domains, most naming an aspect term. **Lexically easy**: one opinion word decides the label, "
                       "so even the embedding layer separates the classes well and layers differ little; the "
                       "*Demo word-order set* is one where they do.")
        elif source == "Demo word-order set":
            inputs = parse(DEMO_WORDORDER.read_bytes(), DEMO_WORDORDER.name, "text", None, label_column="label")
            st.caption(f"{len(inputs)} sentences of UD English-EWT (CC BY-SA 4.0), in half of which two adjacent "
                       "words were swapped: Conneau et al. (2018)'s *bigram shift*. Every word stays in the "
                       "sentence, so a bag of words says almost nothing (the embedding layer sits near chance, "
                       "0.5) and what a layer knows of word order decides. Compare with `random` to see a "
                       "random-weights model of the same architecture stay at chance.")
        elif source == "Upload a file":
            upload = st.file_uploader("A .csv, .tsv or .jsonl file with a text column and a label column "
                                      "(TSV is read with quoting off)", type=["csv", "tsv", "jsonl"], key=f"{key}_file")
            if upload is None:
                st.info("Choose a file with a text column, a label column and optionally a second text column.")
                return None
            data = upload.getvalue()
            columns = columns_of(data, upload.name)
            c1, c2, c3 = st.columns(3)
            label = _pick(c3, "Label column", columns, LABEL_HINTS, f"{key}_label")
            text = _pick(c1, "Text column", columns, (guess_text_column(data, upload.name, (label,)),), f"{key}_text")
            pair = _pick(c2, "Second text (optional)", columns, (), f"{key}_pair", optional=True)
            inputs = parse(data, upload.name, text, pair, label_column=label)
            preview(inputs, f"texts from column '{text}', labels from '{label}'")
        else:
            c1, c2, c3 = st.columns(3)
            name = c1.text_input("Dataset", "glue", key=f"{key}_hf_name")
            config = c2.text_input("Configuration (optional)", "sst2", key=f"{key}_hf_config")
            split = c3.text_input("Split", "validation", key=f"{key}_hf_split")
            c1, c2, c3 = st.columns(3)
            text = c1.text_input("Text column", "sentence", key=f"{key}_hf_text")
            pair = c2.text_input("Second text column (optional)", "", key=f"{key}_hf_pair")
            label = c3.text_input("Label column", "label", key=f"{key}_hf_label")
            if not st.toggle("Load it", key=f"{key}_hf_load", help="Needs a network connection, or the dataset "
                             "in the local Hugging Face cache."):
                return None
            inputs = _hub_rows(hub_dataset_name(name), config.strip() or None, split.strip(), text,
                               pair.strip() or None, label)
    except InputError as exc:
        st.error(str(exc))
        return None
    for note in inputs.notes():
        st.warning(note)
    if len(inputs) > row_limit:
        st.warning(f"{len(inputs):,} rows are more than this page's limit of {row_limit:,}.")
        if not st.checkbox(f"Use a random sample of {row_limit:,} rows (seed 0)", key=f"{key}_sample"):
            return None
        inputs = inputs.sample(row_limit, seed=0)
    return inputs


def _job_rows(job_id: int) -> TextInputs:
    """The rows job ``job_id`` was evaluated on and never trained on, with a caption saying which."""
    from analysis.finetune import held_out_rows
    from analysis.options import resolve
    from ui.results import find_job

    job = find_job(job_id)
    rows, description = held_out_rows(resolve(job.config), job.artifacts)
    st.caption(f"Rows: {description}: a fine-tuned model compared on rows it never trained on.")
    return rows


@st.cache_data(show_spinner="Loading the dataset…", max_entries=8)
def _hub_rows(name, config, split, text, pair, label) -> TextInputs:
    return from_hub_dataset(name, config, split, text, pair, label)


def server_file(key: str, container=None) -> str | None:
    """A data file on the server, picked from those under the data roots (:mod:`analysis.dataroots`), never typed
    as a path; None when there is none (said)."""
    files = server_files()
    box = container or st
    if not files:
        box.info("No data files on the server: upload one, or ask whoever runs the dashboard to put files under "
                 f"{', '.join(map(str, data_roots()))} (LAYERLENS_DATA_DIRS).")
        return None
    chosen = box.selectbox("File on the server", files, format_func=server_file_picker_label, key=key,
                           help="the .csv/.tsv/.jsonl/.txt files under the dashboard's data folders "
                                "(LAYERLENS_DATA_DIRS; by default the bundled data and the uploads)")
    return str(chosen)
