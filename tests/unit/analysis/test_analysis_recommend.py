"""The recommendation judges each offload tier by its own interval against gpu, and offload tiers
against each other only where their intervals separate (issue 43, defects 1 and 9)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvoffload.analysis.capacity import knees, predict
from kvoffload.analysis.findings import Finding
from kvoffload.analysis.recommend import recommend


def _cell(cell_id: str, tier: str, concurrency: int, p50: float) -> dict[str, Any]:
    return {
        "cell_id": cell_id, "tier": tier, "model": "m", "concurrency": concurrency, "num_rounds": 10,
        "isl": 32768, "osl": "recorded", "repeat": 0, "virtual_users_available": 1000,
        "sessions_replayed": 100, "live_context_mean_tokens": 10000.0, "gpu_cache_tokens": None,
        "later_round_cached_share": 0.9, "ttft_degradation_p50_pct": 10.0, "ttft_later_p50_s": p50,
        "ttft_later_p95_s": 2 * p50, "comparable": True,
    }  # fmt: skip


def _finding(
    tier: str, c: int, change: float, ci: list[float], repeats: int = 1, exercised: bool = True
) -> Finding:
    return Finding(
        group="g", model="m", concurrency=c, num_rounds=10, isl=32768, osl="recorded", tier=tier,
        cells=[], repeats=repeats, comparable=True, not_comparable_reasons=[], caveats=[],
        offload_exercised=exercised, later_p50_s=None, later_p50_ci_s=None, later_p95_s=None,
        later_p95_ci_s=None, p50_change_vs_gpu_pct=change, p50_change_ci_pct=ci, p95_change_vs_gpu_pct=None,
        p95_change_ci_pct=None, sessions=32, gpu_prefix_token_share=None, lmcache_token_share=None,
        lmcache_l1_hit_share=None, lmcache_l2_hit_share=None, routing=None, statement="",
        gpu_repeats=repeats, one_repeat=repeats == 1,
    )  # fmt: skip


def _recommend(p50: dict[str, float], found: list[Finding], c: int = 16) -> Any:
    summary = pd.DataFrame([_cell(f"{t}{c}", t, c, v) for t, v in p50.items()])
    (r,) = recommend(summary, predict(summary), knees(summary), found)
    return r


def test_a_measurably_faster_cpu_is_not_hidden_by_an_nvme_inside_its_noise() -> None:
    """The issue's case at concurrency 16: gpu 1.0 s, cpu 0.6 s (-40 %, CI -50 to -30: below 0), nvme
    0.55 s (-45 %, CI -60 to +2: includes 0). nvme has the lowest p50 but is indistinguishable from gpu;
    cpu is measurably faster: cpu. main tested nvme alone against gpu and recommended gpu."""
    r = _recommend(
        {"gpu": 1.0, "cpu": 0.6, "nvme": 0.55},
        [_finding("cpu", 16, -40.0, [-50.0, -30.0]), _finding("nvme", 16, -45.0, [-60.0, 2.0])],
    )
    assert [s.tier for s in r.segments] == ["cpu"]
    assert r.simpler == [
        "cpu at concurrency 16: nvme is indistinguishable from gpu (-45 %, 95 % CI -60 to +2 %: the "
        "interval includes 0); cpu is measurably faster than gpu (-40 %, 95 % CI -50 to -30 %)"
    ]
    # nvme's verdict is within noise: w = 2 - (-45) = 47 towards 0; at 80 % power n > 1 x 2.0432 x
    # (47 / 45)^2 = 2.23, so 3 (analysis/noise.py; the old 50 % count was 2)
    assert r.within_noise == [
        "nvme at concurrency 16 (-45 %, 95 % CI -60 to +2 %): within noise, about 3 repeats per cell "
        "would separate it"
    ]
    assert r.one_repeat and "rest on one repeat per cell" in r.statement
    assert r.statement.startswith("cpu at the only comparable level")


def test_two_faster_offload_tiers_rank_only_where_their_intervals_separate() -> None:
    """cpu -40 % (CI -50 to -30) and nvme both measurably faster than gpu. nvme -57 % (CI -70 to -45)
    overlaps cpu's interval: indistinguishable from each other, the simpler cpu (main: nvme, the lowest
    p50). nvme -67 % (CI -80 to -55) lies wholly below -50: nvme."""
    p50 = {"gpu": 1.0, "cpu": 0.6, "nvme": 0.43}
    cpu = _finding("cpu", 16, -40.0, [-50.0, -30.0])
    r = _recommend(p50, [cpu, _finding("nvme", 16, -57.0, [-70.0, -45.0])])
    assert [s.tier for s in r.segments] == ["cpu"]
    assert r.simpler == [
        "cpu at concurrency 16: nvme's lead (-57 %, 95 % CI -70 to -45 %) is not separated from cpu's "
        "(-40 %, 95 % CI -50 to -30 %): their intervals overlap, so the two are indistinguishable; cpu is "
        "measurably faster than gpu (-40 %, 95 % CI -50 to -30 %)"
    ]
    assert r.within_noise == []
    r = _recommend({**p50, "nvme": 0.33}, [cpu, _finding("nvme", 16, -67.0, [-80.0, -55.0])])
    assert [s.tier for s in r.segments] == ["nvme"] and r.simpler == []


def test_an_offload_tier_inside_its_noise_is_never_better_and_says_how_many_repeats() -> None:
    """cpu alone, lower p50 but -16 % (CI -39 to +8) over 2 repeats: gpu, and the count that would
    separate it at 80 % power: w = 8 + 16 = 24, n > 2 x 2.0432 x (24 / 16)^2 = 9.19, so 10 repeats per
    cell (analysis/noise.py; the old 50 % count, ceil(4.5), was 5)."""
    r = _recommend({"gpu": 1.0, "cpu": 0.84}, [_finding("cpu", 2, -16.0, [-39.0, 8.0], repeats=2)], c=2)
    assert [s.tier for s in r.segments] == ["gpu"]
    assert r.within_noise == [
        "cpu at concurrency 2 (-16 %, 95 % CI -39 to +8 %): within noise, about 10 repeats per cell would "
        "separate it"
    ]
    assert not r.one_repeat and "one repeat" not in r.statement
    assert "verdicts within noise: cpu at concurrency 2" in r.statement
    assert r.as_dict()["within_noise"] == r.within_noise
