"""The stall watchdog: stops a replay whose in-flight requests have all gone quiet.

`Activity` is shared by every request of one run: `stream_chat` registers each request's deadline
while it is in flight and touches the activity on every chunk it reads, and on the end of a request.
`watch` stops the run (through a callback) once requests are in flight and none of them has received a
byte, or ended, for `timeout_s` seconds. Time with nothing in flight (a recorded think gap, a slot
between users) never counts: the quiet period starts again when a request goes out to an idle client.
Aborting reschedules every in-flight deadline to now, so each stuck request ends through its own
timeout path and is recorded as failed with the reason, instead of being cancelled without a record.
This module does no HTTP and no output.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class Activity:
    """Requests in flight and when the replay last saw progress from any of them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.in_flight = 0
        self.last = clock()
        self.abort_reason: str | None = None
        self._deadlines: set[asyncio.Timeout] = set()

    def begin(self, deadline: asyncio.Timeout | None = None) -> None:
        """A request goes out; `deadline` (its asyncio.timeout) ends it early if the run is aborted."""
        if self.in_flight == 0:
            self.last = self._clock()
        self.in_flight += 1
        if deadline is not None:
            self._deadlines.add(deadline)
            if self.abort_reason is not None:
                deadline.reschedule(asyncio.get_running_loop().time())

    def touch(self) -> None:
        """Bytes arrived on some stream."""
        self.last = self._clock()

    def end(self, deadline: asyncio.Timeout | None = None) -> None:
        """A request ended, whatever its outcome (a finished request is progress too)."""
        self.in_flight -= 1
        self.last = self._clock()
        if deadline is not None:
            self._deadlines.discard(deadline)

    def quiet_s(self) -> float:
        """Seconds without progress while requests were in flight; 0 when none is."""
        return self._clock() - self.last if self.in_flight else 0.0

    def abort(self, reason: str) -> None:
        """End every in-flight request now (and any that starts later), recorded with `reason`."""
        self.abort_reason = reason
        now = asyncio.get_running_loop().time()
        for deadline in list(self._deadlines):
            deadline.reschedule(now)


def stall_reason(timeout_s: float, in_flight: int) -> str:
    which = "the 1 request" if in_flight == 1 else f"any of the {in_flight} requests"
    return (
        f"no byte arrived on {which} in flight for {timeout_s:g} s (--stall-timeout); "
        "the server is stuck or unreachable mid-stream"
    )


async def watch(activity: Activity, timeout_s: float, on_stall: Callable[[str], None]) -> None:
    """Call `on_stall(reason)` once the in-flight requests have been quiet for `timeout_s`, then return.

    Sleeps exactly until the earliest moment a stall could be due: the quiet period only restarts (a
    byte, a request ending, a request leaving an idle client), so no stall is missed in between.
    """
    while True:
        quiet = activity.quiet_s()
        if quiet >= timeout_s:
            on_stall(stall_reason(timeout_s, activity.in_flight))
            return
        await asyncio.sleep(timeout_s - quiet)
