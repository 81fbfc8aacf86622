"""The tests' data: the small cuts in tests/data, the bundled demo set and the shared datasets beside the checkout,
and a synthetic labelled task."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from analysis.core.inputs import TextInputs

DEMO_DATA = Path(__file__).resolve().parents[2] / "analysis" / "data" / "demo_sentiment.csv"

SHARED_DATA = Path(os.environ.get("LAYERLENS_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


FIXTURES = Path(__file__).resolve().parents[1] / "data"


def shared_file(relative: str) -> Path:
    """A file under the shared data, or a skip saying it is missing; a failure when LAYERLENS_REQUIRE_SHARED=1
    (as in CI, where a missing file must not pass as a skip)."""
    path = SHARED_DATA / relative
    if not path.is_file():
        message = f"needs {path} (the shared datasets beside the checkout; set LAYERLENS_SHARED_DATA)"
        if os.environ.get("LAYERLENS_REQUIRE_SHARED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def synthetic(n: int, seed: int = 0) -> TextInputs:
    """An easy task: 'good' -> pos, 'bad' -> neg, among filler words."""
    rng = np.random.default_rng(seed)
    filler = ["the", "film", "is", "very", "movie", "and", "it", "was"]
    texts, labels = [], []
    for i in range(n):
        words = list(rng.choice(filler, 5))
        word, label = ("good", "pos") if i % 2 else ("bad", "neg")
        words.insert(int(rng.integers(0, 6)), word)
        texts.append(" ".join(words))
        labels.append(label)
    return TextInputs(tuple(texts), labels=tuple(labels))


