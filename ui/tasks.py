"""A task's page form, derived from its options schema (:mod:`analysis.core.task`): one widget per option
(:func:`ui.options.option_input`: label, bounds, choices and help from the schema), returned as the schema's
validated options."""

from __future__ import annotations

import streamlit as st

from analysis.core.inputs import InputError
from ui.options import option_input


def task_form(prefix: str, schema, names: list[str] | None = None, columns: int = 3):
    """The options of ``schema`` (its fields ``names``, default all) from a form of widgets, or None (with the
    schema's one-line message) when they are not valid."""
    names = names or list(schema.model_fields)
    slots = st.columns(columns)
    values = {name: option_input(slots[i % columns], name, prefix, options_schema=schema)
              for i, name in enumerate(names)}
    try:
        return schema(**values)
    except InputError as exc:
        st.error(str(exc))
        return None
