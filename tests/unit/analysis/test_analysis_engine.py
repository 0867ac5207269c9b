"""vLLM figures: hit rates (windowed, final quarter, fallback), histogram means, KV usage, old names."""

from __future__ import annotations

import pytest

from kvoffload.analysis.engine import engine_figures, engine_series, gauge_stats, histogram_mean, rate_ratio
from kvoffload.analysis.names import VLLM_KV_USAGE, VLLM_PREFILL_TIME, VLLM_PREFIX_HITS, VLLM_PREFIX_QUERIES
from tests.unit.analysis.analysis_frames import counter, samples_frame

LAB = {"engine": "0", "model_name": "m"}
TIMES = [15.0 * i for i in range(9)]  # 0 .. 120 s


def test_hit_rate_is_the_final_quarter_not_the_run_average() -> None:
    # 10 query tokens/s; no hits until t=60, then 8 hit tokens/s.
    rows = counter("vllm:prefix_cache_queries_total", lambda t: 10 * t, TIMES, **LAB)
    rows += counter("vllm:prefix_cache_hits_total", lambda t: 8 * max(0.0, t - 60), TIMES, **LAB)
    s = samples_frame(rows)
    r = rate_ratio(s, VLLM_PREFIX_HITS, VLLM_PREFIX_QUERIES, window_s=30.0)
    # Grid 0..120 (9 points); final quarter = last ceil(9/4) = 3 points (90, 105, 120), whose 30 s
    # windows hold only post-60 s samples: 8/10 each.
    assert r.value == pytest.approx(0.8) and r.source == "samples"
    # The whole-run average would be 480 / 1200 = 0.4: the figure must not be that.
    assert len(r.series) == 9


def test_hit_rate_with_the_default_300_s_window() -> None:
    rows = counter("vllm:prefix_cache_queries_total", lambda t: 10 * t, TIMES, **LAB)
    rows += counter("vllm:prefix_cache_hits_total", lambda t: 8 * max(0.0, t - 60), TIMES, **LAB)
    r = rate_ratio(samples_frame(rows), VLLM_PREFIX_HITS, VLLM_PREFIX_QUERIES)
    # 300 s windows reach back to t=0: at t=90, 105, 120 the ratios are 240/900, 360/1050, 480/1200.
    expected = (240 / 900 + 360 / 1050 + 480 / 1200) / 3
    assert r.value == pytest.approx(expected)


def test_hit_rate_falls_back_to_snapshots_when_the_run_is_shorter_than_a_sample() -> None:
    rows = [
        ("before", 0, "vllm-0", "vllm:prefix_cache_queries_total", LAB, 1000.0),
        ("before", 0, "vllm-0", "vllm:prefix_cache_hits_total", LAB, 100.0),
        ("run", 5, "vllm-0", "vllm:prefix_cache_queries_total", LAB, 1200.0),
        ("run", 5, "vllm-0", "vllm:prefix_cache_hits_total", LAB, 200.0),
        ("after", 10, "vllm-0", "vllm:prefix_cache_queries_total", LAB, 1600.0),
        ("after", 10, "vllm-0", "vllm:prefix_cache_hits_total", LAB, 400.0),
    ]
    r = rate_ratio(samples_frame(rows), VLLM_PREFIX_HITS, VLLM_PREFIX_QUERIES)
    assert r.value == pytest.approx(300 / 600) and r.source == "snapshots"


def test_old_vllm_names_are_accepted_and_new_ones_win() -> None:
    old = counter("vllm:gpu_prefix_cache_queries_total", lambda t: 10 * t, TIMES, **LAB)
    old += counter("vllm:gpu_prefix_cache_hits_total", lambda t: 2 * t, TIMES, **LAB)
    old += [("run", t, "vllm-0", "vllm:gpu_cache_usage_perc", LAB, 0.5) for t in TIMES]
    f = engine_figures(samples_frame(old))
    assert f["local_hit_rate"] == pytest.approx(0.2)
    assert f["kv_usage_mean_pct"] == pytest.approx(50.0)
    new = counter("vllm:prefix_cache_queries_total", lambda t: 10 * t, TIMES, **LAB)
    new += counter("vllm:prefix_cache_hits_total", lambda t: 7 * t, TIMES, **LAB)
    both = engine_figures(samples_frame(old + new))
    assert both["local_hit_rate"] == pytest.approx(0.7)  # not (2+7)/(10+10)


def test_histogram_mean_from_before_after_and_unit_suffix_variants() -> None:
    for base in ("vllm:request_prefill_time_seconds", "vllm:request_prefill_time"):
        rows = [
            ("before", 0, "vllm-0", f"{base}_sum", LAB, 1.0),
            ("before", 0, "vllm-0", f"{base}_count", LAB, 10.0),
            ("after", 60, "vllm-0", f"{base}_sum", LAB, 4.0),
            ("after", 60, "vllm-0", f"{base}_count", LAB, 25.0),
        ]
        assert histogram_mean(samples_frame(rows), VLLM_PREFILL_TIME) == pytest.approx(3.0 / 15.0)
    idle = [
        ("before", 0, "vllm-0", "vllm:request_prefill_time_seconds_sum", LAB, 1.0),
        ("before", 0, "vllm-0", "vllm:request_prefill_time_seconds_count", LAB, 10.0),
        ("after", 60, "vllm-0", "vllm:request_prefill_time_seconds_sum", LAB, 1.0),
        ("after", 60, "vllm-0", "vllm:request_prefill_time_seconds_count", LAB, 10.0),
    ]
    assert histogram_mean(samples_frame(idle), VLLM_PREFILL_TIME) is None  # no request: null, not 0
    assert histogram_mean(samples_frame([]), VLLM_PREFILL_TIME) is None  # absent: null


def test_kv_usage_mean_and_max_with_snapshot_fallback() -> None:
    run = [
        ("run", t, "vllm-0", "vllm:kv_cache_usage_perc", LAB, v) for t, v in ((0, 0.2), (15, 0.4), (30, 0.9))
    ]
    g = gauge_stats(samples_frame(run), VLLM_KV_USAGE, scale=100.0)
    assert g["mean"] == pytest.approx(50.0) and g["max"] == pytest.approx(90.0) and g["source"] == "samples"
    snaps = [
        ("before", 0, "vllm-0", "vllm:kv_cache_usage_perc", LAB, 0.0),
        ("after", 9, "vllm-0", "vllm:kv_cache_usage_perc", LAB, 0.6),
    ]
    g = gauge_stats(samples_frame(snaps), VLLM_KV_USAGE, scale=100.0)
    assert g["mean"] == pytest.approx(30.0) and g["source"] == "snapshots"


def test_external_hit_rate_and_preemptions_over_two_replicas() -> None:
    rows = []
    for target, ext_hits_per_s in (("vllm-0", 3.0), ("vllm-1", 1.0)):
        rows += counter("vllm:external_prefix_cache_queries_total", lambda t: 10 * t, TIMES, target, **LAB)
        rows += counter(
            "vllm:external_prefix_cache_hits_total", lambda t, r=ext_hits_per_s: r * t, TIMES, target, **LAB
        )
        rows += counter("vllm:num_preemptions_total", lambda t: t // 60, TIMES, target, **LAB)
    f = engine_figures(samples_frame(rows))
    # sum(rate(hits)) / sum(rate(queries)) = (3 + 1) / (10 + 10).
    assert f["external_hit_rate"] == pytest.approx(0.2)
    assert f["external_hit_tokens"] == pytest.approx(4.0 * 120)
    assert f["preemptions"] == 4.0  # 0 -> 2 on each replica
    assert f["local_hit_rate"] is None and f["prefill_mean_s"] is None


# Issue 43, defect 10: a demo cell replays for 14 s and its sampler runs every 2 s.
FAST = [2.0 * i for i in range(8)]  # 0 .. 14 s


def test_a_short_replay_sampled_every_2_s_has_a_hit_rate_series() -> None:
    # 10 query tokens/s; no hits until t=6, then 8 hit tokens/s.
    rows = counter("vllm:prefix_cache_queries_total", lambda t: 10 * t, FAST, **LAB)
    rows += counter("vllm:prefix_cache_hits_total", lambda t: 8 * max(0.0, t - 6), FAST, **LAB)
    r = rate_ratio(samples_frame(rows), VLLM_PREFIX_HITS, VLLM_PREFIX_QUERIES)
    # The grid steps at the sampler's 2 s (not 15 s, which left one point, t=0, with one round in its
    # window: no rate, an empty plot). The 300 s windows reach back to t=0: the ratio at t is
    # 8 (t - 6) / 10 t; at t=2 and 4 no hit yet. The final quarter is ceil(8/4) = 2 points, t=12 and 14.
    assert r.source == "samples" and r.series.index.tolist() == FAST
    assert int(r.series.notna().sum()) == 7  # every grid point but t=0
    assert r.series[12.0] == pytest.approx(48 / 120) and r.series[14.0] == pytest.approx(64 / 140)
    assert r.value == pytest.approx((48 / 120 + 64 / 140) / 2)
    series = engine_series(samples_frame(rows))
    assert series["local_hit_rate"].notna().sum() == 7  # what the plot draws


def test_the_kv_usage_plot_peaks_at_the_tables_max() -> None:
    # Two replicas sampled every 2 s: vllm-0 fills up to 86.1 % at t=8, vllm-1 stays at 10 %; the
    # replay window is (1, 13]. A mean over replicas (or over 15 s of rounds) peaked far lower.
    fill = {0.0: 0.05, 2.0: 0.2, 4.0: 0.5, 6.0: 0.7, 8.0: 0.861, 10.0: 0.6, 12.0: 0.3, 14.0: 0.95}
    rows = [("run", t, "vllm-0", "vllm:kv_cache_usage_perc", LAB, v) for t, v in fill.items()]
    rows += [("run", t, "vllm-1", "vllm:kv_cache_usage_perc", LAB, 0.1) for t in fill]
    s = samples_frame(rows)
    window = (1.0, 13.0)
    table = engine_figures(s, window)
    series = engine_series(s, window)
    assert table["kv_usage_max_pct"] == pytest.approx(86.1)
    assert series["kv_usage_max_pct"].max() == pytest.approx(table["kv_usage_max_pct"])
    # one point per 2 s round inside the window, each the fullest replica's
    kv = series.dropna(subset=["kv_usage_max_pct"]).set_index("t_s")["kv_usage_max_pct"]
    assert kv.index.tolist() == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    assert kv[4.0] == pytest.approx(50.0) and kv[12.0] == pytest.approx(30.0)
