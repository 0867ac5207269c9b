"""One summary row per cell (every figure of docs/metrics.md) and the per-round TTFT table.

Inputs are the ingest tables as DataFrames; output DataFrames are what the report renders and what
`report --format json|csv` prints. Each row's `data_notes` (JSON text: a list of {kind, message}) says
which figures fell back or are null and why (docs/metrics.md "Null rules"); analysis/nulls.py turns them
into warnings. A figure that only the before/after snapshots could give (`*_source` "snapshots") is
kept for a replay shorter than two sampling intervals (the sampler's own interval in this cell,
`sample_interval_s`, at most 15 s: series.grid_step) and null for a longer one: there the sampler's
rounds are missing, and the whole-run snapshot figure is not the steady-state one the rounds give.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import pandas as pd

from kvoffload.analysis.attribution import cell_attribution
from kvoffload.analysis.capacity import (
    configured_l1_gb,
    gpu_cache_figures,
    live_sessions,
    lmcache_capacity_figures,
    lmcache_host_memory,
)
from kvoffload.analysis.client import replay_window, request_figures, reuse_from_records, ttft_by_round
from kvoffload.analysis.engine import engine_figures
from kvoffload.analysis.health import caddy_flaps, unit_restarts
from kvoffload.analysis.hosts import cpu_utilization, disk_figures, gpu_figures, parse_targets
from kvoffload.analysis.lmcache import lmcache_figures
from kvoffload.analysis.routing import routing_figures
from kvoffload.analysis.series import collect_notes, grid_step, note, sampler_interval
from kvoffload.analysis.steady import steady_figures
from kvoffload.tiers import TIERS

TIER_ORDER: dict[str, int] = {tier: i for i, tier in enumerate(TIERS)}
CONFIG_COLUMNS = [
    "cell_id",
    "tier",
    "model",
    "concurrency",
    "num_rounds",
    "isl",
    "osl",
    "repeat",
    "status",
    "done",
    "valid",
    "invalid_reasons",
    "node",
    "client",
    "cold_start",
]
# sessions.json key -> summary column.
SESSION_COLUMNS = {
    "requested_concurrency": "requested_concurrency",
    "virtual_users_available": "virtual_users_available",
    "dropped_by_isl": "sessions_dropped_by_isl",  # issue 34: users a cell replays = available - dropped
    "achieved_sessions": "achieved_sessions",
    "complete": "sessions_complete",
    "incomplete": "sessions_incomplete",
    "error": "sessions_error",
    "failed_requests": "failed_requests",
    "requests": "requests_sent",  # 0 in files written before the replay counted them
}


def requests_lost(records: int, sessions: pd.Series | None) -> int | None:
    """Requests sessions.json counts as sent that requests.jsonl holds no record of (the replay writes
    one record per request sent, retries included: kvoffload/replay/runner.py `_send`), e.g. a file cut
    at a line boundary or lost on the way back; None when sessions.json is missing or counts no request
    (files written before it counted them). More records than counted (a replay worker that died
    before handing its counts on) is no loss: 0."""
    sent = None if sessions is None else sessions.get("requests")
    if sent is None or pd.isna(sent) or int(sent) <= 0:
        return None
    return max(0, int(sent) - records)


# Request counts that read 0 from no records: null when the records are missing (not a cell that sent
# nothing, which sessions.json says with `requests: 0`).
REQUEST_COUNTS = (
    "requests",
    "requests_ok",
    "requests_error",
    "requests_timeout",
    "requests_late",
    "requests_read_stamped",
    "sessions_replayed",
)


# Metric families any figure reads; everything else (most of node-exporter, histogram buckets, process
# and http metrics) is dropped before per-cell analysis so filters scan small frames.
RELEVANT_PREFIXES = (
    "vllm:",
    "lmcache_mp_",
    "node_disk_",
    "node_cpu_seconds_total",
    "gpu_",
    "DCGM_FI_DEV_",
    "caddy_reverse_proxy_upstreams_healthy",
)


def relevant(samples: pd.DataFrame) -> pd.DataFrame:
    """Rows of the metric families used by the figures (plus the sampler's `up`), buckets excluded."""
    names = samples["name"]
    keep = (names.str.startswith(RELEVANT_PREFIXES) & ~names.str.endswith("_bucket")) | (names == "up")
    return samples[keep]


def _by_cell(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {str(k): g for k, g in frame.groupby("cell_id", sort=False)}


def scrape_health(samples: pd.DataFrame) -> dict[str, Any]:
    """Scrape rounds and failures (the sampler's `up` series) of one cell's run."""
    up = samples[(samples["name"] == "up") & (samples["phase"] == "run")]
    failed = up[up["value"] == 0]
    return {
        "scrapes": len(up),
        "scrape_failures": len(failed),
        "scrape_failed_targets": ",".join(sorted(failed["target"].unique())) or None,
        "targets_sampled": ",".join(sorted(up["target"].unique())) or None,
    }


# Figures with a `<figure>_source` column, and the value columns that go null with them.
SOURCED_FIGURES = {
    "local_hit_rate": ("local_hit_rate",),
    "external_hit_rate": ("external_hit_rate",),
    "kv_usage": ("kv_usage_mean_pct", "kv_usage_max_pct"),
    "lmcache_hit_rate": ("lmcache_hit_rate",),
}


# Gauge figures averaged over the replay window (null without one).
WINDOWED_GAUGES = (
    "kv_usage_mean_pct",
    "kv_usage_max_pct",
    "kv_usage_source",
    "lmcache_l1_usage_mean_pct",
    "lmcache_l1_usage_max_pct",
)


def _null_unsampled(row: dict[str, Any], window: tuple[float, float] | None, step_s: float) -> None:
    """Null the snapshot-only figures of a replay long enough to have sampler rounds `step_s` apart
    (module doc); without a replay window (no request record) KV usage has no window and is null too."""
    if window is None:
        if row.get("kv_usage_source") is not None or row.get("lmcache_l1_usage_mean_pct") is not None:
            note(
                "window_unknown",
                "no request record: the replay window is unknown, so KV and L1 usage are null",
            )
        row.update(dict.fromkeys(WINDOWED_GAUGES))
        return
    if window[1] - window[0] < 2 * step_s:
        return
    for figure, columns in SOURCED_FIGURES.items():
        if row.get(f"{figure}_source") == "snapshots":
            note(
                "samples_missing",
                f"{figure}: no sampler rounds in a {window[1] - window[0]:.0f} s replay, only the before/"
                "after snapshots: null",
            )
            row.update({c: None for c in columns})
            row[f"{figure}_source"] = None


def _note_unsampled_targets(samples: pd.DataFrame, targets: dict[str, dict[str, Any]]) -> None:
    """A note per cell.json target without a single sampler round (the sampler writes an `up` sample
    for every target each round, reachable or not: none means metrics/<target>.jsonl is missing)."""
    sampled = set(samples.loc[samples["phase"] == "run", "target"].unique())
    for name in sorted(set(targets) - sampled):
        note(
            "target_not_sampled",
            f"{name}: no sampler round (metrics/{name}.jsonl missing or empty); its figures come from the "
            "snapshots where the rules allow, else they are null",
        )


def cpu_by_host(samples: pd.DataFrame, targets: dict[str, dict[str, Any]]) -> str | None:
    """CPU utilization % per host over the run as JSON text ({"host": pct}); None without node samples."""
    cpu = cpu_utilization(samples, targets)
    if cpu.empty:
        return None
    return json.dumps({str(h): float(v) for h, v in zip(cpu["host"], cpu["cpu_util_pct"], strict=True)})


def cell_summary(
    cell: pd.Series,
    requests: pd.DataFrame,
    sessions: pd.Series | None,
    samples: pd.DataFrame,
    before_cut: bool = False,
) -> dict[str, Any]:
    """Every figure of one cell as a flat dict, with `data_notes` (module doc); `before_cut`: its
    before-snapshot file ends mid-line (series.collect_notes)."""
    with collect_notes(before_cut) as notes:
        row = _cell_figures(cell, requests, sessions, samples)
    row["data_notes"] = json.dumps([{"kind": n.kind, "message": n.message} for n in notes]) if notes else None
    return row


def _cell_figures(
    cell: pd.Series, requests: pd.DataFrame, sessions: pd.Series | None, samples: pd.DataFrame
) -> dict[str, Any]:
    row: dict[str, Any] = {c: cell[c] for c in CONFIG_COLUMNS}
    row.update(request_figures(requests))
    for key, column in SESSION_COLUMNS.items():
        row[column] = None if sessions is None else int(sessions[key])
    if requests.empty and (
        sessions is None or int(sessions["achieved_sessions"]) > 0 or int(sessions["requests"]) > 0
    ):
        note(
            "no_requests",
            "requests.jsonl is missing, empty or unreadable"
            + ("" if sessions is None else f" though {int(sessions['achieved_sessions'])} sessions ran")
            + ": the client figures are null",
        )
        row.update(dict.fromkeys(REQUEST_COUNTS))
    # issue 43: records lost at a line boundary still read, and gave figures of part of the run
    row["requests_lost"] = requests_lost(len(requests), sessions)
    row["reuse_share"] = reuse_from_records(requests)
    window = replay_window(requests)
    row.update(engine_figures(samples, window))
    row.update(lmcache_figures(samples, window))
    row["sample_interval_s"] = sampler_interval(samples)
    _null_unsampled(row, window, grid_step(samples))
    targets = parse_targets(cell["targets"])
    _note_unsampled_targets(samples, targets)
    row["cpu_util_pct_by_host"] = cpu_by_host(samples, targets)
    row.update(disk_figures(samples, targets, cell["l2_device"]))
    row.update(gpu_figures(samples))
    row.update(scrape_health(samples))
    row.update(caddy_flaps(samples))
    row.update(unit_restarts(cell.get("units")))
    row["caddy_policy"] = _caddy_policy(cell.get("profiles"))
    row.update(routing_figures(requests, parse_targets(cell["targets"])))
    row.update(gpu_cache_figures(samples, targets))
    row.update(lmcache_capacity_figures(samples))
    row["lmcache_l1_size_gb"] = configured_l1_gb(cell.get("config"))
    hosts = cell.get("hosts")
    row.update(lmcache_host_memory(json.loads(hosts) if isinstance(hosts, str) and hosts else {}, targets))
    row.update(cell_attribution(str(cell["tier"]), requests, samples))
    # the steady window at the sessions this cell could hold at once (analysis/steady.py)
    row.update(steady_figures(requests, live_sessions(pd.DataFrame([row])).iloc[0]))
    return row


def _caddy_policy(profiles: Any) -> str | None:
    """cell.json `profiles.caddy`: the lb_policy in front of 2+ replicas (None: one replica, or unknown)."""
    if not isinstance(profiles, str) or not profiles:
        return None
    value = json.loads(profiles).get("caddy")
    return str(value) if value else None


def _empty_like(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.iloc[0:0]


def summarize(
    cells: pd.DataFrame,
    requests: pd.DataFrame,
    sessions: pd.DataFrame,
    samples: pd.DataFrame,
    before_cut: Collection[str] = (),
) -> pd.DataFrame:
    """One row per cell, ordered by configuration and then tier (gpu, cpu, nvme); `before_cut`: the
    cells whose before-snapshot file ends mid-line (ingest's `cut_off`)."""
    req, smp = _by_cell(requests), _by_cell(relevant(samples))
    ses = {str(r["cell_id"]): r for _, r in sessions.iterrows()}
    rows = [
        cell_summary(
            cell,
            req.get(str(cell["cell_id"]), _empty_like(requests)),
            ses.get(str(cell["cell_id"])),
            smp.get(str(cell["cell_id"]), _empty_like(samples)),
            str(cell["cell_id"]) in before_cut,
        )
        for _, cell in cells.iterrows()
    ]
    out = pd.DataFrame(rows)
    if out.empty:
        return pd.DataFrame(columns=CONFIG_COLUMNS)
    out["_tier"] = out["tier"].map(TIER_ORDER)
    out = out.sort_values(["model", "concurrency", "num_rounds", "isl", "osl", "repeat", "_tier", "cell_id"])
    return out.drop(columns="_tier").reset_index(drop=True)


def rounds_table(cells: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Per cell and round: TTFT curve (see client.ttft_by_round) with the cell's config columns."""
    frames = []
    for cell_id, g in requests.groupby("cell_id", sort=False):
        curve = ttft_by_round(g)
        curve.insert(0, "cell_id", cell_id)
        frames.append(curve)
    if not frames:
        columns = ["cell_id", "round", "requests", "ttft_mean_s", "ttft_p50_s", "ttft_p95_s"]
        return pd.DataFrame(columns=columns)
    cfg = cells[["cell_id", "tier", "concurrency", "num_rounds", "isl", "osl", "repeat", "model"]]
    return pd.concat(frames, ignore_index=True).merge(cfg, on="cell_id", how="left")
