"""Host figures of one cell: the L2 disk (node-exporter), CPU utilization per host, GPU telemetry.

Disk figures are for the kernel device behind the L2 path only (`l2_device` of cell.json), read from
the node-exporter target on the lmcache host (the alphabetically first node target that has the
device when the host is unknown, so a device is never counted twice). Over the run (before/after
snapshots, else first/last sample): read/write GB/s (10^9 B/s), IOPS, mean latency in ms
(time / ops), utilization % (io_time rate), queue depth (io_time_weighted rate), total GB (from the
snapshots only: None when one is missing).
CPU utilization = 100 * (1 - increase(idle) / increase(all modes)) per node target.
GPU: mean power (W), utilization (%) and memory used (GiB) per GPU over the run samples; no rows, never
zeros, when no GPU telemetry was sampled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from kvoffload.analysis import names as N
from kvoffload.analysis.series import (
    RUN,
    STEP_S,
    Delta,
    delta,
    label_filter,
    labels_of,
    make_grid,
    note,
    run_span,
    windowed_rate,
)

GB = 1e9
GIB = 1024.0**3


def node_targets(targets: Mapping[str, Mapping[str, Any]], host: str | None = None) -> list[str]:
    """Node-exporter target names (of one host when given), sorted."""
    return sorted(
        name
        for name, ref in targets.items()
        if ref.get("kind") == "node" and (host is None or ref.get("host") == host)
    )


Targets = Mapping[str, Mapping[str, Any]]


def l2_disk_target(samples: pd.DataFrame, targets: Targets, device: str) -> str | None:
    """The node target that reports `device`, preferring the lmcache host's."""
    hosts = [ref.get("host") for ref in targets.values() if ref.get("kind") == "lmcache"]
    disk = label_filter(samples[samples["name"] == N.NODE_DISK_READ_BYTES[0]], device=device)
    having = set(disk["target"].unique())
    for host in hosts:
        for t in node_targets(targets, host):
            if t in having:
                return t
    return min(having) if having else None


def _device_delta(samples: pd.DataFrame, name: str, target: str, device: str) -> Delta | None:
    rows = label_filter(samples[(samples["name"] == name) & (samples["target"] == target)], device=device)
    return delta(rows, name)


def _total(d: Delta | None, what: str) -> float | None:
    """GB over the cell from the before/after snapshots; None (with a note) when a sampler round stood
    in for a snapshot: the host's background I/O between snapshot and round would be left out."""
    if d is None:
        return None
    if d.source != "snapshots":
        note(
            "disk_total_unknown",
            f"L2 disk GB {what}: a snapshot is missing, so the total over the cell is null",
        )
        return None
    return d.increase / GB


def disk_figures(
    samples: pd.DataFrame, targets: Mapping[str, Mapping[str, Any]], device: str | None
) -> dict[str, Any]:
    """L2 device figures (keys disk_*), all None without a device or its samples."""
    keys = [
        "disk_read_gbps",
        "disk_write_gbps",
        "disk_read_iops",
        "disk_write_iops",
        "disk_read_latency_ms",
        "disk_write_latency_ms",
        "disk_util_pct",
        "disk_queue_depth",
        "disk_read_total_gb",
        "disk_write_total_gb",
    ]
    out: dict[str, Any] = dict.fromkeys(keys)
    out["disk_device"] = device
    target = l2_disk_target(samples, targets, device) if device else None
    if device is None or target is None:
        return out
    d = {
        key: _device_delta(samples, names[0], target, device)
        for key, names in {
            "rb": N.NODE_DISK_READ_BYTES,
            "wb": N.NODE_DISK_WRITTEN_BYTES,
            "r": N.NODE_DISK_READS,
            "w": N.NODE_DISK_WRITES,
            "rt": N.NODE_DISK_READ_TIME,
            "wt": N.NODE_DISK_WRITE_TIME,
            "io": N.NODE_DISK_IO_TIME,
            "iow": N.NODE_DISK_IO_WEIGHTED,
        }.items()
    }

    def rate(key: str, scale: float = 1.0) -> float | None:
        v = d[key]
        return v.per_second / scale if v is not None and v.per_second is not None else None

    def per_op_ms(time_key: str, ops_key: str) -> float | None:
        t, ops = d[time_key], d[ops_key]
        return 1000.0 * t.increase / ops.increase if t and ops and ops.increase > 0 else None

    rb, wb = d["rb"], d["wb"]
    util = rate("io")
    out.update(
        {
            "disk_target": target,
            "disk_read_gbps": rate("rb", GB),
            "disk_write_gbps": rate("wb", GB),
            "disk_read_iops": rate("r"),
            "disk_write_iops": rate("w"),
            "disk_read_latency_ms": per_op_ms("rt", "r"),
            "disk_write_latency_ms": per_op_ms("wt", "w"),
            "disk_util_pct": None if util is None else 100.0 * util,
            "disk_queue_depth": rate("iow"),
            "disk_read_total_gb": _total(rb, "read"),
            "disk_write_total_gb": _total(wb, "written"),
        }
    )
    return out


def cpu_utilization(samples: pd.DataFrame, targets: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Per node target: host, cpu_util_pct over the run."""
    rows = []
    cpu = samples[samples["name"] == N.NODE_CPU[0]]
    for target in sorted(cpu["target"].unique()):
        mine = cpu[cpu["target"] == target]
        total = delta(mine, N.NODE_CPU[0])
        idle = delta(label_filter(mine, mode="idle"), N.NODE_CPU[0])
        if total is None or idle is None or total.increase <= 0:
            continue
        host = targets.get(target, {}).get("host") or target
        util = 100.0 * (1 - idle.increase / total.increase)
        rows.append({"target": target, "host": host, "cpu_util_pct": util})
    return pd.DataFrame(rows, columns=["target", "host", "cpu_util_pct"])


def gpu_table(samples: pd.DataFrame) -> pd.DataFrame:
    """Per GPU (target, gpu label): mean power W, utilization %, memory used GiB over the run."""
    present = samples["name"].unique()
    frames = []
    for column, candidates in (
        ("power_w", N.GPU_POWER_W),
        ("util_pct", N.GPU_UTIL_PCT),
        ("mem_used_gib", N.GPU_MEM_USED),
    ):
        name = N.resolve(present, candidates)
        if name is None:
            continue
        rows = samples[(samples["name"] == name) & (samples["phase"] == RUN) & samples["value"].notna()]
        if rows.empty:
            continue
        gpu = rows["labels"].map(lambda s: labels_of(s).get("gpu", "?"))
        scale = N.GPU_MEM_SCALE.get(name, 1.0) / GIB if column == "mem_used_gib" else 1.0
        means = (rows["value"] * scale).groupby([rows["target"], gpu]).mean().rename(column)
        frames.append(means)
    if not frames:
        return pd.DataFrame(columns=["target", "gpu", "power_w", "util_pct", "mem_used_gib"])
    table = pd.concat(frames, axis=1)
    table.index.names = ["target", "gpu"]
    return table.reset_index()


def gpu_figures(samples: pd.DataFrame) -> dict[str, Any]:
    """Cell-level GPU figures: total mean power, mean utilization, total mean memory used."""
    t = gpu_table(samples)

    def col(name: str, how: str) -> float | None:
        if name not in t.columns or t[name].dropna().empty:
            return None
        v = t[name].dropna()
        return float(v.sum() if how == "sum" else v.mean())

    return {
        "gpus": len(t),
        "gpu_power_w": col("power_w", "sum"),
        "gpu_util_pct": col("util_pct", "mean"),
        "gpu_mem_used_gib": col("mem_used_gib", "sum"),
    }


def parse_targets(text: str | None) -> dict[str, dict[str, Any]]:
    """The cells table's `targets` JSON column back to a mapping."""
    if not text:
        return {}
    parsed: dict[str, dict[str, Any]] = json.loads(text)
    return parsed


def disk_series(
    samples: pd.DataFrame, targets: Targets, device: str | None, step_s: float = STEP_S
) -> pd.DataFrame:
    """L2 device read/write GB/s between consecutive samples (t_s = seconds since the first sample)."""
    target = l2_disk_target(samples, targets, device) if device else None
    span = run_span(samples)
    if device is None or target is None or span is None:
        return pd.DataFrame(columns=["t_s", "read_gbps", "write_gbps"])
    grid = make_grid(span[0], span[1], step_s)
    mine = label_filter(samples[samples["target"] == target], device=device)
    out = pd.DataFrame({"t_s": grid - span[0]})
    for column, names in (("read_gbps", N.NODE_DISK_READ_BYTES), ("write_gbps", N.NODE_DISK_WRITTEN_BYTES)):
        out[column] = windowed_rate(mine, names[0], grid, window_s=2 * step_s).to_numpy() / GB
    return out
