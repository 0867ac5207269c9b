"""Display tables of the report: headers and formatted cells, shared by the Markdown and HTML output.

Turns analysis DataFrames into `Table(title, headers, rows)` of strings; missing figures print as "–"
(never 0). No file IO.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import pandas as pd

from kvoffload.analysis import bootstrap, noise
from kvoffload.analysis.attribution import Cost, TierAttribution, Verdict
from kvoffload.analysis.capacity import Knee, TierCapacity, as_number, tokens_text
from kvoffload.analysis.compare import NEAR_FULL_PCT, OFFLOAD_TIERS
from kvoffload.analysis.findings import CPU_BUILD_NOTE, Finding
from kvoffload.analysis.software import engine_set_source
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


def _records_sent(r: pd.Series) -> str:
    """requests.jsonl records / requests sessions.json counts sent ("–" for files that did not count
    them: they read 0 although records exist)."""
    records, sent = as_number(r.get("requests")), as_number(r.get("requests_sent"))
    unknown = sent is None or (sent == 0 and bool(records))
    return f"{fmt_int(records)}/{MISSING if unknown else fmt_int(sent)}"


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
    ("later-round TTFT p50 vs gpu (%)", _col("ttft_later_p50_vs_gpu_pct", 1, signed=True)),
    ("later-round TTFT p95 vs gpu (%)", _col("ttft_later_p95_vs_gpu_pct", 1, signed=True)),
    ("TTFT degradation p50, later rounds vs round 1 (%)", _col("ttft_degradation_p50_pct", 1, signed=True)),
    ("comparable", lambda r: "yes" if bool(r.get("comparable", True)) else "NO"),
]
# One definition per figure (issue 43): the comparison table's TTFT columns and its change vs gpu are all
# over later rounds, as the findings' are.
COMPARISON_NOTE = (
    "Every TTFT figure here is over the later rounds (round 2 on), the rounds the findings compare; the "
    "change vs gpu is against this group's gpu cell, which is the findings' change when the campaign has "
    "one repeat (the findings pool the repeats). The all-rounds TTFT is in the next table."
)

LATENCY_COLUMNS: list[Column] = [
    ("tier", lambda r: str(r["tier"])),
    ("cell", lambda r: str(r["cell_id"])),
    ("TTFT mean, all rounds (s)", _col("ttft_mean_s")),
    ("TTFT p50, all rounds (s)", _col("ttft_p50_s")),
    ("TTFT p90, all rounds (s)", _col("ttft_p90_s")),
    ("TTFT p95, all rounds (s)", _col("ttft_p95_s")),
    ("TTFT p99, all rounds (s)", _col("ttft_p99_s")),
    ("TTFT degradation p95, later rounds vs round 1 (%)", _col("ttft_degradation_p95_pct", 1, signed=True)),
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
    ("request records/sent", _records_sent),
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


def software_view(frame: pd.DataFrame, sets: Sequence[dict[str, Any]] = ()) -> Table:
    """analysis.software.software_table as a display table (no rows when no host reported software),
    with each engine set the nodes installed (analysis.software.engine_sets) named in its note."""
    t = frame_table("Software per host", frame)
    note = (
        "What ran on each lab host, read after every cell (collect role); cells: all when the versions "
        "were the same in every cell, else the cells that row covers. GPU driver and CUDA/ROCm as the GPU "
        "tool reports them."
    )
    for s in sets:
        note += (
            f" Engine set {s['name']} (build {s.get('build')}) on {', '.join(s.get('nodes') or []) or '-'}: "
            f"{', '.join(s.get('requirements') or [])}; wheels from {engine_set_source(s)}."
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
    "l2_hit": "L2 lookup hits (some may have been served from the GPU)",
    "missed": "recomputed",
}
# What the cost table says for each verdict (attribution.Verdict; docs/metrics.md "Cost of a hit and of
# a miss").
VERDICT_WORDS = {
    Verdict.COST: "a cost: its 95 % interval is above zero",
    Verdict.ZERO: "not told from zero: its 95 % interval reaches zero",
    Verdict.NO_INTERVAL: "too few sessions for an interval: not told from zero",
    Verdict.BELOW_ZERO: "no cost",
    Verdict.NOT_ESTIMABLE: "not estimable",
}
COARSE_ROUNDS_NOTE = (
    "The server did not split the GPU prefix cache from LMCache per request (vLLM 0.32 streams no "
    "cached_token_stats), so this is what every request does say: its cached tokens (GPU prefix cache and "
    "LMCache together) and the rest of its prompt, recomputed; and LMCache's L1 and L2 lookup hits for it "
    "(its line in the LMCache server's log, chunks x the server's chunk size). LMCache's lookup covers the "
    "whole prefix, so a lookup hit may have been served from the GPU prefix cache: the lookup hits are "
    "not a split of the cached tokens."
)


def _round_requests(r: Mapping[Any, Any]) -> str:
    """ "12", or "12 (10 say cached_tokens, 11 with a lookup line)" where some requests do not say."""
    n, said, looked = fmt_int(r["requests"]), fmt_int(r.get("said_cached")), fmt_int(r.get("looked_up"))
    return n if said == looked == n else f"{n} ({said} say cached_tokens, {looked} with a lookup line)"


def _rounds_table(view: TierAttribution) -> Table:
    """Per round TTFT p50/p95 with the round's prompt tokens by source beside it: the fine split where
    the server said it, else what every request says (cached, recomputed, LMCache's lookup hits)."""
    title = f"{view.tier}: TTFT and prompt sources by round"
    records = view.rounds.to_dict("records")
    head = ["round", "requests", "TTFT p50 s", "TTFT p95 s"]
    if view.split == "coarse":
        columns = ("cached", "missed", "l1_lookup", "l2_lookup")
        headers = [*head, "cached tokens (GPU or LMCache)", "recomputed tokens", "LMCache L1 lookup hits",
                   "LMCache L2 lookup hits"]  # fmt: skip
        note = COARSE_ROUNDS_NOTE
    else:
        columns = ("gpu", "l1", "l2", "recomputed")
        headers = [*head, "GPU tokens", "L1 tokens", "L2 tokens", "recomputed tokens"]
        note = (
            "Tokens of the requests whose server said every source "
            "(docs/metrics.md, Per-request attribution)."
        )
    rows = [
        [fmt_int(r["round"]), _round_requests(r) if view.split == "coarse" else fmt_int(r["requests"]),
         fmt(r["ttft_p50_s"]), fmt(r["ttft_p95_s"]), *(fmt_int(r.get(f"{c}_tokens")) for c in columns)]
        for r in records
    ]  # fmt: skip
    return Table(title, headers, rows, note)


def _cost_row(name: str, cost: Cost) -> list[str]:
    value = fmt(cost.s_per_1k, 2, 1000.0) if cost.verdict in (Verdict.COST, Verdict.NO_INTERVAL) else MISSING
    ci = (
        f"{fmt(cost.low, 2, 1000.0)}-{fmt(cost.high, 2, 1000.0)}"
        if cost.verdict in (Verdict.COST, Verdict.ZERO) and cost.low is not None
        else MISSING
    )
    said = VERDICT_WORDS[cost.verdict] + (f": {cost.why}" if cost.why and cost.verdict in (
        Verdict.BELOW_ZERO, Verdict.NOT_ESTIMABLE) else "")  # fmt: skip
    return [COST_NAMES[name], value, ci, said]


def attribution_tables(view: TierAttribution) -> tuple[Table, Table, Table]:
    """The turn-by-turn tables of one tier: per round TTFT p50/p95 with the round's prompt tokens by
    source beside it, the cost of each source (ms of TTFT per 1K tokens, its 95 % interval and what the
    data say of it: a cost, not told from zero, no cost, not estimable), and the hit share against the
    turn's age (where retention shows)."""
    costs = [
        _cost_row(name, c) for name, c in ((s, view.costs.get(s)) for s in COST_NAMES) if isinstance(c, Cost)
    ]
    clock = "the server's own TTFT" if view.costs.get("basis") == "server" else "TTFT as the client saw it"
    note = (
        f"Non-negative least squares of {clock} over {view.costs.get('requests', 0)} requests of "
        f"{view.costs.get('sessions', 0)} sessions; 95 % intervals from resampling the sessions "
        "(docs/metrics.md, Cost of a hit and of a miss)."
        if view.costs.get("requests")
        else "No fit: no request said every source and its TTFT."
    )
    if view.split == "coarse":
        note += (
            " The server did not split the GPU prefix cache from LMCache per request, so the fit splits "
            "cached tokens into LMCache L2 lookup hits and the rest."
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
    headers = ["source", "ms per 1K tokens", "95 % interval (ms)", "what the data say"]
    return (
        _rounds_table(view),
        Table(f"{view.tier}: cost per 1K prompt tokens", headers, costs, note),
        ages,
    )


def left_out_text(view: TierAttribution) -> str:
    """ "Left out: c2 (status 'failed' ...)" for the cells of the view's group and tier that the
    attribution does not pool (attribution.excluded_reason), or ""."""
    if not view.excluded:
        return ""
    return "Left out: " + "; ".join(f"{e['cell_id']} ({e['reason']})" for e in view.excluded) + "."


def markdown_rows(t: Table) -> list[str]:
    """A table's header, rule and rows as GitHub-flavoured Markdown lines (no title, no note)."""
    out = ["| " + " | ".join(t.headers) + " |", "|" + "|".join("---" for _ in t.headers) + "|"]
    return out + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in t.rows]


# --- the findings as a table (issue 53) -------------------------------------------------------------
# Each group's findings as rows a person scans: the change against gpu with its interval, the verdict
# and short tags; every tag's full text once per group under the table (the sentences, which repeat a
# group's warnings in each of its findings, stay in a details block and in report.md).
FINDINGS_HEADERS = [
    "tier",
    "later-round TTFT p50 / p95 (s)",
    "p50 vs gpu [95 % CI]",
    "p95 vs gpu [95 % CI]",
    "verdict (p50)",
    "warnings",
]
VERDICT_TEXT = {
    "faster": "faster than gpu",
    "slower": "slower than gpu",
    "indistinguishable": "not distinguishable from gpu",
}


@dataclass(frozen=True)
class FindingsView:
    """One comparison group's findings: the table, each tag's explanation (once) and the sentences."""

    table: Table  # its last column: the row's tags, ", "-joined (`tags` has them as lists)
    tags: list[list[str]]
    notes: list[tuple[str, str]]
    statements: list[str]


def _change(estimate: float | None, ci: Sequence[float] | None) -> str:
    """ "-8 % [-34, +28]"; "+5 % (no interval)"; "–"."""
    if estimate is None:
        return MISSING
    if ci is None:
        return f"{estimate:+.0f} % (no interval)"
    return f"{estimate:+.0f} % [{ci[0]:+.0f}, {ci[1]:+.0f}]"


def _vs_gpu(f: Finding) -> bool:
    """The finding compares an offload tier with a gpu cell of its group."""
    return f.tier != "gpu" and f.gpu_repeats is not None


def _finding_verdict(f: Finding) -> str:
    """The finding's verdict on its p50 change against gpu (analysis/findings.py `p50_verdict`)."""
    if f.tier == "gpu":
        return "baseline"
    if not f.comparable:
        return "NOT VALID: no verdict"
    if not _vs_gpu(f):
        return "no gpu cell to compare against"
    if f.p50_verdict is None:
        return "no verdict (no interval)"
    return VERDICT_TEXT.get(f.p50_verdict, f.p50_verdict)


def _spread_text(roles: Sequence[str], s: Mapping[str, Any]) -> str:
    """One CPU spread, the roles that showed the very same figures named together (virtual hosts on one
    machine share its CPUs, so each reports the same spread)."""
    who = f"the {roles[0]} host's" if len(roles) == 1 else f"the {' and '.join(roles)} hosts'"
    who = f"{roles[0]}'s" if len(roles) == 1 and roles[0].startswith("host ") else who
    same = " (the same figures on each)" if len(roles) > 1 else ""
    return (
        f"{who} CPU utilization{same} ranged {s['low_pct']:.0f}-{s['high_pct']:.0f} % between this group's "
        f"cells ({s['low_cell']} {s['low_pct']:.0f} %, {s['high_cell']} {s['high_pct']:.0f} %; "
        f"{noise.WIDE_CPU_SPREAD_PCT:.0f} points or more is wide): a TTFT difference between them may be "
        "the host's load, not the tier's"
    )


def _spreads(items: Sequence[Finding]) -> tuple[list[str], set[str]]:
    """The group's wide CPU spreads, one text per (low-high range, cells) whatever the roles that showed
    it, and the findings' own texts of them (which the caveats repeat)."""
    merged: dict[tuple[int, int, str, str], tuple[list[str], Mapping[str, Any]]] = {}
    own: set[str] = set()
    names = {f.name for f in fields(noise.CpuSpread)}
    for f in items:
        for s in f.cpu_spread:
            if not s.get("wide"):
                continue
            own.add(noise.CpuSpread(**{k: v for k, v in s.items() if k in names}).text())
            key = (round(s["low_pct"]), round(s["high_pct"]), str(s["low_cell"]), str(s["high_cell"]))
            roles, _ = merged.setdefault(key, ([], s))
            if s["role"] not in roles:
                roles.append(str(s["role"]))
    return [_spread_text(roles, s) for roles, s in merged.values()], own


def _caveats(items: Sequence[Finding], own: set[str]) -> tuple[list[str], set[str]]:
    """The group's cell caveats ("<cell>: <message>"), each message once with every cell it was said
    of, without those that repeat a CPU spread (`own`), and the cells that have one."""
    cells = {c for f in items for c in f.cells}
    by_message: dict[str, list[str]] = {}
    for text in dict.fromkeys(c for f in items for c in f.caveats if c not in own):
        cell, _, message = text.partition(": ")
        if cell not in cells or not message:
            cell, message = "", text
        said = by_message.setdefault(message, [])
        if cell and cell not in said:
            said.append(cell)
    texts = [f"{', '.join(c)}: {m}" if c else m for m, c in by_message.items()]
    return texts, {c for said in by_message.values() for c in said}


def _tags(f: Finding, spread: bool, cpu_build: bool, caveat_cells: set[str]) -> list[str]:
    """The short warning tags of one finding (`_notes` says what each means)."""
    tags = [] if f.comparable else ["not-valid"]
    if _vs_gpu(f):
        if f.p50_within_noise:
            tags.append("within-noise")
        if f.p50_change_vs_gpu_pct is not None and f.p50_change_ci_pct is None:
            tags.append("no-interval")
        if f.one_repeat:
            tags.append("one-repeat")
        if spread:
            tags.append("cpu-spread")
    if f.tier in OFFLOAD_TIERS and f.offload_exercised is False:
        tags.append("offload-unused")
    elif f.tier in OFFLOAD_TIERS and f.offload_exercised is None:
        tags.append("offload-unknown")
    if caveat_cells.intersection(f.cells):
        tags.append("caveat")
    if cpu_build:
        tags.append("cpu-build")
    return tags


def _noise_note(items: Sequence[Finding]) -> str:
    """What "within-noise" means, with the repeats per cell that would separate each tier's change."""
    said = []
    for f in items:
        n0 = min(f.repeats, f.gpu_repeats or f.repeats)
        text = noise.noise_text(f.p50_change_vs_gpu_pct, f.p50_change_ci_pct, n0)
        said.append(f"{f.tier}: {text.removeprefix('within noise: ')}")
    return (
        "the 95 % interval of the p50 change includes 0, so the data do not tell the tier from gpu; "
        + "; ".join(said)
    )


def _notes(
    items: Sequence[Finding], tags: Sequence[Sequence[str]], spreads: Sequence[str], caveats: Sequence[str]
) -> list[tuple[str, str]]:
    """Each tag the group's rows carry with its full text, once for the group."""
    used = {t for row in tags for t in row}
    with_tag = {t: [f for f, row in zip(items, tags, strict=True) if t in row] for t in used}
    reasons = list(dict.fromkeys(r for f in items for r in f.not_comparable_reasons))
    texts = {
        "not-valid": "not a valid comparison: " + ("; ".join(reasons) or "see the validity warnings"),
        "within-noise": _noise_note(with_tag.get("within-noise", [])),
        "no-interval": (
            f"too few sessions for a 95 % interval (at least {bootstrap.MIN_SESSIONS} a side): the change "
            "is stated without a verdict"
        ),
        "one-repeat": noise.one_repeat_text(
            any(f.p50_change_ci_pct is not None for f in with_tag.get("one-repeat", [])),
            any(f.repeats_to_separate is not None for f in with_tag.get("one-repeat", [])),
        ),
        "cpu-spread": "; ".join(spreads),
        "offload-unused": (
            f"offload was never exercised: KV usage stayed below {NEAR_FULL_PCT:.0f} %, with no LMCache "
            "evictions and no external prefix-cache hits, so the comparison does not measure offloading "
            "(the full statements give the figures)"
        ),
        "offload-unknown": (
            "whether offload was exercised is unknown (no KV usage, eviction or external-hit data)"
        ),
        "caveat": "; ".join(caveats),
        "cpu-build": CPU_BUILD_NOTE,
    }
    return [(t, texts[t]) for t in texts if t in used]


def findings_view(items: Sequence[Finding]) -> FindingsView:
    """One comparison group's findings (analysis/findings.py, one per tier) as a table with tags."""
    spreads, own = _spreads(items)
    caveats, caveat_cells = _caveats(items, own)
    cpu_build = any(CPU_BUILD_NOTE in f.statement for f in items)
    tags = [_tags(f, bool(spreads), cpu_build, caveat_cells) for f in items]
    rows = [
        [
            f.tier,
            f"{fmt(f.later_p50_s)} / {fmt(f.later_p95_s)}",
            _change(f.p50_change_vs_gpu_pct, f.p50_change_ci_pct) if _vs_gpu(f) else MISSING,
            _change(f.p95_change_vs_gpu_pct, f.p95_change_ci_pct) if _vs_gpu(f) else MISSING,
            _finding_verdict(f),
            ", ".join(row),
        ]
        for f, row in zip(items, tags, strict=True)
    ]
    table = Table("", FINDINGS_HEADERS, rows)
    return FindingsView(table, tags, _notes(items, tags, spreads, caveats), [f.statement for f in items])


def findings_markdown(view: FindingsView) -> list[str]:
    """The group's table, its tags explained, then the full sentences, as Markdown lines."""
    out = [*markdown_rows(view.table), ""]
    if view.notes:
        notes = Table("", ["warning", "what it means"], [[f"**{t}**", text] for t, text in view.notes])
        out += [*markdown_rows(notes), ""]
    return out + ["In full:", ""] + [f"- {s}" for s in view.statements] + [""]
