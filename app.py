"""LayerLens home: what each analysis does, with a link to it. No computation here."""

from pathlib import Path

import streamlit as st

from ui.sidebar import sidebar

st.set_page_config(page_title="LayerLens", page_icon="🔬", layout="wide")

ROOT = Path(__file__).resolve().parent
# (title, page file, one line, source)
ANALYSES = [
    ("Model anatomy", "pages/1_Model_anatomy.py",
     "Embeddings, encoder layers and MLM head of the selected model, with their sizes.", "Hugging Face layout"),
    ("Reconstruction probing", "pages/2_Reconstruction.py",
     "Feed every layer's hidden states through the model's own MLM head: how well does each layer "
     "reconstruct the input?", "Kao et al. 2020, §2"),
    ("Layer atlas", "pages/3_Layer_atlas.py",
     "Per-layer [CLS] projections (PCA, UMAP, t-SNE) coloured by class, and how separable each layer is.",
     "Song et al. 2020, Fig. 2; Sun et al. 2019"),
    ("Layer pooling & fine-tuning", "pages/4_Fine_tuning.py",
     "LSTM/attention pooling over layers, GRUBERT, layer selection and layer-wise learning-rate decay, "
     "as background jobs.", "Song et al. 2020; GRUBERT; Sun et al. 2019"),
    ("Layer duplication", "pages/5_Layer_duplication.py",
     "Make a model deeper by duplicating layers without training; preview, export, fine-tune.",
     "Kao et al. 2020, §3"),
]

loaded = sidebar()

st.title("🔬 LayerLens")
st.markdown(
    "Look inside BERT-family masked language models (BERT, ALBERT, RoBERTa, DistilBERT, ELECTRA) **layer by "
    "layer**. Pick a model in the sidebar: the bundled **demo** model works offline; any Hugging Face hub id "
    "or local directory works too. Models are loaded once and shared by every session."
)
st.subheader("Analyses")
for title, page, line, source in ANALYSES:
    with st.container(border=True):
        if (ROOT / page).is_file():
            st.page_link(page, label=f"**{title}**", icon="➡️")
        else:
            st.markdown(f"**{title}** · _coming in a later release_")
        st.markdown(f"{line}  \n:gray[{source}]")

if loaded is not None:
    st.caption(f"Selected: {loaded.spec.name} ({loaded.anatomy.family}, {loaded.num_layers} layers).")
