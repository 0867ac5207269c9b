"""Raw H200 runs -> simulator cost profiles, validated by the simulator's own loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.calibrate.raw import PrefillPoint, load_raw
from kvoffload.calibrate.to_profile import monotone_prefill, write_profile
from kvoffload.sim.profile import PROFILE_DIR, load_profile

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "calibrate"
SHAPES_MEASURED = ("llama-8b", "qwen3-8b", "llama-70b", "qwen3-32b")


@pytest.mark.parametrize("shape", SHAPES_MEASURED)
def test_shipped_profile_is_the_conversion_of_the_kept_raw_run(tmp_path: Path, shape: str) -> None:
    """The shipped h200-<shape>.yaml is byte for byte what `calibrate --from-raw` makes of the fixture
    (regenerate both with tests/fixtures/calibrate/run-on-h200.sh, then --from-raw)."""
    out = tmp_path / f"h200-{shape}.yaml"
    write_profile(load_raw(FIXTURES / f"h200-{shape}.json"), out)
    assert out.read_text(encoding="utf-8") == (PROFILE_DIR / f"h200-{shape}.yaml").read_text(encoding="utf-8")


def test_profile_figures_come_from_the_raw_run(tmp_path: Path, raw_llama8b_path: Path) -> None:
    raw = load_raw(raw_llama8b_path)
    out = tmp_path / "measured.yaml"
    write_profile(raw, out)
    profile = load_profile(str(out))
    assert profile.name == "measured"
    assert profile.hardware.gpu == "NVIDIA H200"
    assert profile.hardware.vendor == "nvidia"
    assert profile.hardware.gpu_memory_gib == pytest.approx(
        raw.environment.device_memory_bytes / 2**30, abs=0.01
    )
    assert profile.model.kv_bytes_per_token == 131072
    assert profile.model.weights_gib == pytest.approx(14.96, abs=0.01)
    assert profile.prefill.points[-1] == (131072, pytest.approx(raw.prefill.points[-1].tokens_per_s, abs=0.1))
    assert profile.decode.points is not None
    assert len(profile.decode.points) == len(raw.decode.points)
    assert profile.transfer.host_to_device_gbps == pytest.approx(raw.transfer.host_to_device_gbps, abs=0.01)
    assert profile.disk.read_gbps == pytest.approx(raw.disk.read_gbps, abs=0.001)
    for group in ("hardware", "model", "prefill", "decode", "transfer", "disk"):
        prov = getattr(profile.provenance, group)
        assert prov.source == "measured"
        assert prov.date == raw.environment.started_at
        assert prov.driver == raw.environment.driver
    assert "CUDNN_ATTENTION" in profile.provenance.prefill.method


def test_decode_fit_is_physical(raw_llama8b_path: Path, tmp_path: Path) -> None:
    """Fitted per-context-token cost lies between the HBM-peak floor and 3x it."""
    out = tmp_path / "p.yaml"
    write_profile(load_raw(raw_llama8b_path), out)
    form = load_profile(str(out)).decode.form()
    floor = 131072 / 4.8e12
    assert floor < form.per_context_token_s < 3 * floor
    assert 0.004 < form.base_s < 0.01


def test_seventy_b_says_it_does_not_fit(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    profile = write_profile(load_raw(FIXTURES / "h200-llama-70b.json"), out)
    assert "do not fit this device" in profile.description
    assert profile.model.weights_gib > 0.9 * profile.hardware.gpu_memory_gib


def test_noisy_prefill_is_made_monotone(raw_llama8b_path: Path) -> None:
    raw = load_raw(raw_llama8b_path)
    first = raw.prefill.points[0]
    faster = PrefillPoint(
        **{**first.model_dump(), "context_tokens": first.context_tokens + 1, "total_s": 0.5 * first.total_s}
    )
    noisy = raw.model_copy(update={"prefill": raw.prefill.model_copy(update={"points": [first, faster]})})
    points, raised = monotone_prefill(noisy)
    assert raised == 1
    assert points[1][0] / points[1][1] == pytest.approx(first.total_s, rel=1e-4)


def test_quick_run_converts_too(tmp_path: Path) -> None:
    raw = load_raw(FIXTURES / "h200-llama-8b-quick.json")
    assert raw.quick
    profile = write_profile(raw, tmp_path / "quick.yaml")
    assert [c for c, _ in profile.prefill.points] == [1024, 4096, 16384, 65536]
    assert "(--quick)" in profile.description


def test_equal_times_survive_rounding(raw_llama8b_path: Path, tmp_path: Path) -> None:
    """Points raised to an equal time must still pass the simulator's check after rounding."""
    raw = load_raw(raw_llama8b_path)
    base = raw.prefill.points[0]
    pts = [
        PrefillPoint(**{**base.model_dump(), "context_tokens": c, "total_s": t})
        for c, t in ((1000, 0.0333), (1003, 0.0331), (1007, 0.0332))
    ]
    noisy = raw.model_copy(update={"prefill": raw.prefill.model_copy(update={"points": pts})})
    points, raised = monotone_prefill(noisy)
    assert raised == 2
    times = [c / t for c, t in points]
    assert times == sorted(times)
    write_profile(noisy, tmp_path / "p.yaml")  # validated by the simulator's model
