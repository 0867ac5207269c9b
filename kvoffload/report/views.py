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

from kvoffload.analysis.attribution import Cost, TierAttribution
from kvoffload.analysis.capacity import Knee, TierCapacity, as_number, tokens_text
from kvoffload.tiers import LMCACHE_SERVER_GPU_OVERHEAD_GIB

MISSING = "–"


@dataclass(frozen=True)
class Table:
    """A rendered table: every cell already a string."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""


def fmt(v: Any, digits: int = 3, scale: float = 1.0, signed: bool = False) -> str:
    """Number with `digits` significant-ish decimals; '–' for None/NaN; text passes through."""
    if isinstance(v, str):
        return v
    f = as_number(v)
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
    f = as_number(v)
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


# The first table of a group: what answers "does offload help", narrow enough for a laptop screen.
COMPARISON_COLUMNS: list[Column] = [
    ("tier", lambda r: str(r["tier"])),
    ("cell", lambda r: str(r["cell_id"])),
    ("sessions achieved/available", _sessions),
    ("requests ok/all", _requests),
    ("later-round TTFT p50 (s)", _col("ttft_later_p50_s")),
    ("later-round TTFT p95 (s)", _col("ttft_later_p95_s")),
    ("TTFT p50 vs gpu (%)", _col("ttft_p50_vs_gpu_pct", 1, signed=True)),
    ("TTFT p95 vs gpu (%)", _col("ttft_p95_vs_gpu_pct", 1, signed=True)),
    ("TTFT degradation p50, later rounds vs round 1 (%)", _col("ttft_degradation_p50_pct", 1, signed=True)),
    ("comparable", lambda r: "yes" if bool(r.get("comparable", True)) else "NO"),
]

LATENCY_COLUMNS: list[Column] = [
    ("tier", lambda r: str(r["tier"])),
    ("cell", lambda r: str(r["cell_id"])),
    ("TTFT mean (s)", _col("ttft_mean_s")),
    ("TTFT p50 (s)", _col("ttft_p50_s")),
    ("TTFT p90 (s)", _col("ttft_p90_s")),
    ("TTFT p95 (s)", _col("ttft_p95_s")),
    ("TTFT p99 (s)", _col("ttft_p99_s")),
    ("TTFT degradation p95 (%)", _col("ttft_degradation_p95_pct", 1, signed=True)),
    ("time per output token, mean (ms)", _col("tpot_mean_s", 2, 1000.0)),
    ("input tokens per second", _col("input_tokens_per_s", 1)),
    ("output tokens per second", _col("output_tokens_per_s", 1)),
    ("requests per second", _col("requests_per_s", 3)),
]

CACHE_COLUMNS: list[Column] = [
    ("tier", lambda r: str(r["tier"])),
    ("cell", lambda r: str(r["cell_id"])),
    ("later-round hit rate (%)", _col("later_round_cached_share", 1, 100.0)),
    ("prompt tokens from GPU prefix cache (%)", _col("gpu_prefix_token_share", 1, 100.0)),
    ("prompt tokens from LMCache (%)", _col("lmcache_token_share", 1, 100.0)),
    ("local hit rate (%)", _col("local_hit_rate", 1, 100.0)),
    ("external hit rate (%)", _col("external_hit_rate", 1, 100.0)),
    ("KV cache usage mean (%)", _col("kv_usage_mean_pct", 1)),
    ("KV cache usage max (%)", _col("kv_usage_max_pct", 1)),
    ("prefill time mean (ms)", _col("prefill_mean_s", 2, 1000.0)),
    ("queue time mean (ms)", _col("queue_mean_s", 2, 1000.0)),
]

OFFLOAD_COLUMNS: list[Column] = [
    ("tier", lambda r: str(r["tier"])),
    ("cell", lambda r: str(r["cell_id"])),
    ("LMCache hit rate (%)", _col("lmcache_hit_rate", 1, 100.0)),
    ("lookup hit tokens", _int("lmcache_lookup_hit_tokens")),
    ("lookup requested tokens", _int("lmcache_lookup_requested_tokens")),
    (
        "hit tokens L1/L2",
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
        "chunks evicted L1/L2",
        lambda r: (
            f"{fmt_int(r.get('lmcache_l1_evicted_chunks'))}/{fmt_int(r.get('lmcache_l2_evicted_chunks'))}"
        ),
    ),
    ("LMCache usage at the end (GB)", _col("lmcache_usage_bytes_last", 3, 1e-9)),
    (
        "L1 usage mean/max (%)",
        lambda r: f"{fmt(r.get('lmcache_l1_usage_mean_pct'), 1)}/{fmt(r.get('lmcache_l1_usage_max_pct'), 1)}",
    ),
    (
        "eviction loop ticks/triggered",
        lambda r: (
            f"{fmt_int(r.get('lmcache_eviction_loop_ticks'))}/"
            f"{fmt_int(r.get('lmcache_eviction_loop_triggered'))}"
        ),
    ),
    ("chunks loaded", _int("lmcache_chunks_loaded")),
    (
        "GPU-L1 store/load (GB/s)",
        lambda r: f"{fmt(r.get('lmcache_l0_l1_store_gbps'), 2)}/{fmt(r.get('lmcache_l0_l1_load_gbps'), 2)}",
    ),
    (
        "L2 store/load (GB/s)",
        lambda r: f"{fmt(r.get('lmcache_l2_store_gbps'), 2)}/{fmt(r.get('lmcache_l2_load_gbps'), 2)}",
    ),
    ("preemptions", _int("preemptions")),
    ("cached token share (%)", _col("cached_token_share", 1, 100.0)),
    ("reusable token share (%)", _col("reuse_share", 1, 100.0)),
    ("shared-prefix reusable share (%)", _col("shared_prefix_reuse_share", 1, 100.0)),
]

DISK_COLUMNS: list[Column] = [
    ("tier", lambda r: str(r["tier"])),
    ("cell", lambda r: str(r["cell_id"])),
    ("device", lambda r: text(r.get("disk_device"))),
    ("read (GB/s)", _col("disk_read_gbps", 3)),
    ("write (GB/s)", _col("disk_write_gbps", 3)),
    ("read IOPS", _col("disk_read_iops", 1)),
    ("write IOPS", _col("disk_write_iops", 1)),
    ("read latency (ms)", _col("disk_read_latency_ms", 3)),
    ("write latency (ms)", _col("disk_write_latency_ms", 3)),
    ("utilization (%)", _col("disk_util_pct", 1)),
    ("queue depth", _col("disk_queue_depth", 2)),
    ("read total (GB)", _col("disk_read_total_gb", 3)),
    ("written total (GB)", _col("disk_write_total_gb", 3)),
    ("GPU power (W)", _col("gpu_power_w", 1)),
    ("GPU utilization (%)", _col("gpu_util_pct", 1)),
    ("GPU memory used (GiB)", _col("gpu_mem_used_gib", 2)),
]

# Beside "GPU memory used" where an offload tier ran on real GPUs (kvoffload/tiers.py says where the
# figure comes from).
GPU_MEMORY_NOTE = (
    "GPU memory used on the cpu and nvme tiers includes lmcache-server's CUDA context and transfer buffers "
    f"on every GPU (about {LMCACHE_SERVER_GPU_OVERHEAD_GIB:g} GiB each, an estimate), which the gpu tier "
    "does not run: the difference between tiers is not KV cache."
)

SESSION_COLUMNS: list[Column] = [
    ("cell", lambda r: str(r["cell_id"])),
    ("tier", lambda r: str(r["tier"])),
    ("concurrency", _int("concurrency")),
    ("num_rounds", _int("num_rounds")),
    ("virtual users available", _int("virtual_users_available")),
    ("sessions achieved", _int("achieved_sessions")),
    ("sessions complete", _int("sessions_complete")),
    ("sessions incomplete", _int("sessions_incomplete")),
    ("sessions ended in error", _int("sessions_error")),
    ("failed requests", _int("failed_requests")),
    ("Caddy upstream flaps", _int("caddy_upstream_flaps")),
    ("unit restarts", _int("unit_restarts")),
    ("node", lambda r: str(r.get("node") or MISSING)),
    ("client host", lambda r: str(r.get("client") or MISSING)),
    ("cold start", lambda r: str(r.get("cold_start") or MISSING)),  # restart, or reset in place
    ("status", lambda r: f"{r['status']}{'' if bool(r['done']) else ' (no DONE)'}"),
]


def gpu_memory_note(frame: pd.DataFrame) -> str:
    """GPU_MEMORY_NOTE where an offload-tier cell of `frame` measured GPU memory, else nothing."""
    if "gpu_mem_used_gib" not in frame.columns:
        return ""
    offload = frame[frame["tier"] != "gpu"]
    return GPU_MEMORY_NOTE if offload["gpu_mem_used_gib"].notna().any() else ""


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


def _value_text(v: float | None, unit: str) -> str:
    if v is None:
        return MISSING
    if unit == "B":
        return f"{v:,.0f} B ({v / 2**30:.3g} GiB)" if v >= 2**20 else f"{v:,.0f} B"
    return f"{v:,.6g}" + (f" {unit}" if unit else "")


def prediction_tables(preds: Sequence[TierCapacity]) -> tuple[Table, Table]:
    """Predicted capacity per tier (tokens, sessions) and every input with its source."""
    rows, inputs = [], []
    for p in preds:
        where = [p.model, str(p.num_rounds), p.tier]
        rows.append(
            [
                *where,
                tokens_text(p.tokens) if p.tokens is not None else MISSING,
                fmt(p.sessions, 1),
                p.missing or "",
            ]
        )
        inputs += [[*where, s.name, _value_text(s.value, s.unit), s.source] for s in p.inputs]
    head = ["model", "num_rounds", "tier"]
    note = (
        "Tokens of KV history each tier retains before it must evict and recompute; sessions = tokens / "
        "the mean live context of the sessions replayed at that num_rounds. An offload tier's figure is "
        "its largest store (LMCache keeps every chunk in L1, the nvme tier copies it on to L2)."
    )
    predicted = Table(
        "Predicted capacity",
        [*head, "history retained (tokens)", "sessions of this dataset", "not predicted because"],
        rows,
        note,
    )
    return predicted, Table(
        "Inputs of the prediction", [*head, "input", "value", "where it came from"], inputs
    )


def knee_table(knees: Sequence[Knee]) -> Table:
    """Every measured point of every sweep: the figures the knee is judged on."""
    rows = []
    for k in knees:
        for p in k.points:
            rows.append(
                [
                    k.tier,
                    f"{k.axis} {p.axis_value}",
                    tokens_text(p.live_history_tokens) if p.live_history_tokens is not None else MISSING,
                    fmt(p.later_hit_rate, 1, 100.0),
                    fmt(p.degradation_p50_pct, 1, signed=True),
                    fmt(p.later_p95_s),
                    ", ".join(p.cells),
                ]
            )
    headers = [
        "tier",
        "point",
        "live history (tokens)",
        "later-round hit rate (%)",
        "TTFT degradation p50 (%)",
        "later-round TTFT p95 (s)",
        "cells",
    ]
    return Table("Measured sweep", headers, rows)


# The cost table's rows: a source (attribution.SOURCES, or the coarse split COARSE) and its label.
COST_NAMES = {
    "gpu": "gpu",
    "l1": "l1",
    "l2": "l2",
    "recomputed": "recomputed",
    "cached_other": "GPU prefix cache or L1",
    "l2_hit": "L2",
    "missed": "recomputed",
}


def attribution_tables(view: TierAttribution) -> tuple[Table, Table, Table]:
    """The turn-by-turn tables of one tier: per round TTFT p50/p95 with the round's prompt tokens by
    source stacked beside it, the cost of each source (ms of TTFT per 1K tokens, ± its standard
    error), and the hit share against the turn's age (where retention shows)."""
    rounds = Table(
        f"{view.tier}: TTFT and prompt sources by round",
        ["round", "requests", "TTFT p50 s", "TTFT p95 s", "GPU tokens", "L1 tokens", "L2 tokens",
         "recomputed tokens"],
        [
            [fmt_int(r["round"]), fmt_int(r["requests"]), fmt(r["ttft_p50_s"]), fmt(r["ttft_p95_s"]),
             *(fmt_int(r[f"{s}_tokens"]) for s in ("gpu", "l1", "l2", "recomputed"))]
            for r in view.rounds.to_dict("records")
        ],
        "Tokens of the requests whose server said every source (docs/metrics.md, Per-request attribution).",
    )  # fmt: skip
    costs = [
        [COST_NAMES[name], fmt(c.s_per_1k, 2, 1000.0), fmt(c.stderr, 2, 1000.0)]
        for name, c in ((s, view.costs.get(s)) for s in COST_NAMES)
        if isinstance(c, Cost)
    ]
    note = f"Least-squares fit of TTFT over {view.costs.get('requests', 0)} requests."
    if view.costs.get("split") == "coarse":
        note += (
            " The server did not split the GPU prefix cache from LMCache per request (vLLM 0.32 streams no "
            "cached_token_stats), so the fit splits cached tokens into LMCache L2 hits and the rest."
        )
    ages = Table(
        f"{view.tier}: hit share by the turn's age",
        ["time since the user's previous turn", "requests", "median s", "hit share %", "LMCache share %"],
        [
            [r["age"], fmt_int(r["requests"]), fmt(r["median_age_s"], 1), fmt(r["hit_share"], 1, 100.0),
             fmt(r["lmcache_share"], 1, 100.0)]
            for r in view.ages.to_dict("records")
        ],
        "Cached prompt tokens (GPU prefix cache and LMCache) over prompt tokens, rounds 2 on; a share that "
        "falls with age is history the tier no longer held.",
    )  # fmt: skip
    return (
        rounds,
        Table(f"{view.tier}: cost per 1K prompt tokens", ["source", "ms", "± ms"], costs, note),
        ages,
    )
