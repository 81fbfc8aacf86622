"""The classifier lens (issue 46, part 1): every layer of a fine-tuned sequence classifier read through the
classifier's own head, so that one sees from which layer the model's decision is already there
(:mod:`.readout`: the head of each kind; :mod:`.lens`: the per-layer tables; :mod:`.tuned`: the tuned classifier
lens; :mod:`.plots`: its figures)."""
