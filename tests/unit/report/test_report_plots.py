"""Plots say what their tables say (issue 43, defect 10): the cache plot's definitions and its points."""

from __future__ import annotations

import math
import re

import pandas as pd

from kvoffload.report import plots


def _markers(svg: str) -> int:
    return sum(1 for use in re.findall(r"<use [^>]*>", svg) if plots.TIER_COLOURS["cpu"] in use)


def test_a_one_point_hit_rate_series_is_drawn_and_kv_usage_names_its_definition() -> None:
    # A short replay: its hit-rate series has one point between gaps (a line alone draws nothing there).
    nan = math.nan
    frame = pd.DataFrame(
        {
            "t_s": [0.0, 2.0, 4.0],
            "local_hit_rate": [nan, 0.4, nan],
            "external_hit_rate": [nan, nan, nan],
            "kv_usage_max_pct": [20.0, 86.1, 30.0],
        }
    )
    svg = plots.cache_over_time({"cpu": frame})
    without = plots.cache_over_time({"cpu": frame.assign(local_hit_rate=nan)})
    assert svg is not None and without is not None
    # the hit-rate point is drawn: a marker (an SVG <use> in the tier's colour) for it and for its
    # legend entry; the three KV rounds have theirs in both plots
    assert _markers(svg) - _markers(without) == 2
    assert "KV cache usage, fullest replica" in svg and "table max = peak" in svg
    assert "table = mean of the last quarter" in svg
