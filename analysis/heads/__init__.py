"""Attention heads (issue 36): what every head attends to over a corpus (Clark et al. 2019 §3), the heads
clustered by behaviour (§6), heads as dependency parsers on UD (§4), and head importance with its pruning curve
(Michel et al. 2019). The engine only: no UI, no jobs; results are pandas DataFrames with the CSV files' columns.

- :mod:`analysis.heads.model`: the eager-attention copy of a model, attention maps, head gates;
- :mod:`analysis.heads.words`: word-level attention from subword attention (Clark §4.1);
- :mod:`analysis.heads.stats`: per-head statistics with intervals over sentences, the head map;
- :mod:`analysis.heads.parse`: per-relation accuracy, fixed-offset baseline, attention trees' UUAS;
- :mod:`analysis.heads.run`: one pass over texts or a treebank feeding all of them (:func:`analyse`);
- :mod:`analysis.heads.importance`: head importance, the pruning curve, the share of heads each layer can lose.
"""
