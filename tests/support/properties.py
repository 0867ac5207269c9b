"""The hypothesis settings of the property tests: the same examples on every run (derandomized, no
example database), no deadline (a loaded CI machine is slow, not wrong); only how many examples varies."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def repeatable(max_examples: int) -> settings:
    """Settings for a property test that runs the same `max_examples` examples every time."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
