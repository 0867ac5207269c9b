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

Every step stays within [1, `max_concurrency`], growth and bisection alike: the orchestrator lowers
the maximum to the load the campaign can produce, and a point measured above it (a campaign cell at a
concurrency beyond the users it replays) ran no more load than the maximum. Such a point's breach is
no bracket end: the maximum itself is tried, and when it keeps the limits the ramp ends "not_reached",
censored: the knee is at least the maximum (`RampDecision.at_least`), not between two concurrencies
that produce the same load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from kvoffload.config.slo import LIMIT_WORDS, Judgement, Limit, judge

Action = Literal["try", "bracketed", "not_reached", "below_minimum", "blocked"]


@dataclass(frozen=True)
class RampPoint:
    """One measured cell of the ramp."""

    concurrency: int
    later_p95_ttft_s: float | None
    later_hit_rate: float | None
    # judged only when the campaign's slo sets their limits
    later_p50_ttft_s: float | None = None
    later_p95_tpot_s: float | None = None
    # why the cell's steady window did not hold its load (analysis/steady.py); None: it held
    not_held: str | None = None

    def judged(self, policy: RampPolicy) -> Judgement:
        """This point against the policy's limits, by the one judge (config/slo.py `judge`)."""
        figures = {
            "ttft_p95": self.later_p95_ttft_s,
            "ttft_p50": self.later_p50_ttft_s,
            "tpot_p95": self.later_p95_tpot_s,
            "hit_rate": self.later_hit_rate,
        }
        return judge(policy.limits(), figures, self.not_held)


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
    # the slo's optional limits (kvoffload/config/slo.py): later-round p50 TTFT and p95 TPOT, seconds
    slo_p50_s: float | None = None
    tpot_p95_s: float | None = None

    def limits(self) -> list[Limit]:
        """The limits set, as the one judge (config/slo.py `judge`) takes them."""
        out = []
        for key, value, upper in (
            ("ttft_p95", self.slo_p95_s, True),
            ("ttft_p50", self.slo_p50_s, True),
            ("tpot_p95", self.tpot_p95_s, True),
            ("hit_rate", self.min_hit_rate, False),
        ):
            if value is not None:
                out.append(Limit(key, value, upper, LIMIT_WORDS[key]))
        return out

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
    # "not_reached": every concurrency up to this one kept the limits; the knee, if any, lies above it
    at_least: int | None = None


def breaches(point: RampPoint, policy: RampPolicy) -> bool | None:
    """True when the point misses a limit, False when it meets every set limit, None when it cannot be
    judged (no limit missed, but a set limit's figure is unknown or the load was not held): the one
    judge's answer (config/slo.py `judge`), the decision table's too."""
    meets = point.judged(policy).meets
    return None if meets is None else not meets


def _limits(policy: RampPolicy) -> str:
    parts = []
    if policy.slo_p95_s is not None:
        parts.append(f"later-round p95 TTFT <= {policy.slo_p95_s:g} s")
    if policy.min_hit_rate is not None:
        parts.append(f"later-round hit rate >= {100 * policy.min_hit_rate:g} %")
    if policy.slo_p50_s is not None:
        parts.append(f"later-round p50 TTFT <= {policy.slo_p50_s:g} s")
    if policy.tpot_p95_s is not None:
        parts.append(f"later-round p95 TPOT <= {policy.tpot_p95_s:g} s")
    return " and ".join(parts)


def next_step(points: Sequence[RampPoint], policy: RampPolicy) -> RampDecision:
    """The ramp's next move from the points measured so far (any order; a repeated concurrency counts
    as breaching when any of its measurements does)."""
    verdict: dict[int, bool] = {}
    for p in points:
        b = breaches(p, policy)
        if b is None:
            why = "; ".join(p.judged(policy).unknown)
            return RampDecision(
                "blocked",
                None,
                None,
                f"concurrency {p.concurrency} cannot be judged against {_limits(policy)}: missing {why}",
            )
        verdict[p.concurrency] = verdict.get(p.concurrency, False) or b
    if not verdict:
        return RampDecision("try", policy.start, None, f"nothing measured yet: start at {policy.start}")
    top = policy.max_concurrency
    inside = {c: b for c, b in verdict.items() if c <= top}
    beyond = sorted(c for c, b in verdict.items() if c > top and b)  # breaches beyond the maximum
    failing = sorted(c for c, b in inside.items() if b)
    if not failing:
        if any(not b for c, b in verdict.items() if c >= top):
            # the maximum (or a point beyond it, which ran no more load) kept every limit
            noise = (
                f"; the breach at concurrency {beyond[0]}, beyond it, brackets no knee below it"
                if beyond
                else ""
            )
            return RampDecision(
                "not_reached",
                None,
                None,
                f"every concurrency up to the maximum {top} kept {_limits(policy)}{noise}",
                at_least=top,
            )
        if beyond:
            # only the maximum can say whether the knee lies within it: bisecting towards the breach
            # would measure concurrencies that add no load
            return RampDecision(
                "try",
                top,
                None,
                f"concurrency {beyond[0]} breaks {_limits(policy)} but lies beyond the maximum {top}: "
                f"try {top}",
            )
        highest = max(inside)
        nxt = min(top, max(highest + 1, math.ceil(highest * policy.factor)))
        return RampDecision("try", nxt, None, f"concurrency {highest} kept {_limits(policy)}: grow to {nxt}")
    high = failing[0]
    passing = [c for c, b in inside.items() if not b and c < high]
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


def ramp_paths(measured: Sequence[int], policy: RampPolicy, max_steps: int = 64) -> list[tuple[int, ...]]:
    """The concurrencies a ramp tries after the `measured` ones, for every place the knee could be:
    one path per knee k in 1 .. max_concurrency + 1 under a monotone response (a point breaches when
    min(its concurrency, max_concurrency) >= k: beyond the maximum no load is added), each distinct
    path once, in the order of k. What the knee search can cost at most (the run-time estimate)."""
    rule = replace(policy, slo_p95_s=1.0, min_hit_rate=None)
    top = policy.max_concurrency
    paths: dict[tuple[int, ...], None] = {}
    for knee in range(1, top + 2):

        def point(c: int, knee: int = knee) -> RampPoint:
            return RampPoint(c, 2.0 if min(c, top) >= knee else 0.5, None)

        points = [point(c) for c in measured]
        tried: list[int] = []
        for _ in range(max_steps):
            d = next_step(points, rule)
            nxt = d.next_concurrency
            if d.action != "try" or nxt is None or nxt in tried or nxt in measured:
                break
            tried.append(nxt)
            points.append(point(nxt))
        paths[tuple(tried)] = None
    return list(paths)
