"""Links between pages: another page opened with some of its widgets filled in (``prefill``), and the "Layer by
layer" link from a page's comparison field to Compare checkpoints."""

from __future__ import annotations

import streamlit as st


def prefill(page: str, values: dict) -> None:
    """Open ``page`` with some of its widgets filled in (``values``: widget key -> value). Called in the script
    body after a button returned True, never from a button's callback: a callback can fire again on a later
    rerun (a page switch carries the click along), and would then undo the user's first change on the form."""
    for key, value in values.items():
        st.session_state[key] = value
    st.switch_page(page)


COMPARE_PAGE = "pages/7_Compare_checkpoints.py"


def compare_link(container, page_key: str, other: str, carry: dict | None = None) -> None:
    """Under a page's "Compare with" field: a button opening the Compare checkpoints page with the sidebar's model
    as A and ``other`` as B (``carry``: further fields of that page to fill in, e.g. the same data source)."""
    if container.button("Layer by layer ↗", key=f"{page_key}_to_compare", disabled=not other,
                        help="Open the Compare checkpoints page with this model as B: CKA per layer, reconstruction "
                        "and probe accuracy with paired tests, the examples that moved most, one shared map per "
                        "layer."):
        prefill(COMPARE_PAGE, {"compare_what": "pair", "compare_model": other, **(carry or {})})
