"""A per-layer analysis across an ordered series of checkpoints (issue 46, part 2; "Probing Across Time", Liu et
al. 2021; MultiBERTs, Sellam et al. 2022): :mod:`.checkpoints` names and checks the series, :mod:`.table` the
long table ``series.csv`` and the per-checkpoint cache, :mod:`.plots` the layer x checkpoint heat maps. Which
analysis runs at each checkpoint is the task layer's business (:mod:`analysis.tasks.series`)."""
