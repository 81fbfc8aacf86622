"""The structure page's curves draw what probes.csv says: the score, its band, baseline, control and, when given,
a reference run (random weights)."""

import pandas as pd
import pytest

from analysis.structure.plots import task_curves


def _probes(shift: float = 0.0) -> pd.DataFrame:
    rows = []
    for layer in range(3):
        rows.append({"layer": layer, "task": "upos", "metric": "accuracy", "value": 0.5 + 0.1 * layer + shift,
                     "ci_low": 0.45 + 0.1 * layer + shift, "ci_high": 0.55 + 0.1 * layer + shift,
                     "majority_baseline": 0.2, "control": 0.3, "selectivity": 0.2 + 0.1 * layer})
        rows.append({"layer": layer, "task": "distance", "metric": "uuas", "value": 0.4, "ci_low": 0.35,
                     "ci_high": 0.45, "majority_baseline": float("nan"), "control": float("nan"),
                     "selectivity": float("nan")})
    return pd.DataFrame(rows)


def test_curves_show_band_baseline_control_and_the_reference_run():
    fig = task_curves(_probes(), reference=_probes(-0.2), reference_name="random weights")
    by_name = {}
    for trace in fig.data:
        by_name.setdefault(trace.name, []).append(trace)
    assert [y for t in by_name["probe"] for y in t.y] == pytest.approx([0.5, 0.6, 0.7, 0.4, 0.4, 0.4])
    assert [y for t in by_name["random weights"] for y in t.y] == pytest.approx([0.3, 0.4, 0.5, 0.4, 0.4, 0.4])
    assert len(by_name["control task"]) == 1 and list(by_name["majority baseline"][0].y) == [0.2] * 3
    band = by_name["95% interval"][0]
    # the band: the highs, then the lows reversed
    assert band.mode == "lines" and list(band.y) == pytest.approx([0.55, 0.65, 0.75, 0.65, 0.55, 0.45])


def test_no_reference_no_reference_line():
    assert all(t.name != "random weights" for t in task_curves(_probes()).data)


def test_the_uuas_and_root_panels_draw_their_position_baselines():
    """probes.csv's position_baseline (the right-branching chain for UUAS, the commonest root position for root
    accuracy) is a line in those panels; panels without one (UPOS) draw none."""
    frame = _probes()
    frame["position_baseline"] = [float("nan") if t == "upos" else 0.47 for t in frame.task]
    fig = task_curves(frame)
    lines = [t for t in fig.data if t.name == "position baseline"]
    assert len(lines) == 1 and list(lines[0].y) == [0.47] * 3 and list(lines[0].x) == [0, 1, 2]
    assert lines[0].xaxis == "x2"  # the UUAS panel, the second
    assert all(t.name != "position baseline" for t in task_curves(_probes()).data)  # an older probes.csv
