"""LMCache MP figures from hand-made samples and from real LMCache 0.5.6 scrapes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvoffload.analysis import names as N
from kvoffload.analysis.compare import offload_exercised
from kvoffload.analysis.lmcache import lmcache_figures
from kvoffload.analysis.series import collect_notes
from kvoffload.analysis.summary import relevant
from kvoffload.metrics.samples import parse_exposition, up_sample
from tests.unit.analysis.analysis_frames import Row, counter, samples_frame

TIMES = [15.0 * i for i in range(5)]  # 0 .. 60 s
LMCACHE = Path(__file__).resolve().parents[2] / "fixtures" / "lmcache-0.5.6-cpu"
# The CPU capture after the first replay plus the CUDA transfer path's families as the 0.5.6 wheel
# defines them (synthetic: tests/fixtures/lmcache-0.5.6-wheel/README.md says how it was built).
CUDA_PATH = LMCACHE.parent / "lmcache-0.5.6-wheel" / "metrics-cuda-path-after-replay.txt"


def test_lmcache_figures() -> None:
    rows: list[Row] = []
    rows += counter(
        "lmcache_mp_lookup_requested_tokens_total", lambda t: 40 * t, TIMES, "lmcache", model_name="m"
    )
    rows += counter("lmcache_mp_lookup_hit_tokens_total", lambda t: 10 * t, TIMES, "lmcache", model_name="m")
    rows += counter("lmcache_mp_l1_evicted_chunks_total", lambda t: 2 * t, TIMES, "lmcache")
    rows += counter("lmcache_mp_l2_evicted_objects_chunks_total", lambda t: t, TIMES, "lmcache")
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
        ("lmcache_mp_l0_l1_load_throughput_GB_per_second", 30.0, 3.0),
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


def _scrape(name: str | Path, target: str, ts: float, phase: str) -> list[Row]:
    """One real capture file as sampler rows (the sampler's own parser), tagged with a phase."""
    samples = parse_exposition((LMCACHE / name).read_text(), target, ts)
    return [(phase, s.ts, s.target, s.name, s.labels, s.value) for s in samples]


def _real(before: list[Row], after_file: str | Path) -> dict[str, object]:
    rows = [*before, *_scrape(after_file, "lmcache", 200.0, "after")]
    return lmcache_figures(relevant(samples_frame(rows)))


def test_real_lmcache_scrape_from_a_fresh_server() -> None:
    # The server started with the cell: its before snapshot held only the sampler's `up` (every
    # lmcache_mp_ counter appears at its first update), so the after scrape's values are the increases.
    up = up_sample("lmcache", 100.0, None)
    before = [("before", up.ts, up.target, up.name, up.labels, up.value)]
    f = _real(before, "metrics-fs_native-after-l2-loads.txt")
    assert f["lmcache_lookup_requested_tokens"] == 589312.0
    assert f["lmcache_lookup_hit_tokens"] == 550400.0
    assert f["lmcache_hit_rate"] == pytest.approx(550400 / 589312)
    assert f["lmcache_hit_rate_source"] == "snapshots"
    assert f["lmcache_l1_hit_tokens"] == 516864.0
    assert f["lmcache_l2_hit_tokens"] == 33536.0
    assert f["lmcache_l1_evicted_chunks"] == 189.0
    # L2 never filled: LMCache never created the counter, and on a scraped server that means none
    assert f["lmcache_l2_evicted_chunks"] == 0.0
    assert f["lmcache_evicted_chunks"] == 189.0
    assert f["lmcache_l2_stored_chunks"] == 115.0
    assert f["lmcache_l2_loaded_chunks"] == 131.0
    assert f["lmcache_l2_prefetch_failed_chunks"] == 17.0  # reason="l1_oom"
    assert f["lmcache_l1_allocation_failed_chunks"] == 1.0
    assert f["lmcache_eviction_loop_ticks"] == 110.0
    assert f["lmcache_eviction_loop_triggered"] == 4.0
    assert f["lmcache_usage_bytes_last"] == 7208960.0 + 12845056.0
    assert f["lmcache_l1_usage_mean_pct"] == pytest.approx(67.13867337566629)
    assert f["lmcache_l2_store_gbps"] == pytest.approx(14.83690590299792 / 43)
    assert f["lmcache_l2_load_gbps"] == pytest.approx(20.435943826974317 / 41)
    # GPU transfer path only (the capture ran LMCache's non-GPU copy path).
    # GPU transfer path only: not measured on a CPU-mode server, so not 0 either
    assert f["lmcache_chunks_loaded"] is None
    assert f["lmcache_l0_l1_store_gbps"] is None and f["lmcache_l0_l1_load_gbps"] is None


def test_real_lmcache_scrapes_between_two_replays() -> None:
    # Before: after the first replica's replay; after: once the second replica replayed the same users.
    before = _scrape("metrics-fs_native-after-replay.txt", "lmcache", 100.0, "before")
    f = _real(before, "metrics-fs_native-after-l2-loads.txt")
    assert f["lmcache_lookup_requested_tokens"] == 589312.0 - 294656.0
    assert f["lmcache_lookup_hit_tokens"] == 550400.0 - 260352.0
    assert f["lmcache_l1_hit_tokens"] == 516864.0 - 260352.0
    assert f["lmcache_l2_hit_tokens"] == 33536.0
    assert f["lmcache_l1_evicted_chunks"] == 189.0 - 32.0
    assert f["lmcache_l2_stored_chunks"] == 115.0 - 97.0
    assert f["lmcache_l2_loaded_chunks"] == 131.0  # first seen after the before snapshot: from 0
    assert f["lmcache_l2_prefetch_failed_chunks"] == 17.0
    assert f["lmcache_eviction_loop_ticks"] == 110.0 - 61.0
    assert f["lmcache_l2_store_gbps"] == pytest.approx((14.83690590299792 - 14.741096245645533) / (43 - 42))


def test_a_tier_without_lmcache_has_no_lmcache_figure() -> None:
    samples = pd.DataFrame(
        {"ts": [1.0], "target": ["vllm-0"], "name": ["vllm:prefix_cache_hits_total"], "labels": ["{}"],
         "value": [3.0], "phase": ["after"]}
    )  # fmt: skip
    f = lmcache_figures(samples)
    assert f["lmcache_l1_evicted_chunks"] is None and f["lmcache_l2_stored_chunks"] is None


def _gpu_server_rows(with_store_histogram: bool) -> list[Row]:
    """A scraped CUDA-mode server that stored through the GPU path and loaded nothing in the cell."""
    rows: list[Row] = [("run", t, "lmcache", "lmcache_mp_l1_memory_usage_bytes", {}, 1e6) for t in TIMES]
    if with_store_histogram:
        base = "lmcache_mp_l0_l1_store_throughput_GB_per_second"
        rows += [
            ("before", -1, "lmcache", f"{base}_sum", {}, 0.0),
            ("before", -1, "lmcache", f"{base}_count", {}, 0.0),
            ("after", 61, "lmcache", f"{base}_sum", {}, 40.0),
            ("after", 61, "lmcache", f"{base}_count", {}, 2.0),
        ]
    return rows


def test_chunks_loaded_is_zero_where_the_gpu_path_is_proven_and_none_elsewhere() -> None:
    gpu = lmcache_figures(samples_frame(_gpu_server_rows(with_store_histogram=True)))
    # Stores went through the GPU path (its store histogram is there): no loads counted means none.
    assert gpu["lmcache_chunks_loaded"] == 0.0
    assert gpu["lmcache_l0_l1_store_gbps"] == pytest.approx(20.0)
    assert gpu["lmcache_l0_l1_load_gbps"] is None  # a mean of no transfer stays unknown
    # The same server without any GPU-path family: a CPU-mode server, so not measured.
    cpu = lmcache_figures(samples_frame(_gpu_server_rows(with_store_histogram=False)))
    assert cpu["lmcache_chunks_loaded"] is None


def _scraped_server(*extra: str) -> pd.DataFrame:
    """A scraped lmcache-server (usage gauge present) with L1 evictions and the given extra counters."""
    rows: list[Row] = [("run", t, "lmcache", "lmcache_mp_l1_memory_usage_bytes", {}, 1e9) for t in TIMES]
    rows += counter("lmcache_mp_l1_evicted_chunks_total", lambda t: 2 * t, TIMES, "lmcache")
    for name in extra:
        rows += counter(name, lambda t: 0.0, TIMES, "lmcache")
    return samples_frame(rows)


def test_an_absent_counter_is_0_only_on_a_server_with_known_names() -> None:
    # LMCache 0.5.6 creates lmcache_mp_l2_evicted_objects_chunks_total at the first L2 eviction: absent
    # on a server whose names are all 0.5.6's means none happened.
    with collect_notes() as notes:
        f = lmcache_figures(_scraped_server())
    assert f["lmcache_l2_evicted_chunks"] == 0.0 and f["lmcache_evicted_chunks"] == pytest.approx(120.0)
    assert "counter_renamed" not in [n.kind for n in notes]
    # A server exporting a name 0.5.6 does not (a stale or renamed L2 eviction counter): the absent
    # 0.5.6 name is unknown, not 0, and so is the total; one note names the unknown name.
    with collect_notes() as notes:
        f = lmcache_figures(_scraped_server("lmcache_mp_l2_evicted_chunks_total"))
    assert f["lmcache_l2_evicted_chunks"] is None and f["lmcache_evicted_chunks"] is None
    assert f["lmcache_l1_evicted_chunks"] == pytest.approx(120.0)  # present: counted as ever
    renamed = [n for n in notes if n.kind == "counter_renamed"]
    assert len(renamed) == 1 and "lmcache_mp_l2_evicted_chunks_total" in renamed[0].message


def test_the_known_names_are_the_capture_plus_the_names_it_cannot_show() -> None:
    listed = {line.split()[0] for line in (LMCACHE / "metric-names-types.txt").read_text().splitlines()}
    lane = set((LMCACHE / "metric-names-real-engine-lane.txt").read_text().split())
    assert listed | lane | set(N.LMC_NOT_SEEN_ON_CPU) == N.LMC_KNOWN_NAMES
    assert not listed & set(N.LMC_NOT_SEEN_ON_CPU) and not lane & set(N.LMC_NOT_SEEN_ON_CPU)
    # every family the real server exported on the real-engine lane is known (none reads as renamed)
    assert N.lmcache_unknown_names(f"{name}_count" for name in lane) == []
    assert (
        N.lmcache_unknown_names(
            [
                "lmcache_mp_l2_store_throughput_GB_per_second_sum",
                "lmcache_mp_l0_l1_load_throughput_GB_per_second_count",
            ]
        )
        == []
    )


def test_a_cuda_path_server_reads_absent_counters_as_0_without_a_rename_note() -> None:
    # A CUDA-mode 0.5.6 server exports its GPU transfer path's families besides the CPU capture's
    # (lmcache_mp_num_submitted_stores_total, lmcache_mp_transfer_phase_bytes_total, ...). They are
    # 0.5.6's own names, so they prove no rename: the counters that server never created still read 0.
    up = up_sample("lmcache", 100.0, None)
    before = [("before", up.ts, up.target, up.name, up.labels, up.value)]
    rows = [*before, *_scrape(CUDA_PATH, "lmcache", 200.0, "after")]
    frame = relevant(samples_frame(rows))
    assert "lmcache_mp_transfer_phase_elapsed_seconds_total" in set(frame["name"])  # not filtered away
    assert N.lmcache_unknown_names(frame["name"].unique()) == []
    with collect_notes() as notes:
        f = lmcache_figures(frame)
    assert "counter_renamed" not in [n.kind for n in notes]
    # absent on that server (L2 never filled, nothing loaded back from L2): none happened
    assert f["lmcache_l2_evicted_chunks"] == 0.0
    assert f["lmcache_l2_loaded_chunks"] == 0.0
    assert f["lmcache_l2_prefetch_failed_chunks"] == 0.0
    assert f["lmcache_evicted_chunks"] == 32.0  # L1's 32 + L2's 0
    # present: the capture's and the GPU path's own
    assert f["lmcache_l1_evicted_chunks"] == 32.0 and f["lmcache_l2_stored_chunks"] == 97.0
    assert f["lmcache_chunks_loaded"] == 1017.0
    assert f["lmcache_l0_l1_store_gbps"] == pytest.approx(8.0)
    assert f["lmcache_l0_l1_load_gbps"] == pytest.approx(12.0)
    # L1 evicted chunks: the offload tier was exercised (no vLLM figure in this row to tell otherwise)
    assert offload_exercised(pd.Series(f)) is True


def test_l2_loads_that_failed_for_lack_of_l1_room_are_counted_with_their_share() -> None:
    """Issue 53: over the run 64 chunks loaded back from L2, 68 failed with reason l1_oom and 4 with
    not_found: 68 of the 136 loads tried (50 %) had no room in L1."""
    rows: list[Row] = []
    rows += counter("lmcache_mp_l1_memory_usage_bytes", lambda t: 1e6, TIMES, "lmcache")
    rows += counter(
        "lmcache_mp_l2_prefetch_load_completed_chunks_total", lambda t: 64 * t / 60, TIMES, "lmcache"
    )
    for reason, total in (("l1_oom", 68), ("not_found", 4)):
        rows += counter(
            "lmcache_mp_l2_prefetch_failure_chunks_total",
            lambda t, n=total: n * t / 60,
            TIMES,
            "lmcache",
            model_name="m",
            reason=reason,
        )
    f = lmcache_figures(samples_frame(rows))
    assert f["lmcache_l2_prefetch_failed_chunks"] == pytest.approx(72.0)
    assert f["lmcache_l2_prefetch_failed_l1_oom_chunks"] == pytest.approx(68.0)
    assert f["lmcache_l2_prefetch_failed_l1_oom_share"] == pytest.approx(0.5)
    assert f["lmcache_l2_prefetch_l1_oom"] is True


def test_l1_oom_figures_on_the_real_captures() -> None:
    up = up_sample("lmcache", 100.0, None)
    before = [("before", up.ts, up.target, up.name, up.labels, up.value)]
    # the capture's 17 failures are all reason="l1_oom", beside 131 chunks loaded: 17 of 148 tried
    f = _real(before, "metrics-fs_native-after-l2-loads.txt")
    assert f["lmcache_l2_prefetch_failed_l1_oom_chunks"] == 17.0
    assert f["lmcache_l2_prefetch_failed_l1_oom_share"] == pytest.approx(17 / 148)
    assert f["lmcache_l2_prefetch_l1_oom"] is True
    # a server that never created the failure counter failed none; with nothing tried there is no share
    g = lmcache_figures(relevant(samples_frame([*before, *_scrape(CUDA_PATH, "lmcache", 200.0, "after")])))
    assert g["lmcache_l2_prefetch_failed_l1_oom_chunks"] == 0.0
    assert g["lmcache_l2_prefetch_failed_l1_oom_share"] is None
    assert g["lmcache_l2_prefetch_l1_oom"] is False
    # no lmcache-server (the gpu tier): unknown, never False
    assert lmcache_figures(samples_frame([]))["lmcache_l2_prefetch_l1_oom"] is None
