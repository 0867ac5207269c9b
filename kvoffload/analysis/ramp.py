"""Find a tier's knee by ramping concurrency: the pure decision of what to run next.

Given the cells measured so far for one tier and comparison group (their later-round p95 TTFT and
later-round hit rate, e.g. summary columns `ttft_later_p95_s` and `later_round_cached_share`) and the
limits the campaign sets, `next_step` says which concurrency to try next, or that the knee is
bracketed (between the largest passing and the smallest breaching concurrency, no wider than the
resolution), or that it was not reached up to the campaign's maximum, or that even concurrency 1
breaches. A point breaches when its later-round p95 TTFT is above the SLO or its later-round hit rate
is below the threshold (whichever limits are set). Growth is geometric (x `factor`) until the first
breach, then bisection between the bracket's ends. No IO: the orchestrator runs the cells and calls
this again with the new summaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Action = Literal["try", "bracketed", "not_reached", "below_minimum", "blocked"]


@dataclass(frozen=True)
class RampPoint:
    """One measured cell of the ramp."""

    concurrency: int
    later_p95_ttft_s: float | None
    later_hit_rate: float | None


@dataclass(frozen=True)
class RampPolicy:
    """Limits of the ramp; at least one of `slo_p95_s` and `min_hit_rate` must be set."""

    start: int = 8
    max_concurrency: int = 1024
    factor: float = 2.0
    slo_p95_s: float | None = None
    min_hit_rate: float | None = None
    # Stop bisecting when the bracket is at most this wide (high - low, in concurrency).
    resolution: int = 1

    def __post_init__(self) -> None:
        if self.slo_p95_s is None and self.min_hit_rate is None:
            raise ValueError("RampPolicy: set slo_p95_s, min_hit_rate or both")
        if not 1 <= self.start <= self.max_concurrency:
            raise ValueError(f"RampPolicy: start {self.start} must be within 1..max_concurrency")
        if self.factor <= 1.0:
            raise ValueError(f"RampPolicy: factor {self.factor} must be above 1")
        if self.resolution < 1:
            raise ValueError(f"RampPolicy: resolution {self.resolution} must be at least 1")


@dataclass(frozen=True)
class RampDecision:
    """What to do next: `next_concurrency` when action is "try"; `bracket` (low passes, high breaches)
    once the knee is bracketed."""

    action: Action
    next_concurrency: int | None
    bracket: tuple[int, int] | None
    reason: str


def breaches(point: RampPoint, policy: RampPolicy) -> bool | None:
    """True when the point crosses a limit, False when it stays within every set limit whose figure is
    known, None when no set limit's figure was measured."""
    judged = []
    if policy.slo_p95_s is not None and point.later_p95_ttft_s is not None:
        judged.append(point.later_p95_ttft_s > policy.slo_p95_s)
    if policy.min_hit_rate is not None and point.later_hit_rate is not None:
        judged.append(point.later_hit_rate < policy.min_hit_rate)
    return any(judged) if judged else None


def _limits(policy: RampPolicy) -> str:
    parts = []
    if policy.slo_p95_s is not None:
        parts.append(f"later-round p95 TTFT <= {policy.slo_p95_s:g} s")
    if policy.min_hit_rate is not None:
        parts.append(f"later-round hit rate >= {100 * policy.min_hit_rate:g} %")
    return " and ".join(parts)


def next_step(points: Sequence[RampPoint], policy: RampPolicy) -> RampDecision:
    """The ramp's next move from the points measured so far (any order; a repeated concurrency counts
    as breaching when any of its measurements does)."""
    verdict: dict[int, bool] = {}
    for p in points:
        b = breaches(p, policy)
        if b is None:
            return RampDecision(
                "blocked",
                None,
                None,
                f"concurrency {p.concurrency}: none of the limits' figures ({_limits(policy)}) was measured",
            )
        verdict[p.concurrency] = verdict.get(p.concurrency, False) or b
    if not verdict:
        return RampDecision("try", policy.start, None, f"nothing measured yet: start at {policy.start}")
    failing = sorted(c for c, b in verdict.items() if b)
    if not failing:
        top = max(verdict)
        if top >= policy.max_concurrency:
            return RampDecision(
                "not_reached",
                None,
                None,
                f"every concurrency up to the maximum {policy.max_concurrency} kept {_limits(policy)}",
            )
        nxt = min(policy.max_concurrency, max(top + 1, math.ceil(top * policy.factor)))
        return RampDecision("try", nxt, None, f"concurrency {top} kept {_limits(policy)}: grow to {nxt}")
    high = failing[0]
    passing = [c for c, b in verdict.items() if not b and c < high]
    if not passing:
        if high == 1:
            return RampDecision(
                "below_minimum", None, None, f"concurrency 1 already breaks {_limits(policy)}"
            )
        # Nothing below `high` was measured (a lower breaching point would be failing[0]).
        nxt = max(1, min(high - 1, math.floor(high / policy.factor)))
        return RampDecision(
            "try",
            nxt,
            None,
            f"the lowest concurrency measured, {high}, breaks {_limits(policy)}: shrink to {nxt}",
        )
    low = max(passing)
    if high - low <= policy.resolution:
        return RampDecision(
            "bracketed",
            None,
            (low, high),
            f"the knee lies between concurrency {low} (within {_limits(policy)}) and {high} (beyond)",
        )
    nxt = (low + high) // 2
    return RampDecision("try", nxt, (low, high), f"bisect the bracket {low}..{high}: try {nxt}")
