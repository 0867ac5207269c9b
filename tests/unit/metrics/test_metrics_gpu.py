"""nvidia-smi and amd-smi output parsing (documented formats; the real H200 capture when present)."""

from __future__ import annotations

import pytest

from kvoffload.errors import UserError
from kvoffload.metrics.gpu import (
    MIB,
    NVIDIA_QUERY,
    parse_amd_smi_monitor,
    parse_gpu_spec,
    parse_nvidia_smi_csv,
)
from kvoffload.metrics.samples import Sample
from tests.unit.metrics.recorded import FIXTURES, H200_CAPTURE


def _values(samples: list[Sample]) -> dict[tuple[str, str], float | None]:
    return {(s.labels["gpu"], s.name): s.value for s in samples}


def test_nvidia_documented_format() -> None:
    samples = parse_nvidia_smi_csv((FIXTURES / "nvidia-smi-documented.csv").read_text(), "gpu-h1", 5.0)
    v = _values(samples)
    assert v[("0", "gpu_power_watts")] == 121.54
    assert v[("0", "gpu_utilization_percent")] == 87.0
    assert v[("0", "gpu_memory_used_bytes")] == 130048 * MIB
    assert v[("0", "gpu_memory_total_bytes")] == 143771 * MIB
    # GPU 1 reports power as [N/A]: no power sample is invented, the rest are there.
    assert ("1", "gpu_power_watts") not in v
    assert v[("1", "gpu_memory_used_bytes")] == 1024 * MIB
    first = samples[0]
    assert first.labels == {
        "gpu": "0",
        "uuid": "GPU-6f3c2a5e-1b2d-4c8e-9a0f-1234567890ab",
        "model": "NVIDIA H200",
        "vendor": "nvidia",
    }
    assert (first.target, first.ts) == ("gpu-h1", 5.0)


def test_nvidia_wrong_field_count_names_the_query() -> None:
    with pytest.raises(ValueError, match="expected 7"):
        parse_nvidia_smi_csv("0, GPU-x, NVIDIA H200, 100\n", "g", 0.0)
    assert len(NVIDIA_QUERY.split(",")) == 7


def test_nvidia_real_h200_capture() -> None:
    # The capture is successive polls of the lent H200 (one line per GPU per poll), idle then busy.
    # It is committed: a missing file fails here (read_text raises) rather than skipping.
    text = H200_CAPTURE.read_text()
    samples = parse_nvidia_smi_csv(text, "gpu", 0.0)
    rows = [line for line in text.splitlines() if line.strip()]
    unavailable = sum(line.count("[N/A]") + line.count("[Not Supported]") for line in rows)
    assert len(samples) == 4 * len(rows) - unavailable
    power = [s.value for s in samples if s.name == "gpu_power_watts" and s.value is not None]
    assert power and max(power) > min(power) > 0  # the capture spans idle and loaded polls
    for s in samples:
        assert "H200" in s.labels["model"]
        if s.name == "gpu_memory_total_bytes":
            assert s.value is not None and s.value > 100 * 1024**3  # H200: about 141 GB
        if s.name == "gpu_utilization_percent":
            assert s.value is not None and 0 <= s.value <= 100


def test_amd_monitor_full_table_ignores_process_section() -> None:
    v = _values(parse_amd_smi_monitor((FIXTURES / "amd-smi-monitor-q.txt").read_text(), "gpu-a", 0.0))
    assert v == {
        ("0", "gpu_power_watts"): 199.0,
        ("0", "gpu_utilization_percent"): 99.0,
        ("0", "gpu_memory_used_bytes"): 1235 * MIB,
        ("0", "gpu_memory_total_bytes"): 16335 * MIB,
    }


def test_amd_monitor_without_utilization_column() -> None:
    samples = parse_amd_smi_monitor((FIXTURES / "amd-smi-monitor-ptv.txt").read_text(), "gpu-a", 0.0)
    v = _values(samples)
    assert {g for g, _ in v} == {"0", "1", "2", "3"}
    assert v[("0", "gpu_power_watts")] == 248.0 and v[("3", "gpu_power_watts")] == 247.0
    assert v[("2", "gpu_memory_total_bytes")] == 196300 * MIB
    assert not [k for k in v if k[1] == "gpu_utilization_percent"]
    assert samples[0].labels == {"gpu": "0", "vendor": "amd"}


def test_gpu_spec_errors_name_the_flag() -> None:
    assert parse_gpu_spec("gpu-h1=nvidia-smi") == ("gpu-h1", "nvidia-smi")
    with pytest.raises(UserError, match="--gpu"):
        parse_gpu_spec("gpu-h1=rocm-smi")
