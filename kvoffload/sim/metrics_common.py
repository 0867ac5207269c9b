"""Histogram buckets as both simulated servers expose them on `/metrics`.

Sits below `kvoffload.sim.engine_metrics` (vLLM's instruments, prometheus-client, with one
hand-made histogram that takes a whole engine step at once) and `kvoffload.sim.cache_metrics`
(LMCache's OpenTelemetry-style instruments, made by hand). Both keep per-bucket counts and a sum and
expose them the prometheus way: cumulative counts per upper bound, the last one `+Inf`, the bound
written as prometheus-client writes it (`0.005`, `10.0`). The instruments themselves, their names
and help texts stay in the two modules: they copy two different servers. No IO.
"""

from __future__ import annotations

import bisect

INF = float("inf")


def le_label(bound: float) -> str:
    """The `le` label of a bucket's upper bound, as prometheus-client formats it."""
    return "+Inf" if bound == INF else repr(float(bound))


class Buckets:
    """Observations counted per explicit upper bound (value <= bound), plus `+Inf`, and their sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """Count `value` `n` times (one call for a whole batch of equal observations)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n

    def cumulative(self) -> list[tuple[str, float]]:
        """(`le` label, observations at or below it) per bucket, `+Inf` last: the total count."""
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, count in zip((*self.bounds, INF), self.counts, strict=True):
            acc += count
            out.append((le_label(bound), float(acc)))
        return out
