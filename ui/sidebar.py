"""The sidebar every page shares: model picker, device and dtype, and the shared model cache panel."""

from __future__ import annotations

import streamlit as st
import torch

from models.cache import ModelCache, shared_cache
from models.loading import DEMO_NAME, SUGGESTED_MODELS, LoadedModel, ModelLoadError, ModelSpec

KEY_MODEL, KEY_REVISION, KEY_DEVICE, KEY_DTYPE = "ll_model", "ll_revision", "ll_device", "ll_dtype"


@st.cache_resource
def model_cache() -> ModelCache:
    """The one process-wide cache, shared by every browser session."""
    return shared_cache()


def available_devices() -> list[str]:
    devices = ["auto", "cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    if torch.backends.mps.is_available():
        devices.append("mps")
    return devices


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def model_picker() -> ModelSpec | None:
    """Widgets for the model spec; their values persist across pages."""
    st.sidebar.header("Model")
    name = st.sidebar.selectbox(
        "Masked language model", SUGGESTED_MODELS, key=KEY_MODEL, accept_new_options=True, persist_state="session",
        format_func=lambda n: "demo (bundled, offline)" if n == DEMO_NAME else n,
        help="Pick a suggestion, or type any Hugging Face hub id or local save_pretrained directory and press Enter."
             " Hub models need a network connection the first time.",
    )
    with st.sidebar.expander("Revision, device, precision"):
        revision = st.text_input("Revision", key=KEY_REVISION, persist_state="session",
                                 placeholder="main", help="Hub branch, tag or commit; empty for the default.")
        device = st.selectbox("Device", available_devices(), key=KEY_DEVICE, persist_state="session",
                              help="auto: CUDA GPU, then Apple MPS, then CPU")
        dtype = st.selectbox("Precision", ["auto", "float32", "bfloat16", "float16"], key=KEY_DTYPE,
                             persist_state="session", help="auto: bfloat16 on a GPU that supports it, else float32")
    try:
        return ModelSpec(name or "", revision=revision.strip() or None, device=device, dtype=dtype)
    except ModelLoadError as exc:
        st.sidebar.error(str(exc))
        return None


def cache_panel(cache: ModelCache) -> None:
    entries = cache.entries()
    with st.sidebar.expander(f"Model cache ({len(entries)} loaded)", expanded=False):
        if not entries:
            st.caption("No model loaded yet.")
        for e in reversed(entries):  # most recently used first
            st.markdown(f"**{e.name}** · {e.family}, {e.layers} layers  \n"
                        f"{e.device}, {e.dtype}, {human_bytes(e.nbytes)}")
        for device, budget in cache.budgets().items():
            st.caption(f"{device}: {human_bytes(cache.used(device))} of a {human_bytes(budget)} budget in use")
        if entries and st.button("Empty the cache", help="Frees the memory; every session reloads on next use."):
            cache.clear()
            st.rerun()


def sidebar() -> LoadedModel | None:
    """Render the shared sidebar and return the selected model, loaded through the shared cache (or None)."""
    spec = model_picker()
    cache = model_cache()
    loaded = None
    if spec is not None:
        try:
            if spec in cache:
                loaded = cache.get(spec)
            else:
                with st.spinner(f"Loading {spec.name}…"):
                    loaded = cache.get(spec)
        except ModelLoadError as exc:
            st.sidebar.error(str(exc))
        except Exception as exc:  # never a traceback in the UI
            st.sidebar.error(f"could not load '{spec.name}': {type(exc).__name__}: {exc}")
    if loaded is not None:
        s = loaded.summary()
        st.sidebar.success(f"{s['family']} · {s['layers']} layers · hidden {s['hidden_size']} · "
                           f"{s['device']} · {s['dtype']}")
    cache_panel(cache)
    return loaded
