"""The streaming client against a captured real vLLM 0.32 SSE stream served on loopback."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from kvoffload.replay.client import stream_chat

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures/vllm-0.32-cpu/sse-stream.txt"


def test_parses_real_vllm_stream_usage_and_first_token() -> None:
    raw = FIXTURE.read_bytes()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(raw)
        await resp.write_eof()
        return resp

    async def scenario() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with httpx.AsyncClient() as client:
                r = await stream_chat(client, f"http://127.0.0.1:{port}/v1/chat/completions", {}, {}, 10.0)
        finally:
            await runner.cleanup()
        assert r.status == "ok", r.error
        assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (294, 32, 224)
        assert r.ttft_s is not None and r.latency_s is not None and r.ttft_s <= r.latency_s

    asyncio.run(scenario())


def test_unreachable_server_is_an_error_record() -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient() as client:
            r = await stream_chat(client, "http://127.0.0.1:9/v1/chat/completions", {}, {}, 5.0)
        assert r.status == "error" and r.ttft_s is None and "Connect" in (r.error or "")

    asyncio.run(scenario())


def test_consecutive_streams_reuse_one_connection() -> None:
    """The body is read past `[DONE]` to its end, so httpcore keeps the connection for the next request."""
    from tests.support.procs import sse_server

    async def scenario(url: str) -> list[list[object]]:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1)) as client:
            for i in range(4):
                r = await stream_chat(
                    client, f"{url}/v1/chat/completions", {"max_tokens": 2}, {"x-request-id": f"r{i}"}, 10.0
                )
                assert r.status == "ok", r.error
            seen = (await client.get(f"{url}/requests")).json()
        return [entry["peer"] for entry in seen]

    with sse_server("--ttft", "0.005", "--itl", "0.001", "--tokens", "2") as url:
        peers = asyncio.run(scenario(url))
    assert len(peers) == 4
    assert len({tuple(p) for p in peers}) == 1, peers  # one client port: one connection


def test_a_stream_left_open_after_done_does_not_hold_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that sends `[DONE]` but never ends the body costs at most DRAIN_S, and the record is ok."""
    import kvoffload.replay.client as client_module

    monkeypatch.setattr(client_module, "DRAIN_S", 0.2)
    raw = FIXTURE.read_bytes()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(raw)
        await asyncio.sleep(30)  # never ends the chunked body
        return resp

    async def scenario() -> tuple[object, float]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with httpx.AsyncClient() as client:
                t0 = time.monotonic()
                r = await stream_chat(client, f"http://127.0.0.1:{port}/v1/chat/completions", {}, {}, 10.0)
                return r, time.monotonic() - t0
        finally:
            await runner.cleanup()

    r, elapsed = asyncio.run(scenario())
    assert r.status == "ok", r.error  # type: ignore[attr-defined]
    assert r.completion_tokens == 32  # type: ignore[attr-defined]
    assert r.latency_s < 0.2  # type: ignore[attr-defined]  # ends at [DONE], not after the drain
    assert elapsed < 2.0
