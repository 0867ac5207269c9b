"""Display tables of the report: headers and formatted cells, shared by the Markdown and HTML output.

Turns analysis DataFrames into `Table(title, headers, rows)` of strings; missing figures print as "–"
(never 0). No file IO.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

MISSING = "–"


@dataclass(frozen=True)
class Table:
    """A rendered table: every cell already a string."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, str):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def fmt(v: Any, digits: int = 3, scale: float = 1.0, signed: bool = False) -> str:
    """Number with `digits` significant-ish decimals; '–' for None/NaN; text passes through."""
    if isinstance(v, str):
        return v
    f = _num(v)
    if f is None:
        return MISSING
    f *= scale
    text = f"{f:+.{digits}f}" if signed else f"{f:.{digits}f}"
    return text


def text(v: Any) -> str:
    """A label value, '–' when missing (None or NaN)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return MISSING
    return str(v)


def fmt_int(v: Any) -> str:
    f = _num(v)
    return MISSING if f is None else f"{round(f):d}"


Column = tuple[str, Callable[[pd.Series], str]]


def _col(key: str, digits: int = 3, scale: float = 1.0, signed: bool = False) -> Callable[[pd.Series], str]:
    return lambda r: fmt(r.get(key), digits, scale, signed)


def _int(key: str) -> Callable[[pd.Series], str]:
    return lambda r: fmt_int(r.get(key))


def _sessions(r: pd.Series) -> str:
    return f"{fmt_int(r.get('achieved_sessions'))}/{fmt_int(r.get('virtual_users_available'))}"


def _requests(r: pd.Series) -> str:
    return f"{fmt_int(r.get('requests_ok'))}/{fmt_int(r.get('requests'))}"


COMPARISON_COLUMNS: list[Column] = [
    ("tier", lambda r: str(r["tier"])),
    ("cell", lambda r: str(r["cell_id"])),
    ("sessions achieved/available", _sessions),
    ("requests ok/all", _requests),
    ("TTFT mean s", _col("ttft_mean_s")),
    ("TTFT p50 s", _col("ttft_p50_s")),
    ("TTFT p90 s", _col("ttft_p90_s")),
    ("TTFT p95 s", _col("ttft_p95_s")),
    ("TTFT p99 s", _col("ttft_p99_s")),
    ("p50 vs gpu %", _col("ttft_p50_vs_gpu_pct", 1, signed=True)),
    ("p95 vs gpu %", _col("ttft_p95_vs_gpu_pct", 1, signed=True)),
    ("TPOT mean ms", _col("tpot_mean_s", 2, 1000.0)),
    ("input tok/s", _col("input_tokens_per_s", 1)),
    ("output tok/s", _col("output_tokens_per_s", 1)),
    ("req/s", _col("requests_per_s", 3)),
    ("TTFT degr. p50 %", _col("ttft_degradation_p50_pct", 1, signed=True)),
    ("TTFT degr. p95 %", _col("ttft_degradation_p95_pct", 1, signed=True)),
    ("local hit %", _col("local_hit_rate", 1, 100.0)),
    ("external hit %", _col("external_hit_rate", 1, 100.0)),
    ("KV usage mean %", _col("kv_usage_mean_pct", 1)),
    ("KV usage max %", _col("kv_usage_max_pct", 1)),
    ("prefill mean ms", _col("prefill_mean_s", 2, 1000.0)),
    ("queue mean ms", _col("queue_mean_s", 2, 1000.0)),
    ("comparable", lambda r: "yes" if bool(r.get("comparable", True)) else "NO"),
]

OFFLOAD_COLUMNS: list[Column] = [
    ("tier", lambda r: str(r["tier"])),
    ("cell", lambda r: str(r["cell_id"])),
    ("LMCache hit %", _col("lmcache_hit_rate", 1, 100.0)),
    ("lookup hit tok", _int("lmcache_lookup_hit_tokens")),
    ("lookup req tok", _int("lmcache_lookup_requested_tokens")),
    (
        "hit tok L1/L2",
        lambda r: f"{fmt_int(r.get('lmcache_l1_hit_tokens'))}/{fmt_int(r.get('lmcache_l2_hit_tokens'))}",
    ),
    (
        "L2 chunks stored/loaded/failed",
        lambda r: (
            f"{fmt_int(r.get('lmcache_l2_stored_chunks'))}/{fmt_int(r.get('lmcache_l2_loaded_chunks'))}/"
            f"{fmt_int(r.get('lmcache_l2_prefetch_failed_chunks'))}"
        ),
    ),
    (
        "evicted L1/L2 chunks",
        lambda r: (
            f"{fmt_int(r.get('lmcache_l1_evicted_chunks'))}/{fmt_int(r.get('lmcache_l2_evicted_chunks'))}"
        ),
    ),
    ("usage GB (end)", _col("lmcache_usage_bytes_last", 3, 1e-9)),
    (
        "L1 usage mean/max %",
        lambda r: f"{fmt(r.get('lmcache_l1_usage_mean_pct'), 1)}/{fmt(r.get('lmcache_l1_usage_max_pct'), 1)}",
    ),
    (
        "evict loop ticks/triggered",
        lambda r: (
            f"{fmt_int(r.get('lmcache_eviction_loop_ticks'))}/"
            f"{fmt_int(r.get('lmcache_eviction_loop_triggered'))}"
        ),
    ),
    ("chunks loaded", _int("lmcache_chunks_loaded")),
    (
        "L0-L1 store/load GB/s",
        lambda r: f"{fmt(r.get('lmcache_l0_l1_store_gbps'), 2)}/{fmt(r.get('lmcache_l0_l1_load_gbps'), 2)}",
    ),
    (
        "L2 store/load GB/s",
        lambda r: f"{fmt(r.get('lmcache_l2_store_gbps'), 2)}/{fmt(r.get('lmcache_l2_load_gbps'), 2)}",
    ),
    ("preemptions", _int("preemptions")),
    ("cached share %", _col("cached_token_share", 1, 100.0)),
    ("reuse share %", _col("reuse_share", 1, 100.0)),
]

DISK_COLUMNS: list[Column] = [
    ("tier", lambda r: str(r["tier"])),
    ("cell", lambda r: str(r["cell_id"])),
    ("device", lambda r: text(r.get("disk_device"))),
    ("read GB/s", _col("disk_read_gbps", 3)),
    ("write GB/s", _col("disk_write_gbps", 3)),
    ("read IOPS", _col("disk_read_iops", 1)),
    ("write IOPS", _col("disk_write_iops", 1)),
    ("read lat ms", _col("disk_read_latency_ms", 3)),
    ("write lat ms", _col("disk_write_latency_ms", 3)),
    ("util %", _col("disk_util_pct", 1)),
    ("queue depth", _col("disk_queue_depth", 2)),
    ("read GB", _col("disk_read_total_gb", 3)),
    ("written GB", _col("disk_write_total_gb", 3)),
    ("GPU power W", _col("gpu_power_w", 1)),
    ("GPU util %", _col("gpu_util_pct", 1)),
    ("GPU mem GiB", _col("gpu_mem_used_gib", 2)),
]

SESSION_COLUMNS: list[Column] = [
    ("cell", lambda r: str(r["cell_id"])),
    ("tier", lambda r: str(r["tier"])),
    ("concurrency", _int("concurrency")),
    ("num_rounds", _int("num_rounds")),
    ("virtual users", _int("virtual_users_available")),
    ("achieved", _int("achieved_sessions")),
    ("complete", _int("sessions_complete")),
    ("incomplete", _int("sessions_incomplete")),
    ("error", _int("sessions_error")),
    ("failed requests", _int("failed_requests")),
    ("status", lambda r: f"{r['status']}{'' if bool(r['done']) else ' (no DONE)'}"),
]


def _measured(cell: str) -> bool:
    return any(part != MISSING for part in cell.split("/"))


def table(
    title: str, frame: pd.DataFrame, columns: Sequence[Column], note: str = "", key_columns: int = 0
) -> Table:
    """Format `frame` rows with `columns`.

    With `key_columns` > 0, a table whose other cells are all "–" (nothing measured, e.g. LMCache
    figures of gpu-tier cells) comes back without rows, which renderers skip.
    """
    rows = [[f(r) for _, f in columns] for _, r in frame.iterrows()]
    if key_columns and not any(_measured(c) for row in rows for c in row[key_columns:]):
        rows = []
    return Table(title, [h for h, _ in columns], rows, note)


def frame_table(title: str, frame: pd.DataFrame, digits: int = 3) -> Table:
    """Any DataFrame, numbers formatted with `digits` decimals."""
    rows = [
        [fmt(v, digits) if not isinstance(v, str) else v for v in r] for r in frame.itertuples(index=False)
    ]
    return Table(title, [str(c) for c in frame.columns], rows)


def rounds_pivot(curves: dict[str, pd.DataFrame]) -> Table:
    """TTFT p50 / p95 per round (rows) and tier (columns), for readers of the Markdown report."""
    rounds = sorted({int(r) for c in curves.values() for r in c["round"]})
    headers = ["round"] + [f"{label} p50/p95 s" for label in curves]
    rows = []
    for rnd in rounds:
        row = [str(rnd)]
        for c in curves.values():
            hit = c[c["round"] == rnd]
            row.append(
                f"{fmt(hit['ttft_p50_s'].iloc[0])}/{fmt(hit['ttft_p95_s'].iloc[0])}" if len(hit) else MISSING
            )
        rows.append(row)
    return Table("TTFT by round", headers, rows)


def hosts_table(cells: pd.DataFrame) -> Table:
    """Union of the `hosts` maps of every cell.json: name, CPU, RAM, GPUs, NVMe."""
    hosts: dict[str, dict[str, Any]] = {}
    for text in cells["hosts"].dropna():
        hosts.update(json.loads(text))
    rows = []
    for name in sorted(hosts):
        h = hosts[name]
        gpus = h.get("gpus") or []
        gpu_text = (
            f"{len(gpus)} x {gpus[0] if isinstance(gpus[0], str) else json.dumps(gpus[0])}"
            if gpus
            else "none"
        )
        nvme = h.get("nvme")
        rows.append(
            [
                name,
                str(h.get("cpu", MISSING)),
                fmt(h.get("ram_gib"), 0),
                gpu_text,
                json.dumps(nvme, sort_keys=True) if nvme else "none",
            ]
        )
    return Table("Hosts", ["host", "CPU", "RAM GiB", "GPUs", "NVMe"], rows)


def software_view(frame: pd.DataFrame) -> Table:
    """analysis.software.software_table as a display table (no rows when no host reported software)."""
    t = frame_table("Software per host", frame)
    note = (
        "What ran on each lab host, read after every cell (collect role); cells: all when the versions "
        "were the same in every cell, else the cells that row covers. GPU driver and CUDA/ROCm as the GPU "
        "tool reports them."
    )
    return Table(t.title, t.headers, t.rows, note)
