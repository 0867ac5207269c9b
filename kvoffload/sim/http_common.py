"""What the simulator's two HTTP servers share: FastAPI-shaped errors, `/metrics`, and how they stop.

Sits below `kvoffload.sim.engine_server` (vLLM's OpenAI-compatible API) and
`kvoffload.sim.cache_server` (LMCache's HTTP API and the engine protocol). Both real servers are
FastAPI applications, so an unknown path or method answers `{"detail": "Not Found"}` (404) or
`{"detail": "Method Not Allowed"}` (405), and a request that fails validation answers 422 with
`{"detail": [{"type", "loc", "msg", "input"}]}`; both expose prometheus text on `GET /metrics`. Both
stop on SIGTERM/SIGINT within about a second: in-flight requests get `SHUTDOWN_GRACE_S`, not
aiohttp's 60 s, which held the process past systemd's stop timeout. Only aiohttp plumbing lives here:
each server keeps its own routes, bodies and start-up.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

# On SIGTERM, in-flight requests get this long to finish, then their handlers are cancelled (twice this
# at most, in aiohttp's two shutdown phases); the process then exits well within systemd's stop timeout.
SHUTDOWN_GRACE_S = 0.25
# Request body limit where engines send whole prompts or chunk-key lists (aiohttp's default is 1 MiB).
LARGE_BODY = 64 * 2**20
# Listen backlog of the ports engines and the replay client open many connections to at once.
BACKLOG = 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def detail_response(status: int, detail: Any) -> web.Response:
    """FastAPI's error body: `{"detail": ...}` with the status."""
    return web.json_response({"detail": detail}, status=status)


def validation_error(loc: list[str | int], msg: str, value: Any, kind: str = "value_error") -> web.Response:
    """A 422 shaped like FastAPI's request validation errors (one error of type `kind`)."""
    return detail_response(422, [{"type": kind, "loc": loc, "msg": msg, "input": value}])


@web.middleware
async def fastapi_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Unknown paths and methods answer as FastAPI does (`{"detail": ...}`), not aiohttp's text."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return detail_response(404, "Not Found")
    except web.HTTPMethodNotAllowed:
        return detail_response(405, "Method Not Allowed")


def metrics_handler(registry: CollectorRegistry) -> Handler:
    """`GET /metrics`: the registry in prometheus text format."""

    async def metrics(_request: web.Request) -> web.StreamResponse:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return metrics


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set `stop` (in any state: the servers exit 0 on either)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


def app_runner(app: web.Application, *, handler_cancellation: bool = False) -> web.AppRunner:
    """A runner that gives in-flight requests `SHUTDOWN_GRACE_S` at shutdown, without an access log."""
    return web.AppRunner(
        app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S, handler_cancellation=handler_cancellation
    )
