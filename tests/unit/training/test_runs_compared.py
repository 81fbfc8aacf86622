"""Issue 53 item 17: the jobs page's comparison chart draws each run's accuracy with its 95% Wilson interval."""

import pandas as pd
import pytest

from analysis.training.plots import runs_compared


def test_the_accuracy_bars_carry_their_interval():
    table = pd.DataFrame({"job": [1, 2], "head": ["cls", "attention"], "accuracy": [0.7, 0.8],
                          "accuracy low": [0.6, None], "accuracy high": [0.78, None], "majority class": [0.5, 0.5],
                          "macro_f1": [0.68, 0.79]})
    bar = runs_compared(table).data[0]
    assert bar.name.startswith("accuracy") and bar.error_y.array[0] == pytest.approx(0.08)
    assert bar.error_y.arrayminus[0] == pytest.approx(0.1)
    assert pd.isna(bar.error_y.array[1])  # a k-fold mean recorded none: no bar drawn
