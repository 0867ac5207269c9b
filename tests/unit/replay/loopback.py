"""Loopback servers and small datasets for the replay tests (no subprocess).

The server is tests/support/sse_server.py's app (known timing, injected failures; a huge `ttft` makes a
server that answers the role chunk and then hangs), served in the test's own event loop for runner
tests, or on a thread with a loop of its own for CLI tests, whose command runs its own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from aiohttp import web

from kvoffload.datasets import Call, VirtualUser
from tests.support.sse_server import make_app

HANG_S = 3600.0  # a first token this late never comes within a test


def sse_app(
    ttft: float = 0.001, itl: float = 0.001, tokens: int = 4, fail_user: str | None = None
) -> web.Application:
    return make_app(ttft, itl, tokens, None, fail_user)


async def _start(app: web.Application) -> tuple[web.AppRunner, str]:
    # A short shutdown: a hanging handler is cancelled at cleanup instead of being waited for.
    runner = web.AppRunner(app, shutdown_timeout=0.1, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` in the running loop; yield its base URL."""
    runner, url = await _start(app)
    try:
        yield url
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def serving_in_thread(app_factory: Callable[[], web.Application]) -> Iterator[str]:
    """Serve the app `app_factory` builds on a thread of its own; yield its base URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[web.AppRunner, str]:
        return await _start(app_factory())

    runner, url = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield url
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def users(count: int, rounds: int, pre_gap: float = 0.0) -> tuple[VirtualUser, ...]:
    """`count` virtual users s<i>:0 of `rounds` calls each, every call after a `pre_gap` think time."""
    out = []
    for i in range(count):
        calls = tuple(
            Call(
                session_id=f"s{i}",
                index=r,
                messages=({"role": "user", "content": f"s{i} question {r}"},),
                output_length=2,
                pre_gap=pre_gap,
            )
            for r in range(rounds)
        )
        out.append(VirtualUser(user_id=f"s{i}:0", session_id=f"s{i}", chunk=0, calls=calls))
    return tuple(out)


def generic_dataset(path: Path, sessions: int = 3, calls: int = 6) -> Path:
    """A generic-loader JSONL file: `sessions` conversations of `calls` calls each (users s<i>:0...)."""
    with path.open("w") as fh:
        for s in range(sessions):
            msgs: list[dict[str, str]] = [{"role": "system", "content": f"session {s}"}]
            for c in range(calls):
                msgs = [*msgs, {"role": "user", "content": f"s{s} question {c}"}]
                fh.write(json.dumps({"session_id": f"s{s}", "messages": msgs, "output_length": 2}) + "\n")
                msgs = [*msgs, {"role": "assistant", "content": f"answer {c}"}]
    return path


def records(folder: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]


def sessions(folder: Path) -> dict[str, object]:
    counts: dict[str, object] = json.loads((folder / "sessions.json").read_text())
    return counts
