"""The decision plot marks each level as the one judge found it (issue 53): filled where it meets the
target, hollow where it missed, a cross on the axis where it was not judged."""

from __future__ import annotations

import matplotlib.pyplot as plt

from kvoffload.analysis.crossing import Level
from kvoffload.report import decision_plot
from tests.unit.analysis.test_analysis_decision_judged import _tier


def _level(at: int, p95: float | None, meets: bool | None) -> Level:
    return Level(at, [at], [f"c{at}"] if meets is not None else [], 10, p95, None, None, None, meets)


def test_levels_are_marked_by_the_judges_answer() -> None:
    d = _tier(
        "gpu", "crossing", 16.0, [12.6, 17.8],
        levels=[_level(12, 0.29, True), _level(24, 0.93, False), _level(32, None, None)],
    )  # fmt: skip
    fig, ax = plt.subplots()
    decision_plot._levels(ax, d, "#1f77b4")
    marks = [(line.get_xdata()[0], line.get_ydata()[0], line.get_marker(), line.get_markerfacecolor())
             for line in ax.lines if line.get_marker() in ("o", "x")]  # fmt: skip
    plt.close(fig)
    assert marks == [(12, 0.29, "o", "#1f77b4"), (24, 0.93, "o", "white"), (32, 0.0, "x", "#1f77b4")]
