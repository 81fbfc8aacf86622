"""LayerLens analyses: plain Python over torch + transformers, free of any UI code."""
