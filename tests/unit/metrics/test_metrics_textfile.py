"""GPU telemetry for node-exporter's textfile collector: rendering, atomic writes, tool failures, the CLI."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.cli.metrics import GPU_TOOL_CHOICES
from kvoffload.metrics.gpu import GPU_TOOLS, GpuTool, parse_amd_smi_monitor, parse_nvidia_smi_csv
from kvoffload.metrics.samples import Sample
from kvoffload.metrics.textfile import (
    GPU_GAUGES,
    UP_METRIC,
    Poll,
    poll_gpu,
    render_textfile,
    run_textfile,
    write_atomic,
    write_once,
)
from tests.unit.metrics.recorded import FIXTURES, H200_CAPTURE

# One poll of the real H200 while busy (line 8 of the capture): 694.82 W, 100 %, 26067 / 143771 MiB.
H200_BUSY = H200_CAPTURE.read_text().splitlines()[7] + "\n"
MIB = 1024 * 1024

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _series_of(text: str) -> Series:
    """(name, sorted labels) -> value of every sample in an exposition, parsed by prometheus-client."""
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"series {key} appears twice"
            out[key] = s.value
    return out


def _expected(samples: list[Sample], tool: GpuTool, up: float) -> Series:
    out: Series = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples if s.value is not None}
    out[(UP_METRIC, (("tool", tool),))] = up
    return out


def _families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_render_round_trips_the_real_h200_poll() -> None:
    samples = parse_nvidia_smi_csv(H200_BUSY, "t", 1.0)
    text = render_textfile(Poll("nvidia-smi", tuple(samples)))
    assert _series_of(text) == _expected(samples, "nvidia-smi", 1.0)
    labels = (
        ("gpu", "0"),
        ("model", "NVIDIA H200"),
        ("uuid", "GPU-70e4a360-0ec1-2524-ab02-6e61f45a6bbc"),
        ("vendor", "nvidia"),
    )
    assert _series_of(text)[("gpu_power_watts", labels)] == 694.82
    assert _series_of(text)[("gpu_memory_used_bytes", labels)] == 26067 * MIB
    # Every family is a gauge with HELP text, the up gauge first.
    assert _families(text) == {UP_METRIC: "gauge", **dict.fromkeys(GPU_GAUGES, "gauge")}
    assert text.splitlines()[0].startswith(f"# HELP {UP_METRIC} ")
    for name in GPU_GAUGES:
        assert f"# HELP {name} {GPU_GAUGES[name]}" in text
        assert f"# TYPE {name} gauge" in text


def test_render_round_trips_several_amd_gpus_without_a_utilization_column() -> None:
    samples = parse_amd_smi_monitor((FIXTURES / "amd-smi-monitor-ptv.txt").read_text(), "t", 1.0)
    text = render_textfile(Poll("amd-smi", tuple(samples)))
    assert _series_of(text) == _expected(samples, "amd-smi", 1.0)
    assert len([k for k in _series_of(text) if k[0] == "gpu_power_watts"]) == 4
    assert "gpu_utilization_percent" not in _families(text)  # absent from the tool: no empty family


def test_render_escapes_label_values() -> None:
    odd = {"gpu": "0", "model": 'Weird "GPU" \\ model\nline 2', "vendor": "nvidia"}
    sample = Sample(ts=0.0, target="t", name="gpu_power_watts", labels=odd, value=12.5)
    text = render_textfile(Poll("nvidia-smi", (sample,)))
    assert 'model="Weird \\"GPU\\" \\\\ model\\nline 2"' in text
    assert _series_of(text)[("gpu_power_watts", tuple(sorted(odd.items())))] == 12.5


def test_render_keeps_the_last_value_of_a_repeated_series() -> None:
    # The whole capture is 40 polls of GPU 0; node-exporter rejects a file that repeats a series.
    samples = parse_nvidia_smi_csv(H200_CAPTURE.read_text(), "t", 1.0)
    last = parse_nvidia_smi_csv(H200_CAPTURE.read_text().splitlines()[-1], "t", 1.0)
    assert len(samples) == 40 * len(last)
    rendered = render_textfile(Poll("nvidia-smi", tuple(samples)))
    assert _series_of(rendered) == _expected(last, "nvidia-smi", 1.0)


def test_a_failed_poll_renders_only_the_up_gauge_at_zero() -> None:
    text = render_textfile(Poll("nvidia-smi", (), error="RuntimeError: nvidia-smi exited 9"))
    assert _series_of(text) == {(UP_METRIC, (("tool", "nvidia-smi"),)): 0.0}


def test_poll_reports_tool_and_parse_failures_instead_of_raising() -> None:
    def missing(tool: GpuTool, timeout_s: float) -> str:
        raise RuntimeError(f"{tool} is not installed on this host")

    def garbage(tool: GpuTool, timeout_s: float) -> str:
        return "0, only, three\n"

    def good(tool: GpuTool, timeout_s: float) -> str:
        assert (tool, timeout_s) == ("nvidia-smi", 3.0)
        return H200_BUSY

    gone = poll_gpu("nvidia-smi", 3.0, missing)
    assert gone.error == "RuntimeError: nvidia-smi is not installed on this host"
    bad = poll_gpu("nvidia-smi", 3.0, garbage)
    assert bad.samples == ()
    assert bad.error is not None and bad.error.startswith("ValueError: nvidia-smi row has 3 fields")
    ok = poll_gpu("nvidia-smi", 3.0, good, clock=lambda: 7.0)
    assert ok.error is None and len(ok.samples) == 4 and {s.ts for s in ok.samples} == {7.0}


def test_write_atomic_replaces_the_file_with_mode_0644(tmp_path: Path) -> None:
    path = tmp_path / "kvoffload_gpu.prom"
    path.write_text("old\n")
    path.chmod(0o600)
    old_inode = path.stat().st_ino
    umask = os.umask(0o077)
    try:
        write_atomic(path, "new 1\n")
    finally:
        os.umask(umask)
    assert path.read_text() == "new 1\n"
    assert path.stat().st_mode & 0o777 == 0o644
    assert path.stat().st_ino != old_inode  # a rename, not a rewrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvoffload_gpu.prom"]


def test_write_atomic_keeps_the_old_file_when_writing_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kvoffload_gpu.prom"
    path.write_text("old\n")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvoffload_gpu.prom"]  # no temporary left


def test_a_tool_failure_drops_the_stale_series(tmp_path: Path) -> None:
    path = tmp_path / "kvoffload_gpu.prom"

    def good(tool: GpuTool, timeout_s: float) -> str:
        return H200_BUSY

    def timeout(tool: GpuTool, timeout_s: float) -> str:
        raise RuntimeError(f"{tool} did not answer within {timeout_s:g} s")

    assert write_once(path, "nvidia-smi", 10.0, good).error is None
    assert "gpu_power_watts" in _families(path.read_text())
    poll = write_once(path, "nvidia-smi", 10.0, timeout)
    assert poll.error == "RuntimeError: nvidia-smi did not answer within 10 s"
    assert _series_of(path.read_text()) == {(UP_METRIC, (("tool", "nvidia-smi"),)): 0.0}


def test_run_loop_survives_failures_logs_them_once_and_removes_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "kvoffload_gpu.prom"
    stop = threading.Event()
    seen: list[str] = []  # the file as each poll found it (the previous poll's result)
    script = ["ok", "fail", "fail", "ok"]

    def runner(tool: GpuTool, timeout_s: float) -> str:
        seen.append(path.read_text() if path.exists() else "")
        step = script[len(seen) - 1]
        if len(seen) == len(script):
            stop.set()
        if step == "fail":
            raise RuntimeError("nvidia-smi exited 9: NVML: driver/library version mismatch")
        return H200_BUSY

    with caplog.at_level(logging.INFO, logger="kvoffload.metrics.textfile"):
        polls = run_textfile(path, "nvidia-smi", 0.01, stop, timeout_s=1.0, runner=runner)
    assert polls == 4
    assert not path.exists()  # a stopped sampler leaves no stale values for node-exporter
    ups = [_series_of(text)[(UP_METRIC, (("tool", "nvidia-smi"),))] for text in seen[1:]]
    assert ups == [1.0, 0.0, 0.0]
    assert "gpu_power_watts" not in _families(seen[2])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "driver/library version mismatch" in warnings[0].getMessage()
    assert any("answers again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_cli_tool_choices_are_the_parsers() -> None:
    assert GPU_TOOL_CHOICES == GPU_TOOLS
