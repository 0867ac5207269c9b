"""The engine's `vllm:` families against real vLLM 0.32 (with and without LMCache's connector)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kvoffload.sim.engine_metrics import EngineMetrics

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LOOKUP = "vllm:lmcache_mp_lookup_duration_seconds"


def _families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def _real(files: list[Path]) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in files:
        out |= _families(path.read_text())
    return out


@pytest.mark.parametrize("connector", [False, True])
def test_every_engine_family_is_real_vllm_with_its_type(connector: bool) -> None:
    m = EngineMetrics("tiny", 8192, {"block_size": "32"}, lmcache_mp=connector)
    ours = _families(generate_latest(m.registry).decode())
    plain = sorted((FIXTURES / "vllm-0.32-cpu").glob("metrics-*.txt"))
    with_lmcache = sorted((FIXTURES / "lmcache-0.5.6-cpu").glob("vllm-*-metrics.txt"))
    real = _real(with_lmcache if connector else plain)
    assert ours, "no families"
    for name, kind in ours.items():
        assert real.get(name) == kind, f"{name}: ours {kind}, real {real.get(name)}"
    assert (LOOKUP in ours) is connector  # only LMCache's connector registers it


def test_lookup_duration_histogram_uses_vllm_labels_and_buckets() -> None:
    m = EngineMetrics("tiny", 8192, {"block_size": "32"}, lmcache_mp=True)
    assert m.lmcache_lookup is not None
    m.lmcache_lookup.observe(0.03)
    ours = [
        s for f in text_string_to_metric_families(generate_latest(m.registry).decode()) for s in f.samples
    ]
    real_text = (
        FIXTURES / "lmcache-0.5.6-cpu" / "vllm-0.32-cpu-with-lmcache-connector-metrics.txt"
    ).read_text()
    real = [s for f in text_string_to_metric_families(real_text) for s in f.samples]

    def buckets(samples: list[Sample]) -> list[str]:
        return [s.labels["le"] for s in samples if s.name == f"{LOOKUP}_bucket"]

    assert buckets(ours) == buckets(real)
    (count,) = [s for s in ours if s.name == f"{LOOKUP}_count"]
    assert count.labels == {"engine": "0", "model_name": "tiny"} and count.value == 1
