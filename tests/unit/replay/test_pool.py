"""The linear connection pool against a real local server: limits, reuse and keep-alive hold under load."""

from __future__ import annotations

import asyncio

import httpcore

from kvoffload.replay.pool import LinearPool
from tests.support.procs import sse_server


def test_pool_queues_reuses_and_trims_connections() -> None:
    async def scenario(url: str) -> None:
        pool = LinearPool(max_connections=3, max_keepalive_connections=2)
        seen: set[int] = set()
        peak = 0

        async def one(i: int) -> bytes:
            nonlocal peak
            body = b'{"max_tokens": 2}'
            headers = [(b"content-type", b"application/json"), (b"x-request-id", f"p{i}".encode())]
            async with pool.stream("POST", f"{url}/v1/chat/completions", headers=headers, content=body) as r:
                peak = max(peak, len(pool.connections))
                stream = r.extensions["network_stream"]
                seen.add(id(stream))
                return b"".join([part async for part in r.aiter_stream()])

        async with pool:
            bodies = await asyncio.gather(*(one(i) for i in range(24)))
            assert all(b"tok1" in b and b"[DONE]" in b for b in bodies)
            assert peak <= 3
            assert len(seen) <= 3  # 24 requests over at most 3 connections: they were reused
            # Once all are back, at most max_keepalive_connections stay open.
            assert len(pool.connections) <= 2
            assert all(c.is_idle() for c in pool.connections)
            # And a later request still gets through on a kept connection.
            resp = await pool.request("GET", f"{url}/timings")
            assert resp.status == 200

    with sse_server("--ttft", "0.02", "--itl", "0.005", "--tokens", "2") as url:
        asyncio.run(scenario(url))


def test_http2_pools_keep_httpcores_own_pass() -> None:
    pool = LinearPool(http2=True)
    assert pool._assign_requests_to_connections() == []
    assert isinstance(pool, httpcore.AsyncConnectionPool)
