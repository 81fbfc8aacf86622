"""Model anatomy: the parts LayerLens reads from the selected model."""

import pandas as pd
import streamlit as st

from models.loading import split_pooling
from ui.results import md_plain
from ui.sidebar import human_bytes, start_page

loaded = start_page("Model anatomy", (
    "Hidden state 0 is the embedding output; hidden state *i* is the output of encoder layer *i*: the "
    "numbering of Hugging Face's `output_hidden_states`, used on every page. The MLM head is the model's own "
    "pre-trained output layer, which the reconstruction probe applies to every hidden state."))

s = loaded.summary()
cols = st.columns(5)
cols[0].metric("Family", s["family"])
cols[1].metric("Encoder layers", s["layers"])
cols[2].metric("Hidden size", s["hidden_size"])
cols[3].metric("Vocabulary", f"{s['vocab_size']:,}")
cols[4].metric("Parameters", f"{s['parameters']:,}", help=f"{human_bytes(s['bytes'])} on {s['device']} "
               f"in {s['dtype']}; weights shared between modules are counted once")
table = pd.DataFrame(loaded.anatomy.rows())
shared = table["same module as"].notna().any()
if not shared:
    table = table.drop(columns="same module as")
st.dataframe(table, hide_index=True, width="stretch", placeholder="—",
             column_config={"parameters": st.column_config.NumberColumn(format="localized")})
if shared:
    st.caption("ALBERT shares one set of layer weights across depth: every layer applies the same module.")
head = loaded.anatomy.head
if loaded.mlm_head is None:
    st.markdown("**MLM head**: none of its own (the checkpoint was saved without one). To probe its layers, name a "
                "masked LM of the same family in the sidebar's *Read layers with the MLM head of*.")
else:
    source = "its own" if loaded.mlm_head == "own" else f"borrowed {loaded.mlm_head}"
    st.markdown(f"**MLM head** ({source}): `{type(head).__name__}`, {loaded.anatomy.head_parameters():,} parameters "
                "(with the output matrix, which most checkpoints tie to the word embeddings).")
if s["pooler"]:
    st.markdown(f"**Pooler**: {s['pooler']:,} parameters, the checkpoint's own (fine-tuning's *pooler* head "
                "starts from it; the analyses read the hidden states).")
if loaded.task:
    labels = f" with classes {', '.join(map(md_plain, loaded.labels))}" if loaded.labels else ""
    st.markdown(f"**Task head**: {loaded.task}{labels} (the checkpoint's own; LayerLens reads the encoder, and "
                "fine-tuning replaces this head by the one you choose).")
if loaded.pooling:
    mode, normalize = split_pooling(loaded.pooling)
    st.markdown(f"**Sentence pooling**: {mode} (sentence-transformers' `1_Pooling`)"
                + (", then L2-normalised (its `Normalize` module)" if normalize else "")
                + "; the atlas's *model* vector applies it.")
st.caption(f"Class {s['class']} (as saved; parameters counted as that class holds them); loaded in "
           f"{s['load_seconds']} s.")
