"""LayerLens analyses: plain Python over torch + transformers, free of any UI code."""

from analysis.core.versions import LAYERLENS_VERSION, versions

__all__ = ["LAYERLENS_VERSION", "versions"]
