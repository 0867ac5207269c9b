"""The streaming client against a captured real vLLM 0.32 SSE stream served on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
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
