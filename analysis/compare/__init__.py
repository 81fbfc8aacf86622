"""Comparison of checkpoints layer by layer (issue 28): CKA, movers, aligned maps, per-layer summary."""
