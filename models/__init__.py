"""Loading BERT-family masked LMs, their anatomy, the shared model cache and the bundled demo model."""
