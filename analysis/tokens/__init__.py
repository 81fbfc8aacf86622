"""Token-level analysis of a corpus, layer by layer (issue 29, ``docs/tokens.md``), one step per module:
``corpus`` (texts or a CoNLL-U treebank tokenised once, one metadata row per counted token), ``vectors``
(every counted token's vector at the chosen layers, float16 shards on disk, resumable, cached), ``search``
(nearest neighbours per layer: faiss indexes cached beside the vectors, a brute-force baseline, recall) and
``geometry`` (anisotropy, self-similarity, intra-sentence similarity, effective rank, rogue dimensions)."""
