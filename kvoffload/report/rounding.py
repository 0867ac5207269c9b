"""Figures as the json and csv outputs write them (`report --format json|csv`, `compare`).

Report layer: presentation only, on figures `kvoffload.analysis` computed.
"""

from __future__ import annotations

from typing import Any

# Figures in json/csv keep this many significant digits: 0.13499999999999998 s reads 0.135 s, and no
# figure the report derives (seconds, shares, rates, bytes) is known to more than that.
SIGNIFICANT_DIGITS = 6


def round_figure(value: Any) -> Any:
    """A float to SIGNIFICANT_DIGITS, recursively through lists and dicts; anything else unchanged."""
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}") if value == value else value
    if isinstance(value, dict):
        return {k: round_figure(v) for k, v in value.items()}
    if isinstance(value, list):
        return [round_figure(v) for v in value]
    return value
