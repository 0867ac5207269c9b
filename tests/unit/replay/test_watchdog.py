"""The stall watchdog's clock: only quiet time with requests in flight counts (fake clock, no sleeps)."""

from __future__ import annotations

import asyncio

import pytest

from kvoffload.replay.watchdog import Activity, stall_reason, watch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_quiet_time_counts_only_while_requests_are_in_flight() -> None:
    clock = Clock()
    activity = Activity(clock)
    clock.now += 500  # a long think gap with nothing in flight
    assert activity.quiet_s() == 0.0
    activity.begin()  # the first request after the gap starts the quiet period afresh
    clock.now += 7
    assert activity.quiet_s() == 7
    activity.begin()  # a second request joining does not restart it: the first is still quiet
    clock.now += 3
    assert activity.quiet_s() == 10
    activity.touch()  # a byte on any stream does
    clock.now += 2
    assert activity.quiet_s() == 2
    activity.end()  # so does a request ending (the run is making progress)
    clock.now += 1
    assert (activity.in_flight, activity.quiet_s()) == (1, 1)
    activity.end()
    clock.now += 900
    assert (activity.in_flight, activity.quiet_s()) == (0, 0.0)


def test_watch_reports_a_due_stall_with_its_reason() -> None:
    clock = Clock()
    activity = Activity(clock)
    activity.begin()
    activity.begin()
    clock.now += 301
    seen: list[str] = []
    asyncio.run(asyncio.wait_for(watch(activity, 300.0, seen.append), 10))
    assert seen == [stall_reason(300.0, 2)]
    assert "any of the 2 requests in flight for 300 s" in seen[0]
    assert "the 1 request in flight" in stall_reason(5, 1)


def test_watch_stays_quiet_with_nothing_in_flight() -> None:
    """With the fake clock frozen far past the timeout and nothing in flight, no stall is ever due."""
    clock = Clock()
    activity = Activity(clock)
    clock.now += 10_000
    seen: list[str] = []

    async def scenario() -> None:
        task = asyncio.create_task(watch(activity, 0.01, seen.append))
        await asyncio.sleep(0.2)  # many watch rounds of 0.01 s
        assert not task.done()
        task.cancel()

    asyncio.run(scenario())
    assert seen == []


def test_abort_ends_in_flight_and_later_requests_through_their_deadline() -> None:
    activity = Activity()

    async def request() -> str:
        try:
            async with asyncio.timeout(3600) as deadline:
                activity.begin(deadline)
                try:
                    await asyncio.sleep(3600)
                finally:
                    activity.end(deadline)
        except TimeoutError:
            return str(activity.abort_reason)
        return "not aborted"

    async def scenario() -> list[str]:
        first = asyncio.create_task(request())
        await asyncio.sleep(0)  # let it go in flight
        activity.abort("stalled")
        late = asyncio.create_task(request())  # starts after the abort: ends at once too
        return list(await asyncio.wait_for(asyncio.gather(first, late), 10))

    assert asyncio.run(scenario()) == ["stalled", "stalled"]
    assert activity.in_flight == 0


@pytest.mark.parametrize("in_flight", [1, 4])
def test_stall_reason_names_the_flag_and_the_timeout(in_flight: int) -> None:
    reason = stall_reason(12.5, in_flight)
    assert "--stall-timeout" in reason and "12.5 s" in reason
