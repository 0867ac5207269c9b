"""Builders of hand-made `samples` frames in the shape of the ingest table (imported by the tests here)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd

Row = tuple[Any, ...]


def samples_frame(rows: Iterable[Row]) -> pd.DataFrame:
    """Rows of (phase, ts, target, name, labels dict, value) -> samples table of one cell."""
    records = [
        {
            "cell_id": "c",
            "phase": phase,
            "ts": float(ts),
            "target": target,
            "name": name,
            "labels": json.dumps(labels, sort_keys=True, separators=(",", ":")),
            "value": value,
        }
        for phase, ts, target, name, labels, value in rows
    ]
    return pd.DataFrame(records, columns=["cell_id", "phase", "ts", "target", "name", "labels", "value"])


def counter(
    name: str, rate: Callable[[float], float], times: Iterable[float], target: str = "vllm-0", **labels: str
) -> list[Row]:
    """Run samples of a counter whose value at time t is rate(t)."""
    return [("run", t, target, name, labels, rate(t)) for t in times]
