"""LayerLens home: what each analysis does, with a link to it. No computation here."""

import streamlit as st

from ui.sidebar import ANALYSES, sidebar

st.set_page_config(page_title="LayerLens", page_icon="🔬", layout="wide")
loaded = sidebar()

st.title("LayerLens")
st.markdown(
    "Look inside BERT-family masked language models (BERT, ALBERT, RoBERTa, DistilBERT, ELECTRA) **layer by "
    "layer**. Pick a model in the sidebar: the bundled **demo** model works offline; any Hugging Face hub id "
    "or local directory works too. Models are loaded once and shared by every session."
)
st.subheader("Analyses")
for page in ANALYSES:
    with st.container(border=True):
        if page.exists:
            st.page_link(page.file, label=f"**{page.title}**", icon=page.icon)
        else:
            st.markdown(f"{page.icon} **{page.title}** · :gray[coming in a later release]")
        st.markdown(f"{page.line}  \n:gray[{page.source}]")

if loaded is not None:
    st.caption(f"Selected: {loaded.spec.name} ({loaded.anatomy.family}, {loaded.num_layers} layers).")
