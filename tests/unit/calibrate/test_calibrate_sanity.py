"""Sanity checks against datasheet ceilings, on the H200 fixtures and on doctored copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.calibrate.raw import load_raw
from kvoffload.calibrate.sanity import check_figures, datasheet_for, failures

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "calibrate"
SHAPES_MEASURED = ("llama-8b", "qwen3-8b", "llama-70b", "qwen3-32b")


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("Tesla T4", None),
    ],
)
def test_datasheet_lookup(name: str, match: str | None) -> None:
    sheet = datasheet_for(name)
    assert (sheet.match if sheet else None) == match


@pytest.mark.parametrize("shape", SHAPES_MEASURED)
def test_h200_runs_are_within_ceilings(shape: str) -> None:
    raw = load_raw(FIXTURES / f"h200-{shape}.json")
    checks = check_figures(raw.environment.device_name, raw.ceilings, raw.prefill, raw.decode, raw.transfer)
    assert {c.name for c in checks} == {
        "ceiling.matmul",
        "ceiling.copy",
        "prefill.layer_tflops",
        "decode.achieved_tbps",
        "transfer.host_to_device",
        "transfer.device_to_host",
    }
    assert failures(checks) == []
    assert [c.model_dump() for c in checks] == [c.model_dump() for c in raw.sanity]


def test_a_figure_above_the_ceiling_fails(raw_llama8b_path: Path) -> None:
    raw = load_raw(raw_llama8b_path)
    fast = raw.transfer.model_copy(update={"host_to_device_gbps": 80.0})
    checks = check_figures("NVIDIA H200", raw.ceilings, raw.prefill, raw.decode, fast)
    assert failures(checks) == ["transfer.host_to_device = 80 GB/s exceeds the datasheet ceiling 64 GB/s"]


def test_unknown_device_is_not_checked(raw_llama8b_path: Path) -> None:
    raw = load_raw(raw_llama8b_path)
    assert check_figures("Some Accelerator", raw.ceilings, raw.prefill, raw.decode, raw.transfer) == []
