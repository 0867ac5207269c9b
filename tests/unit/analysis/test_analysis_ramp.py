"""The ramp's decision function: grow, bisect, bracket, stop."""

from __future__ import annotations

import pytest

from kvoffload.analysis.ramp import RampPoint, RampPolicy, breaches, next_step

SLO = RampPolicy(start=8, max_concurrency=256, slo_p95_s=2.0)


def _p(c: int, p95: float | None, hit: float | None = None) -> RampPoint:
    return RampPoint(concurrency=c, later_p95_ttft_s=p95, later_hit_rate=hit)


def test_starts_then_grows_geometrically() -> None:
    assert next_step([], SLO).next_concurrency == 8
    d = next_step([_p(8, 1.0), _p(16, 1.5)], SLO)
    assert (d.action, d.next_concurrency) == ("try", 32)


def test_bisects_then_brackets() -> None:
    pts = [_p(8, 1.0), _p(16, 1.5), _p(32, 3.0)]
    d = next_step(pts, SLO)
    assert (d.action, d.next_concurrency, d.bracket) == ("try", 24, (16, 32))
    pts += [_p(24, 2.5), _p(20, 1.9), _p(22, 2.1), _p(21, 1.95)]
    d = next_step(pts, SLO)
    assert (d.action, d.bracket) == ("bracketed", (21, 22))
    assert "between concurrency 21" in d.reason


def test_not_reached_at_the_maximum_and_grow_is_capped() -> None:
    assert next_step([_p(200, 1.0)], SLO).next_concurrency == 256
    assert next_step([_p(256, 1.0)], SLO).action == "not_reached"


def test_breach_at_the_start_shrinks_and_at_one_stops() -> None:
    d = next_step([_p(8, 5.0)], SLO)
    assert (d.action, d.next_concurrency) == ("try", 4)
    assert next_step([_p(1, 5.0)], SLO).action == "below_minimum"


def test_hit_rate_threshold_and_either_limit() -> None:
    both = RampPolicy(start=8, max_concurrency=256, slo_p95_s=2.0, min_hit_rate=0.5)
    assert breaches(_p(8, 1.0, 0.4), both) is True
    assert breaches(_p(8, 3.0, 0.9), both) is True
    assert breaches(_p(8, 1.0, 0.9), both) is False
    hit_only = RampPolicy(start=8, max_concurrency=256, min_hit_rate=0.5)
    assert breaches(_p(8, None, 0.6), hit_only) is False
    d = next_step([_p(8, None, None)], hit_only)
    assert d.action == "blocked" and "concurrency 8" in d.reason


def test_a_repeated_concurrency_breaches_when_any_measurement_does() -> None:
    d = next_step([_p(8, 1.0), _p(16, 1.0), _p(16, 2.5)], SLO)
    assert (d.action, d.next_concurrency, d.bracket) == ("try", 12, (8, 16))


def test_policy_needs_a_limit_and_sane_numbers() -> None:
    with pytest.raises(ValueError, match="slo_p95_s, min_hit_rate"):
        RampPolicy()
    with pytest.raises(ValueError, match="factor"):
        RampPolicy(slo_p95_s=1.0, factor=1.0)
    with pytest.raises(ValueError, match="start"):
        RampPolicy(slo_p95_s=1.0, start=0)


def test_a_breach_beyond_the_maximum_brackets_no_knee_above_it() -> None:
    # issue 43, defect 2: the maximum is the load the campaign can produce (32 users); a campaign cell at
    # 64 ran those same 32 sessions. Before, 64 was the bracket's top: try 40 in the bracket (16, 64).
    cap = RampPolicy(start=16, max_concurrency=32, slo_p95_s=2.0)
    d = next_step([_p(16, 1.0), _p(64, 3.0)], cap)
    assert (d.action, d.next_concurrency, d.bracket) == ("try", 32, None)
    assert "concurrency 64 breaks" in d.reason and "beyond the maximum 32: try 32" in d.reason
    # the maximum breaks too: bisection within [16, 32]
    d = next_step([_p(16, 1.0), _p(64, 3.0), _p(32, 2.5)], cap)
    assert (d.action, d.next_concurrency, d.bracket) == ("try", 24, (16, 32))
    # the maximum keeps the limit: no knee within it, censored at 32 (before: bisect 16..64 at 40)
    d = next_step([_p(16, 1.0), _p(64, 3.0), _p(32, 1.5)], cap)
    assert (d.action, d.next_concurrency, d.bracket, d.at_least) == ("not_reached", None, None, 32)
    assert "the breach at concurrency 64, beyond it, brackets no knee below it" in d.reason
    # only a point beyond the maximum, breaching: the maximum next (before: shrink to 64 / 2 = 32 by
    # chance; with factor 4, to 16, below a maximum never measured)
    wide = RampPolicy(start=16, max_concurrency=32, factor=4.0, slo_p95_s=2.0)
    assert next_step([_p(64, 3.0)], wide).next_concurrency == 32
    # a pass beyond the maximum ran the maximum's load: not reached, censored
    d = next_step([_p(16, 1.0), _p(48, 1.5)], cap)
    assert (d.action, d.at_least) == ("not_reached", 32)
