"""What each layer knows about linguistic structure (issue 27), one module per technique:

- :mod:`~analysis.core.treebank`: CoNLL-U treebanks (UD words, heads, relations; trees' distances, depths);
- :mod:`~analysis.structure.words`: word vectors per layer from subwords (first or mean), cached on disk;
- :mod:`~analysis.structure.probes`: UPOS and dependency-relation probes, control tasks (Hewitt & Liang 2019);
- :mod:`~analysis.structure.mdl`: online codelength (Voita & Titov 2020);
- :mod:`~analysis.structure.structural`: distance and depth probes (Hewitt & Manning 2019);
- :mod:`~analysis.structure.summary`: best layer and center of gravity (Tenney et al. 2019);
- :mod:`~analysis.structure.run`: one run over all of them; :mod:`~analysis.structure.options`: its options.

See ``docs/structure.md``.
"""
