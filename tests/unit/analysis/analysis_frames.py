"""Builders of hand-made frames in the shape of the ingest tables: `samples` and summary rows (imported by
the tests here)."""

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


def summary_row(cell_id: str, tier: str, **over: Any) -> dict[str, Any]:
    """One row of the summary table: a done cell of 100 virtual users at concurrency 8, sampled without
    failures, whose cache is full (kv_usage 99 %) and evicts; `over` replaces or adds columns."""
    row: dict[str, Any] = {
        "cell_id": cell_id,
        "tier": tier,
        "model": "m",
        "concurrency": 8,
        "num_rounds": 10,
        "isl": 32768,
        "osl": "recorded",
        "repeat": 0,
        "status": "done",
        "done": True,
        "virtual_users_available": 100,
        "achieved_sessions": 100,
        "failed_requests": 0,
        "scrapes": 10,
        "scrape_failures": 0,
        "local_hit_rate_source": "samples",
        "external_hit_rate_source": "samples",
        "kv_usage_source": "samples",
        "kv_usage_max_pct": 99.0,
        "lmcache_evicted_chunks": 10.0,
        "external_hit_tokens": 1000.0,
        "ttft_p50_s": 1.0,
        "ttft_p95_s": 2.0,
    }
    row.update(over)
    return row
