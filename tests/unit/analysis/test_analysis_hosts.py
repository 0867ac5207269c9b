"""L2 disk, CPU and GPU figures from hand-made node-exporter and GPU samples (and GPU textfile ones)."""

from __future__ import annotations

from typing import Any

import pytest

from kvoffload.analysis.hosts import cpu_utilization, disk_figures, disk_series, gpu_figures, gpu_table
from kvoffload.metrics.gpu import parse_nvidia_smi_csv
from kvoffload.metrics.samples import parse_exposition
from kvoffload.metrics.textfile import Poll, render_textfile
from tests.unit.analysis.analysis_frames import Row, samples_frame

TARGETS: dict[str, dict[str, Any]] = {
    "lmcache": {"kind": "lmcache", "host": "store1", "url": "http://store1:8080/metrics"},
    "node-gpu1": {"kind": "node", "host": "gpu1", "url": "http://gpu1:9100/metrics"},
    "node-store1": {"kind": "node", "host": "store1", "url": "http://store1:9100/metrics"},
}
# Increase over the 100 s between the before and after snapshots, for the L2 device on store1.
DISK = {
    "node_disk_read_bytes_total": 5e9,
    "node_disk_written_bytes_total": 2e10,
    "node_disk_reads_completed_total": 1000.0,
    "node_disk_writes_completed_total": 4000.0,
    "node_disk_read_time_seconds_total": 2.0,
    "node_disk_write_time_seconds_total": 20.0,
    "node_disk_io_time_seconds_total": 60.0,
    "node_disk_io_time_weighted_seconds_total": 250.0,
}


def _disk_rows() -> list[Row]:
    rows: list[Row] = []
    for name, inc in DISK.items():
        # The L2 device on the lmcache host, a decoy device there, and the same device name on another host.
        for target, device, k in (
            ("node-store1", "nvme1n1", 1.0),
            ("node-store1", "nvme0n1", 9.0),
            ("node-gpu1", "nvme1n1", 5.0),
        ):
            rows.append(("before", 1000.0, target, name, {"device": device}, 7.0))
            rows.append(("after", 1100.0, target, name, {"device": device}, 7.0 + k * inc))
    return rows


def test_disk_figures_for_the_l2_device_on_the_lmcache_host() -> None:
    f = disk_figures(samples_frame(_disk_rows()), TARGETS, "nvme1n1")
    assert f["disk_target"] == "node-store1"
    assert f["disk_read_gbps"] == pytest.approx(0.05)  # 5e9 B / 100 s / 1e9
    assert f["disk_write_gbps"] == pytest.approx(0.2)
    assert f["disk_read_iops"] == pytest.approx(10.0)
    assert f["disk_write_iops"] == pytest.approx(40.0)
    assert f["disk_read_latency_ms"] == pytest.approx(2.0)  # 2 s / 1000 reads
    assert f["disk_write_latency_ms"] == pytest.approx(5.0)  # 20 s / 4000 writes
    assert f["disk_util_pct"] == pytest.approx(60.0)  # 60 s busy in 100 s
    assert f["disk_queue_depth"] == pytest.approx(2.5)  # 250 s weighted / 100 s
    assert f["disk_read_total_gb"] == pytest.approx(5.0)
    assert f["disk_write_total_gb"] == pytest.approx(20.0)


def test_no_l2_device_gives_no_disk_figures() -> None:
    f = disk_figures(samples_frame(_disk_rows()), TARGETS, None)
    assert f["disk_read_gbps"] is None and f["disk_device"] is None
    f = disk_figures(samples_frame(_disk_rows()), TARGETS, "sdz")
    assert f["disk_write_total_gb"] is None


def test_disk_series_between_consecutive_samples() -> None:
    rows: list[Row] = [
        ("run", t, "node-store1", "node_disk_read_bytes_total", {"device": "loop3"}, v)
        for t, v in ((0, 0.0), (15, 1.5e9), (30, 1.5e9), (45, 4.5e9))
    ]
    rows += [
        ("run", t, "node-store1", "node_disk_written_bytes_total", {"device": "loop3"}, 0.0) for t in (0, 45)
    ]
    s = disk_series(samples_frame(rows), TARGETS, "loop3").set_index("t_s")
    # GB/s between neighbours: 0.1, 0, 0.2 (the first grid point has no earlier sample).
    assert s["read_gbps"].tolist()[1:] == pytest.approx([0.1, 0.0, 0.2])


def test_cpu_utilization_per_host() -> None:
    rows: list[Row] = []
    for cpu in ("0", "1"):
        rows += [
            ("before", 0, "node-gpu1", "node_cpu_seconds_total", {"cpu": cpu, "mode": "idle"}, 500.0),
            ("after", 100, "node-gpu1", "node_cpu_seconds_total", {"cpu": cpu, "mode": "idle"}, 575.0),
            ("before", 0, "node-gpu1", "node_cpu_seconds_total", {"cpu": cpu, "mode": "user"}, 40.0),
            ("after", 100, "node-gpu1", "node_cpu_seconds_total", {"cpu": cpu, "mode": "user"}, 60.0),
            ("before", 0, "node-gpu1", "node_cpu_seconds_total", {"cpu": cpu, "mode": "iowait"}, 1.0),
            ("after", 100, "node-gpu1", "node_cpu_seconds_total", {"cpu": cpu, "mode": "iowait"}, 6.0),
        ]
    t = cpu_utilization(samples_frame(rows), TARGETS)
    # Per CPU: idle +75, user +20, iowait +5 -> busy 25 of 100.
    assert t.to_dict("records") == [
        {"target": "node-gpu1", "host": "gpu1", "cpu_util_pct": pytest.approx(25.0)}
    ]


def test_gpu_means_from_our_sampler_and_from_dcgm() -> None:
    ours: list[Row] = []
    for t, p in ((0, 300.0), (15, 340.0)):
        ours.append(("run", t, "gpu-h1", "gpu_power_watts", {"gpu": "0", "vendor": "nvidia"}, p))
        ours.append(("run", t, "gpu-h1", "gpu_utilization_percent", {"gpu": "0", "vendor": "nvidia"}, 90.0))
        ours.append(
            ("run", t, "gpu-h1", "gpu_memory_used_bytes", {"gpu": "0", "vendor": "nvidia"}, 2 * 1024**3)
        )
        ours.append(("run", t, "gpu-h1", "gpu_power_watts", {"gpu": "1", "vendor": "nvidia"}, 100.0))
    f = gpu_figures(samples_frame(ours))
    assert f["gpus"] == 2
    assert f["gpu_power_w"] == pytest.approx(320.0 + 100.0)  # sum of per-GPU means
    assert f["gpu_util_pct"] == pytest.approx(90.0)  # GPU 1 has no utilization sample: left out
    assert f["gpu_mem_used_gib"] == pytest.approx(2.0)
    dcgm: list[Row] = [
        ("run", 0, "dcgm", "DCGM_FI_DEV_POWER_USAGE", {"gpu": "0", "UUID": "GPU-x"}, 100.0),
        ("run", 15, "dcgm", "DCGM_FI_DEV_POWER_USAGE", {"gpu": "0", "UUID": "GPU-x"}, 200.0),
        ("run", 0, "dcgm", "DCGM_FI_DEV_FB_USED", {"gpu": "0", "UUID": "GPU-x"}, 1024.0),  # MiB
    ]
    t = gpu_table(samples_frame(dcgm))
    assert t.to_dict("records") == [
        {"target": "dcgm", "gpu": "0", "power_w": 150.0, "mem_used_gib": pytest.approx(1.0)}
    ]


def test_no_gpu_samples_means_no_gpu_figures() -> None:
    f = gpu_figures(samples_frame([]))
    assert f == {"gpus": 0, "gpu_power_w": None, "gpu_util_pct": None, "gpu_mem_used_gib": None}


def test_gpu_figures_from_the_node_target_textfile() -> None:
    # kvoffload-gpu-telemetry.service writes the textfile, node-exporter serves it with the host's own
    # metrics, and the client's sampler scrapes it as target node-<host>: the analysis reads it by name.
    node_own = '# TYPE node_cpu_seconds_total counter\nnode_cpu_seconds_total{cpu="0",mode="idle"} 5.0\n'
    rows: list[Row] = []
    for ts, line in (
        (0, "0, GPU-a, NVIDIA H200, 600.0, 100, 2048, 143771"),
        (15, "0, GPU-a, NVIDIA H200, 700.0, 90, 4096, 143771"),
    ):
        poll = Poll("nvidia-smi", tuple(parse_nvidia_smi_csv(line + "\n", "x", ts)))
        scraped = parse_exposition(node_own + render_textfile(poll), "node-gpu1", ts)
        rows.extend(("run", s.ts, s.target, s.name, s.labels, s.value) for s in scraped)
    t = gpu_table(samples_frame(rows))
    assert t.to_dict("records") == [
        {
            "target": "node-gpu1",
            "gpu": "0",
            "power_w": pytest.approx(650.0),
            "util_pct": pytest.approx(95.0),
            "mem_used_gib": pytest.approx(3.0),  # 2048 and 4096 MiB
        }
    ]
    assert gpu_figures(samples_frame(rows))["gpu_power_w"] == pytest.approx(650.0)
