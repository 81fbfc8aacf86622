"""Text input widgets shared by the analysis pages: type texts, or upload a file and pick its columns."""

from __future__ import annotations

import streamlit as st

from analysis.core.csvout import safe
from analysis.core.dataroots import (
    MB,
    TEXT_SUFFIXES,
    data_roots,
    delete_upload,
    hub_dataset_name,
    list_uploads,
    megabytes,
    server_file_picker_label,
    server_files,
    uploads_cap,
    uploads_used,
)
from analysis.core.inputs import (
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
    # text cells formula-neutralised: the toolbar's download is safe too
    st.dataframe(safe(pd.DataFrame(frame)), hide_index=True, width="stretch", placeholder="")


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
    # a job's held-out rows come first, the default: rows it trained on inflate what it is scored on (issue 53.9)
    source = st.radio("Data", [*([job_source] if job_source else []), *SOURCES], horizontal=True,
                      key=f"{key}_source")
    try:
        if source == job_source:
            inputs = _job_rows(job_id)
        elif source == "Demo sentiment set":
            pair = st.checkbox("Add the aspect term as a second text ([CLS] sentence [SEP] aspect [SEP]); keeps only "
                               "the rows that have one", key=f"{key}_demo_pair")
            inputs = parse(DEMO_LABELLED, DEMO_LABELLED.name, "text", "aspect" if pair else None,
                           label_column="label")
            st.caption(f"{len(inputs)} short reviews written for LayerLens: positive, negative and neutral, five "
                       "domains, most naming an aspect term. **Lexically easy**: one opinion word decides the label, "
                       "so even the embedding layer's mean vector separates the classes well (its [CLS] vector is "
                       "the same for every text) and layers differ little; the "
                       "*Demo word-order set* is one where they do.")
        elif source == "Demo word-order set":
            inputs = parse(DEMO_WORDORDER, DEMO_WORDORDER.name, "text", None, label_column="label")
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
    from analysis.training.finetune import held_out_rows
    from analysis.training.options import resolve
    from ui.results import find_job

    job = find_job(job_id)
    rows, description = held_out_rows(resolve(job.config), job.artifacts)
    st.caption(f"Rows: {description}: a fine-tuned model compared on rows it never trained on.")
    return rows


@st.cache_data(show_spinner="Loading the dataset…", max_entries=8)
def _hub_rows(name, config, split, text, pair, label) -> TextInputs:
    return from_hub_dataset(name, config, split, text, pair, label)


def server_file(key: str, container=None, suffixes: tuple[str, ...] = TEXT_SUFFIXES) -> str | None:
    """A data file on the server, picked from those under the data roots (:mod:`analysis.core.dataroots`) whose type the
    page reads (``suffixes``: texts by default), never typed as a path; None when there is none (said)."""
    files = server_files(suffixes)
    box = container or st
    kinds = ", ".join(s for s in suffixes if not s.endswith(".gz"))
    if not files:
        box.info(f"No {kinds} files on the server: upload one, or ask whoever runs the dashboard to put files under "
                 f"{', '.join(map(str, data_roots()))} (LAYERLENS_DATA_DIRS).")
        return None
    chosen = box.selectbox("File on the server", files, format_func=server_file_picker_label, key=key,
                           help=f"the {kinds} files (gzipped too) under the dashboard's data folders: the bundled "
                                "data, LAYERLENS_DATA_DIRS and the uploads")
    return str(chosen)


def _job_inputs() -> dict[str, list[int]]:
    """The files queued or running jobs name in their options (an upload they read is not offered for deletion)."""
    from jobs.store import JobStore, StoreError, jobs_home

    if not (jobs_home() / "jobs.db").is_file():
        return {}  # no job yet (and none created here)
    try:
        jobs = [j for j in JobStore().list() if j.status in ("queued", "running")]
    except StoreError:
        return {}
    named: dict[str, list[int]] = {}
    for job in jobs:
        for value in job.config.values():
            if isinstance(value, str):
                named.setdefault(value, []).append(job.id)
    return named


def _delete_uploads(key: str) -> None:
    """The Delete button's callback (before the page runs again, so every list on it is read afresh)."""
    done = []
    for name in st.session_state.get(f"{key}_uploads_pick") or []:
        try:
            delete_upload(name)
            done.append(name)
        except (InputError, OSError) as exc:
            st.session_state[f"{key}_uploads_note"] = ("error", f"{name}: {exc}")
            return
    st.session_state[f"{key}_uploads_pick"] = []
    st.session_state[f"{key}_uploads_note"] = ("success", f"Deleted {', '.join(done)}.")


def uploads_panel(key: str) -> None:
    """The uploads folder where a page saves uploads: its files (name, size, when saved), its use against the cap
    (``LAYERLENS_UPLOADS_MAX_MB``) and a way to delete files; a file a queued or running job reads cannot be
    chosen."""
    import datetime

    import pandas as pd

    try:
        cap = uploads_cap()
    except InputError as exc:
        st.error(str(exc))
        return
    files = list_uploads()
    st.caption(f"**Uploaded files** (the uploads folder, shared by every session): {len(files)} file"
               f"{'' if len(files) == 1 else 's'}, {megabytes(uploads_used())} of its {cap // MB:,} MB "
               "(LAYERLENS_UPLOADS_MAX_MB).")
    note = st.session_state.pop(f"{key}_uploads_note", None)
    if note:
        getattr(st, note[0])(note[1])
    if not files:
        return
    st.dataframe(safe(pd.DataFrame({
        "file": [u.name for u in files], "MB": [round(u.size / MB, 2) for u in files],
        "saved": [datetime.datetime.fromtimestamp(u.modified).strftime("%Y-%m-%d %H:%M") for u in files]})),
        hide_index=True, width="stretch", placeholder="")
    used_by = _job_inputs()
    held = {u.name: used_by.get(str(u.path), []) + used_by.get(str(u.path.resolve()), []) for u in files}
    held = {name: ids for name, ids in held.items() if ids}  # a job names it as saved, or resolved (browser_checked)
    choice = st.multiselect("Delete", [u.name for u in files if u.name not in held], key=f"{key}_uploads_pick",
                            help="the chosen files are deleted from the server for every session")
    if held:
        st.caption("Not offered for deletion (a queued or running job reads it): " + "; ".join(
            f"{name} (job #{', #'.join(map(str, ids))})" for name, ids in held.items()))
    st.button("Delete the chosen uploads", key=f"{key}_uploads_delete", disabled=not choice,
              on_click=_delete_uploads, args=(key,))

