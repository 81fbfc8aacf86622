"""Form widgets derived from an options schema (:mod:`analysis.core.options`; the fine-tuning one by default):
label, bounds, choices, help and the value a preset gives come from there, so the form shows what a job will run
with."""

from __future__ import annotations

import streamlit as st

from analysis.core import options as schema
from analysis.training.options import FinetuneOptions, defaults_for


def widget_key(prefix: str, name: str) -> str:
    return f"{prefix}_{name}"


def reset_form(prefix: str, names: list[str], model: str, preset: str | None) -> None:
    """Put each field's resolved value (schema default <- model default <- preset) into the form."""
    values = defaults_for(model, preset)
    for name in names:
        st.session_state[widget_key(prefix, name)] = values[name]


def option_input(container, name: str, prefix: str, choices: list | None = None, options_schema=None):
    """The widget for option ``name`` of ``options_schema`` (default the fine-tuning options); its value lives
    in ``st.session_state`` (set by :func:`reset_form`, else the field's default)."""
    options_schema = options_schema or FinetuneOptions
    info, key = schema.field_info(name, options_schema), widget_key(prefix, name)
    st.session_state.setdefault(key, info.default)
    label = info.title[0].upper() + info.title[1:]
    help_text = f"{schema.help_text(name, options_schema)}; accepts {schema.accepts(name, options_schema)}"
    kind = schema.kind(name, options_schema)
    if kind == "bool":
        return container.checkbox(label, key=key, help=help_text)
    if kind == "choice" or choices is not None:
        allowed = list(choices if choices is not None else schema.choices(name, options_schema))
        if st.session_state.get(key) not in allowed:  # a preset's head this model cannot take: shown, refused at submit
            allowed.append(st.session_state.get(key))
        return container.selectbox(label, allowed, key=key, help=help_text)
    if kind == "str":  # optional text (a Slurm partition): empty means none
        if st.session_state.get(key) is None:
            st.session_state[key] = ""
        return container.text_input(label, key=key, help=help_text).strip() or None
    low, high = schema.browser_bounds(name, options_schema)  # a form submits from the browser
    extra = info.json_schema_extra or {}
    if kind == "int":  # an optional number (max steps) left empty is None
        value = container.number_input(label, min_value=low, max_value=high, step=1, key=key, help=help_text)
        return None if value is None else int(value)
    low, high = (None if b is None else float(b) for b in (low, high))
    value = container.number_input(label, min_value=low, max_value=high, step=float(extra.get("step", 0.01)),
                                   format=extra.get("format", "%.4g"), key=key, help=help_text)
    return None if value is None else float(value)
