"""LMCache MP figures from hand-made before/after and run samples."""

from __future__ import annotations

import pytest

from kvoffload.analysis.lmcache import lmcache_figures
from tests.unit.analysis.analysis_frames import Row, counter, samples_frame

TIMES = [15.0 * i for i in range(5)]  # 0 .. 60 s


def test_lmcache_figures() -> None:
    rows: list[Row] = []
    rows += counter(
        "lmcache_mp_lookup_requested_tokens_total", lambda t: 40 * t, TIMES, "lmcache", model_name="m"
    )
    rows += counter("lmcache_mp_lookup_hit_tokens_total", lambda t: 10 * t, TIMES, "lmcache", model_name="m")
    rows += counter("lmcache_mp_l1_evicted_chunks_total", lambda t: 2 * t, TIMES, "lmcache")
    rows += counter("lmcache_mp_l2_evicted_chunks_total", lambda t: t, TIMES, "lmcache")
    rows += counter("lmcache_mp_l1_eviction_loop_ticks_total", lambda t: t, TIMES, "lmcache")
    rows += counter("lmcache_mp_l1_eviction_loop_triggered_total", lambda t: t // 30, TIMES, "lmcache")
    rows += counter("lmcache_mp_num_chunks_loaded_total", lambda t: 3 * t, TIMES, "lmcache", worker_id="0")
    rows += counter("lmcache_mp_num_chunks_loaded_total", lambda t: t, TIMES, "lmcache", worker_id="1")
    rows += [
        ("run", t, "lmcache", "lmcache_mp_l1_usage_ratio", {}, r)
        for t, r in zip(TIMES, (0, 0.2, 0.4, 0.6, 0.8), strict=True)
    ]
    rows += [("run", t, "lmcache", "lmcache_mp_l1_memory_usage_bytes", {}, 1e9 * t / 60) for t in TIMES]
    rows += [
        ("run", t, "lmcache", "lmcache_mp_l2_usage_bytes", {"l2_name": "fs"}, 5e9 * t / 60) for t in TIMES
    ]
    for base, s, c in (
        ("lmcache_mp_l2_store_throughput_GB_per_second", 6.0, 4.0),
        ("lmcache_mp_l0_l1_load_throughput_GBs", 30.0, 3.0),  # older unit spelling
    ):
        rows += [
            ("before", -1, "lmcache", f"{base}_sum", {}, 0.0),
            ("before", -1, "lmcache", f"{base}_count", {}, 0.0),
        ]
        rows += [
            ("after", 61, "lmcache", f"{base}_sum", {}, s),
            ("after", 61, "lmcache", f"{base}_count", {}, c),
        ]
    f = lmcache_figures(samples_frame(rows))
    assert f["lmcache_hit_rate"] == pytest.approx(0.25) and f["lmcache_hit_rate_source"] == "samples"
    assert f["lmcache_lookup_hit_tokens"] == pytest.approx(600.0)
    assert f["lmcache_lookup_requested_tokens"] == pytest.approx(2400.0)
    assert f["lmcache_l1_evicted_chunks"] == pytest.approx(120.0)
    assert f["lmcache_l2_evicted_chunks"] == pytest.approx(60.0)
    assert f["lmcache_evicted_chunks"] == pytest.approx(180.0)
    assert f["lmcache_eviction_loop_ticks"] == pytest.approx(60.0)
    assert f["lmcache_eviction_loop_triggered"] == pytest.approx(2.0)
    assert f["lmcache_chunks_loaded"] == pytest.approx(240.0)  # 180 + 60 over both workers
    assert f["lmcache_l1_usage_mean_pct"] == pytest.approx(40.0) and f[
        "lmcache_l1_usage_max_pct"
    ] == pytest.approx(80.0)
    assert f["lmcache_usage_bytes_last"] == pytest.approx(6e9)  # 1 GB L1 + 5 GB L2 at the end
    assert f["lmcache_l2_store_gbps"] == pytest.approx(1.5)
    assert f["lmcache_l0_l1_load_gbps"] == pytest.approx(10.0)
    assert f["lmcache_l0_l1_store_gbps"] is None and f["lmcache_l2_load_gbps"] is None


def test_gpu_tier_has_no_lmcache_figures() -> None:
    f = lmcache_figures(samples_frame([]))
    assert all(v is None for v in f.values())
