"""Text input widgets shared by the analysis pages: type texts, or upload a file and pick its columns."""

from __future__ import annotations

import streamlit as st

from analysis.inputs import FORMATS, InputError, TextInputs, columns_of, from_text_area, parse

DEFAULT_ROW_LIMIT = 2000


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
                column = left.selectbox("Text column", columns, index=columns.index("text") if "text" in columns
                                        else 0, key=f"{key}_column")
                if pairs:
                    choice = right.selectbox("Second text of a pair (optional)", ["(none)", *columns],
                                             key=f"{key}_pair", help="e.g. the aspect (ABSA) or the hypothesis (NLI)")
                    pair_column = None if choice == "(none)" else choice
            inputs = parse(data, upload.name, column, pair_column, limit=row_limit)
    except InputError as exc:
        st.error(str(exc))
        return None
    for note in inputs.notes():
        st.warning(note)
    return inputs
