"""The Token atlas's geometry figure (issue 29 item 4): the curves of :func:`analysis.tokens.geometry.geometry`'s
per-layer table with their 95% bands, and one line saying what each measure is."""

from __future__ import annotations

import pandas as pd

GEOMETRY_LINES = {
    "anisotropy": "**Anisotropy**: the expected cosine between two different tokens of the corpus, exactly over all "
                  "pairs (0: directions spread evenly; Ethayarajh 2019).",
    "self_similarity": "**Self-similarity**: the mean cosine between the occurrences of one word type, averaged "
                       "over word types; *adjusted* subtracts the anisotropy (the baseline any two tokens reach).",
    "intra_similarity": "**Intra-sentence similarity**: the mean cosine between a text's tokens and the text's mean "
                        "vector; *adjusted* subtracts the anisotropy.",
    "effective_rank": "**Effective rank**: exp of the entropy of the covariance's normalised eigenvalues (how many "
                      "directions the variance really uses, at most the hidden size; Roy & Vetterli 2007). A "
                      "sample's rank comes out below the population's (its eigenvalues spread out): the band is "
                      "centred on the jackknife's bias-corrected value, so it can reach above the line.",
    "variance": "**Top variance**: the share of variance on the first and the first ten principal components.",
    "rogue": "**Rogue dimensions**: each dimension's part of the anisotropy (the parts add up to it); a few large "
             "ones mean the cosine is decided by those dimensions (Timkey & van Schijndel 2021).",
}


def bands_caption(table_: pd.DataFrame, blocks: int = 20) -> str:
    """What the geometry figure's bands are (the page's caption), with the sampled types and texts of ``table_``."""
    return (f"Bands: 95% intervals over {blocks} contiguous blocks of texts: anisotropy and rogue dimensions by a "
            "bootstrap of the blocks; top variance and effective rank by a delete-a-block jackknife (a bootstrap "
            "repeats rows, which changes a covariance's spectrum), bias-corrected and widened to contain the "
            "estimate; similarities by a bootstrap of the sampled word types and texts "
            f"({int(table_['word_types'].iat[0]):,} types, {int(table_['texts_sampled'].iat[0]):,} texts). "
            "Dashed: adjusted (minus the anisotropy).")


def geometry_figure(table_: pd.DataFrame):
    """Six panels over hidden states: each measure of ``table_`` (geometry.csv) with its band where it has one."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = [("anisotropy", ["anisotropy"]), ("self-similarity", ["self_similarity", "self_similarity_adjusted"]),
              ("intra-sentence similarity", ["intra_similarity", "intra_similarity_adjusted"]),
              ("effective rank", ["effective_rank"]), ("top variance", ["top1_variance", "top10_variance"]),
              ("rogue dimensions: top-3 share", ["rogue_top3_share"])]
    fig = make_subplots(rows=2, cols=3, subplot_titles=[p[0] for p in panels], horizontal_spacing=0.07,
                        vertical_spacing=0.14)
    colours = {"self_similarity": "#2ca02c", "intra_similarity": "#9467bd", "top1_variance": "#1f77b4",
               "top10_variance": "#ff7f0e"}
    names = {"self_similarity": "self-similarity", "self_similarity_adjusted": "self-similarity, adjusted",
             "intra_similarity": "intra-sentence", "intra_similarity_adjusted": "intra-sentence, adjusted",
             "top1_variance": "top-1 component", "top10_variance": "top-10 components"}
    x = table_["layer"]
    for i, (_title, cols) in enumerate(panels):
        r, c = i // 3 + 1, i % 3 + 1
        for col in cols:
            colour = colours.get(col.removesuffix("_adjusted"), "#1f77b4")
            if f"{col}_low" in table_:
                fig.add_trace(go.Scatter(x=list(x) + list(x)[::-1],
                                         y=list(table_[f"{col}_high"]) + list(table_[f"{col}_low"])[::-1],
                                         fill="toself", fillcolor=colour, opacity=0.18, line={"width": 0},
                                         hoverinfo="skip", showlegend=False), r, c)
            fig.add_trace(go.Scatter(x=x, y=table_[col], mode="lines+markers", name=names.get(col, col),
                                     line={"color": colour, "dash": "dash" if col.endswith("adjusted") else "solid"},
                                     showlegend=len(cols) > 1), r, c)
        fig.update_xaxes(title="hidden state" if r == 2 else None, dtick=1, row=r, col=c)
    fig.update_layout(height=660, margin={"t": 60, "l": 40, "r": 20, "b": 40},
                      legend={"orientation": "h", "y": -0.12})
    return fig


def neighbour_labels(counts: pd.DataFrame, column: str):
    """How many of a token's neighbours carry each UD label (``column``: upos or deprel) per hidden state
    (``counts``: layer, the label, count)."""
    import plotly.express as px

    fig = px.bar(counts, x="layer", y="count", color=column, title=f"{column.upper()} of the neighbours per layer")
    fig.update_xaxes(type="category", title="hidden state")
    return fig
