"""Counter arithmetic: reset correction, windowed rate, final-quarter mean, run deltas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvoffload.analysis.series import (
    collect_notes,
    corrected,
    delta,
    final_quarter_mean,
    grid_step,
    make_grid,
    sampler_interval,
    windowed_rate,
)
from tests.unit.analysis.analysis_frames import counter, samples_frame


def test_corrected_removes_a_reset() -> None:
    # 5 -> 8 (+3), reset to 2 (+2 since the reset), -> 4 (+2): 5, 8, 10, 12.
    assert corrected(np.array([5.0, 8.0, 2.0, 4.0])).tolist() == [5.0, 8.0, 10.0, 12.0]


def test_grid_includes_both_ends() -> None:
    assert make_grid(100.0, 160.0, 15.0).tolist() == [100.0, 115.0, 130.0, 145.0, 160.0]
    assert make_grid(100.0, 99.0).tolist() == []


def test_windowed_rate_follows_a_rate_change() -> None:
    # 1 token/s until t=30, then 4/s: values at 0, 15, 30, 45, 60 are 0, 15, 30, 90, 150.
    values = {0: 0.0, 15: 15.0, 30: 30.0, 45: 90.0, 60: 150.0}
    s = samples_frame(counter("c_total", lambda t: values[int(t)], values))
    grid = make_grid(0.0, 60.0, 15.0)
    short = windowed_rate(s, "c_total", grid, window_s=30.0).tolist()
    # Window (t-30, t]: t=0 holds one sample (NaN); t=15 holds 0 and 15 -> 1/s; t=30 holds 15, 30 -> 1/s;
    # t=45 holds 30, 45 -> 60/15 = 4/s; t=60 holds 45, 60 -> 4/s.
    assert short[0] != short[0]  # NaN
    assert short[1:] == [1.0, 1.0, 4.0, 4.0]
    long = windowed_rate(s, "c_total", grid, window_s=300.0).tolist()
    assert long[-1] == pytest.approx(150.0 / 60.0)  # all samples: 150 tokens in 60 s


def test_windowed_rate_sums_series_and_corrects_resets() -> None:
    a = counter("c_total", lambda t: 2.0 * t, [0, 15, 30], engine="0")
    b = counter("c_total", lambda t: {0: 50.0, 15: 65.0, 30: 10.0}[int(t)], [0, 15, 30], engine="1")
    s = samples_frame(a + b)
    # Series b: +15 in the first 15 s, then a reset to 10 counts as +10: over 30 s it rose 25.
    rate = windowed_rate(s, "c_total", np.array([30.0]), window_s=300.0)
    assert rate.iloc[0] == pytest.approx(2.0 + 25.0 / 30.0)


def test_final_quarter_mean_uses_the_last_quarter_ceiling() -> None:
    assert final_quarter_mean(pd.Series([1.0, 2, 3, 4, 5, 6, 7, 8])) == 7.5  # last 2 of 8
    assert final_quarter_mean(pd.Series([1.0, 2, 3, 4, 5])) == 4.5  # ceil(5/4) = 2 -> 4, 5
    assert final_quarter_mean(pd.Series([1.0, 2, 3, np.nan, 5])) == 5.0  # NaN left out
    assert final_quarter_mean(pd.Series([np.nan, np.nan])) is None


def test_delta_prefers_snapshots_and_treats_new_series_as_zero() -> None:
    rows = [
        ("before", 0, "t", "c_total", {"k": "a"}, 10.0),
        ("after", 100, "t", "c_total", {"k": "a"}, 70.0),
        ("after", 100, "t", "c_total", {"k": "b"}, 5.0),  # appeared during the run
        ("run", 10, "t", "c_total", {"k": "a"}, 20.0),
        ("run", 90, "t", "c_total", {"k": "a"}, 60.0),
    ]
    d = delta(samples_frame(rows), "c_total")
    assert d is not None and (d.increase, d.seconds, d.source) == (65.0, 100.0, "snapshots")
    assert d.per_second == 0.65
    run_only = delta(samples_frame([r for r in rows if r[0] == "run"]), "c_total")
    assert run_only is not None and (run_only.increase, run_only.seconds, run_only.source) == (
        40.0,
        80.0,
        "samples",
    )
    assert delta(samples_frame(rows), "absent_total") is None


def test_delta_counts_a_labelled_counter_born_during_the_run() -> None:
    # The before snapshot of `lmcache` holds other metrics but not the labelled counter, which
    # prometheus-client only exposes after its first increment: it started at 0, so the increase is 700.
    samples = samples_frame(
        [
            ("before", 100.0, "lmcache", "lmcache_mp_l1_memory_usage_bytes", {}, 0.0),
            ("after", 130.0, "lmcache", "lmcache_mp_l1_memory_usage_bytes", {}, 5.0),
            ("after", 130.0, "lmcache", "lmcache_mp_lookup_hit_tokens_total", {"model_name": "m"}, 700.0),
        ]
    )
    d = delta(samples, "lmcache_mp_lookup_hit_tokens_total")
    assert d is not None and d.increase == 700.0 and d.seconds == 30.0 and d.source == "snapshots"
    # without any before snapshot of that target there is no baseline: no snapshot figure
    only_after = samples[samples["phase"] == "after"]
    assert delta(only_after, "lmcache_mp_lookup_hit_tokens_total") is None


def test_delta_without_a_targets_before_snapshot_starts_at_its_first_sample() -> None:
    # Two replicas with lifetime totals; vllm-1's before snapshot is missing. Counting vllm-1 from 0
    # would add its lifetime (1000); its first sampler round (1000 at t=10) is the start instead.
    rows = [
        ("before", 0, "vllm-0", "c_total", {}, 500.0),
        ("run", 10, "vllm-0", "c_total", {}, 500.0),
        ("run", 10, "vllm-1", "c_total", {}, 1000.0),
        ("run", 90, "vllm-0", "c_total", {}, 580.0),
        ("run", 90, "vllm-1", "c_total", {}, 1080.0),
        ("after", 100, "vllm-0", "c_total", {}, 590.0),
        ("after", 100, "vllm-1", "c_total", {}, 1090.0),
    ]
    with collect_notes() as notes:
        d = delta(samples_frame(rows), "c_total")
    assert d is not None and d.increase == 180.0 and d.seconds == 100.0
    assert [n.kind for n in notes] == ["before_snapshot_missing"] and "vllm-1" in notes[0].message
    # Without sampler rounds there is no start for vllm-1: null and a warning naming it, not 90 or 1180.
    with collect_notes() as notes:
        assert delta(samples_frame([r for r in rows if r[0] != "run"]), "c_total") is None
    assert [n.kind for n in notes] == ["counter_unknown"] and "vllm-1" in notes[0].message


def test_delta_corrects_a_reset_inside_the_cell_from_the_samples() -> None:
    # 0 -> 600 by t=60, the replica restarts, 0 -> 200 by the after snapshot: 800, not 200 - 0.
    rows = [
        ("before", 0, "vllm-0", "c_total", {}, 0.0),
        ("run", 30, "vllm-0", "c_total", {}, 300.0),
        ("run", 60, "vllm-0", "c_total", {}, 600.0),
        ("run", 75, "vllm-0", "c_total", {}, 50.0),
        ("after", 100, "vllm-0", "c_total", {}, 200.0),
    ]
    with collect_notes() as notes:
        d = delta(samples_frame(rows), "c_total")
    assert d is not None and d.increase == 800.0
    assert [n.kind for n in notes] == ["counter_reset"]
    # seen only in the snapshots (after < before), a reset cannot be corrected: null
    snaps = [("before", 0, "vllm-0", "c_total", {}, 500.0), ("after", 100, "vllm-0", "c_total", {}, 200.0)]
    with collect_notes() as notes:
        assert delta(samples_frame(snaps), "c_total") is None
    assert [n.kind for n in notes] == ["counter_unknown"]


def test_delta_reads_a_series_cut_from_the_before_snapshot_from_the_first_round() -> None:
    # The before-snapshot file was cut short: c_total is missing there but present from the first
    # sampler round (lifetime 5000): the start is that round, not 0.
    rows = [
        ("before", 0, "vllm-0", "other_total", {}, 1.0),
        ("run", 1, "vllm-0", "c_total", {}, 5000.0),
        ("run", 1, "vllm-0", "other_total", {}, 1.0),
        ("after", 100, "vllm-0", "c_total", {}, 5040.0),
    ]
    with collect_notes(before_cut=True) as notes:
        d = delta(samples_frame(rows), "c_total")
    assert d is not None and d.increase == 40.0
    assert [n.kind for n in notes] == ["snapshot_incomplete"]
    # an intact snapshot without the series: it was created during the run and started at 0
    with collect_notes() as notes:
        d = delta(samples_frame(rows), "c_total")
    assert d is not None and d.increase == 5040.0 and notes == []


def test_the_grid_steps_at_the_samplers_interval() -> None:
    """Issue 43: the grid follows the sampler (2 s in the demo), never coarser than 15 s, and 15 s when
    fewer than two rounds say what the interval was. Two targets, each scraped every 2 s at its own
    offset, with a skipped round (an overrun): the median gap is still 2 s."""
    times = [0.0, 2.0, 4.0, 8.0, 10.0]
    times_b = [t + 0.3 for t in times]
    s = samples_frame(
        [*counter("c_total", lambda t: t, times), *counter("c_total", lambda t: t, times_b, "b")]
    )
    assert sampler_interval(s) == pytest.approx(2.0) and grid_step(s) == pytest.approx(2.0)
    slow = samples_frame(counter("c_total", lambda t: t, [0.0, 30.0, 60.0]))
    assert sampler_interval(slow) == pytest.approx(30.0) and grid_step(slow) == 15.0
    once = samples_frame(
        [*counter("c_total", lambda t: t, [5.0]), ("before", 0.0, "vllm-0", "c_total", {}, 0.0)]
    )
    assert sampler_interval(once) is None and grid_step(once) == 15.0
