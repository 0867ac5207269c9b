"""The streaming client against a captured real vLLM 0.32 SSE stream served on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from kvoffload.replay.client import ServerAnswer, StreamResult, stream_chat

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures/vllm-0.32-cpu/sse-stream.txt"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _replay_fixture(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(FIXTURE.read_bytes())
    await resp.write_eof()
    return resp


def _stream_from(handler: Handler, payload: dict[str, Any]) -> StreamResult:
    """One stream_chat call against `handler` served by aiohttp on a loopback port."""

    async def scenario() -> StreamResult:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            async with httpx.AsyncClient() as client:
                return await stream_chat(client, url, payload, {}, 10.0)
        finally:
            await runner.cleanup()

    return asyncio.run(scenario())


def test_parses_real_vllm_stream_usage_and_first_token() -> None:
    r = _stream_from(_replay_fixture, {})
    assert r.status == "ok", r.error
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (294, 32, 224)
    assert r.ttft_s is not None and r.latency_s is not None and r.ttft_s <= r.latency_s
    # Schema 3: the answer's id; a server started without --enable-per-request-metrics and not asked
    # for cached_token_stats says nothing more, and the record says nothing either.
    assert r.response_id == "chatcmpl-a4b21731f61ca6a1"
    assert (r.server_queue_s, r.server_ttft_s, r.vllm_cached_tokens, r.lmcache_loaded_tokens) == (None,) * 4


ATTRIBUTION = FIXTURE.parents[1] / "vllm-0.32-cpu-attribution"


def test_a_real_stream_with_per_request_metrics_and_stats_asked() -> None:
    """vLLM 0.32 with --enable-per-request-metrics and LMCacheMPConnector, asked for cached_token_stats:
    its own queue time and TTFT on the usage chunk; no kv_transfer_params in any chunk of a stream."""
    raw = (ATTRIBUTION / "stream-after-gpu-reset-u0.sse.txt").read_bytes()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(raw)
        await resp.write_eof()
        return resp

    r = _stream_from(handler, {})
    assert r.status == "ok" and r.response_id == "chatcmpl-9377ee6a4809fdfc"
    assert r.server_queue_s == pytest.approx(0.02152516400019522)
    assert r.server_ttft_s == pytest.approx(0.02283040600013919)
    assert (r.prompt_tokens, r.cached_tokens) == (2013, 1792)
    assert (r.vllm_cached_tokens, r.lmcache_cached_tokens, r.lmcache_loaded_tokens) == (None, None, None)


def test_a_whole_answer_carries_the_stats() -> None:
    answer = ServerAnswer()
    answer.read((ATTRIBUTION / "nonstream-stats.json").read_bytes())
    fields = answer.fields()
    assert fields["response_id"] == "chatcmpl-9c3320f50ecc62a8"
    stats = [fields[k] for k in ("vllm_cached_tokens", "lmcache_cached_tokens", "lmcache_loaded_tokens")]
    assert stats == [1664, 1536, 0]


def test_request_body_is_sent_chunked() -> None:
    """No Content-Length: behind Caddy 2.6.2 such a body can lose its whole stream (docs/contracts.md)."""
    seen: dict[str, object] = {}
    payload = {"model": "m", "messages": [{"role": "user", "content": "x" * 50_000}]}

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.update(te=request.headers.get("Transfer-Encoding"), cl=request.headers.get("Content-Length"))
        seen["body"] = await request.json()
        return await _replay_fixture(request)

    r = _stream_from(handler, payload)
    assert r.status == "ok", r.error
    assert seen == {"te": "chunked", "cl": None, "body": payload}


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

    async def scenario() -> tuple[list[StreamResult], float]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        try:
            # One connection at most: a pool left waiting by the abandoned drain would hang the second.
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1)) as client:
                t0 = time.monotonic()
                first = await stream_chat(client, url, {}, {}, 10.0)
                second = await asyncio.wait_for(stream_chat(client, url, {}, {}, 10.0), 5.0)
                return [first, second], time.monotonic() - t0
        finally:
            await runner.cleanup()

    results, elapsed = asyncio.run(scenario())
    for r in results:
        assert r.status == "ok", r.error
        assert r.completion_tokens == 32
        assert r.latency_s is not None and r.latency_s < 0.2  # ends at [DONE], not after the drain
    assert elapsed < 3.0


def test_abandoned_drains_never_leave_the_pool_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain given no time at all is abandoned on every request; later requests still get through."""
    import kvoffload.replay.client as client_module
    from tests.support.procs import sse_server

    monkeypatch.setattr(client_module, "DRAIN_S", 0.0)

    async def scenario(url: str) -> list[StreamResult]:
        out: list[StreamResult] = []
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=4)) as client:

            async def slot() -> None:
                for _ in range(10):
                    out.append(await stream_chat(client, f"{url}/v1/chat/completions", {}, {}, 10.0))

            await asyncio.wait_for(asyncio.gather(*(slot() for _ in range(4))), 20.0)
        return out

    with sse_server("--ttft", "0.002", "--itl", "0.001", "--tokens", "3") as url:
        results = asyncio.run(scenario(url))
    assert len(results) == 40
    assert all(r.status == "ok" for r in results), {r.error for r in results}


def test_a_usage_count_that_is_not_a_number_is_recorded_as_unknown() -> None:
    """The record model types the counts: a broken server's usage must not make the client raise."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n')
        usage = {
            "prompt_tokens": "many",
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": None},
        }
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    r = _stream_from(handler, {})
    assert r.status == "ok", r.error
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (None, 1, None)
