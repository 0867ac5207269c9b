"""How the package's long-running async programs start their event loop.

The replay client and both simulator servers time things to a fraction of a millisecond, so they run
on uvloop where it is installed (less per-callback overhead, so fewer late wake-ups) and on asyncio's
own loop otherwise. Nothing here knows what the coroutine does.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on uvloop when importable, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def until_signal(work: Callable[[], Coroutine[Any, Any, T]], stop: Callable[[], None]) -> T:
    """Await `work()` with SIGINT and SIGTERM calling `stop` (which should make the work end soon)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    return await work()
