"""The stamped transport on real loopback servers: reuse, one connection per request in flight, errors,
and the client's report of which clock stamped a TTFT and whether the stamp came late."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from kvoffload.replay.client import stream_chat
from kvoffload.replay.netstamp import StampedStream, StampedTransport, stamped_client
from tests.support.loopback import free_port
from tests.support.procs import sse_server

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="SO_TIMESTAMPNS is Linux's")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """One server for the module: first token at 50 ms, then one every 20 ms."""
    with sse_server("--ttft", "0.05", "--itl", "0.02", "--tokens", "3") as base:
        yield base


def _client() -> httpx.AsyncClient:
    return stamped_client(limits=httpx.Limits(max_keepalive_connections=None), timeout=httpx.Timeout(10.0))


def test_sequential_requests_share_one_connection_concurrent_ones_get_their_own(url: str) -> None:
    async def scenario(url: str) -> tuple[set[int], set[int]]:
        async def once(client: httpx.AsyncClient, i: int) -> int:
            body = {"max_tokens": 2}
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
                stream = resp.extensions["network_stream"]
                assert isinstance(stream, StampedStream)
                text = await resp.aread()
            assert b"tok1" in text and b"[DONE]" in text, i
            return id(stream)

        async with _client() as client:
            sequential = {await once(client, i) for i in range(5)}
            concurrent = set(await asyncio.gather(*(once(client, i) for i in range(6))))
        return sequential, concurrent

    sequential, concurrent = asyncio.run(scenario(url))
    assert len(sequential) == 1  # kept alive and reused
    assert len(concurrent) == 6  # each request in flight on its own connection; nothing waits for one


def test_a_connection_the_server_closed_is_not_reused(url: str) -> None:
    async def scenario(url: str) -> list[int]:
        ids = []
        async with _client() as client:
            for _ in range(3):
                headers = {"connection": "close"}
                async with client.stream("GET", f"{url}/timings", headers=headers) as resp:
                    assert resp.status_code == 200
                    ids.append(id(resp.extensions["network_stream"]))
                    await resp.aread()
        return ids

    ids = asyncio.run(scenario(url))
    assert len(set(ids)) == 3


def test_network_errors_are_httpx_errors() -> None:
    port = free_port()  # nothing listens there now

    async def scenario() -> None:
        async with _client() as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{port}/")
            r = await stream_chat(client, f"http://127.0.0.1:{port}/v1/chat/completions", {}, {}, 5.0)
            assert (r.status, r.ttft_clock, r.late_s) == ("error", "read", None)
            assert r.error is not None and r.error.startswith("ConnectError")
        transport = StampedTransport()
        request = httpx.Request("GET", "https://127.0.0.1:1/")
        with pytest.raises(httpx.UnsupportedProtocol):
            await transport.handle_async_request(request)

    asyncio.run(scenario())


@linux_only
def test_a_prompt_read_is_kernel_stamped_and_not_late(url: str) -> None:
    async def scenario(url: str) -> None:
        async with _client() as client:
            await stream_chat(client, f"{url}/v1/chat/completions", {"max_tokens": 1}, {}, 10.0)  # warm-up
            time.sleep(0.05)  # the kernel turns host-wide stamping on a moment after it is first asked
            r = await stream_chat(client, f"{url}/v1/chat/completions", {"max_tokens": 3}, {}, 10.0)
        assert r.status == "ok", r.error
        assert (r.ttft_clock, r.late_s) == ("kernel", None)

    asyncio.run(scenario(url))


@linux_only
def test_a_loop_later_than_one_token_gap_marks_the_record_late(url: str) -> None:
    """The loop is blocked past the second token: one read takes in both, and the record says so."""

    async def scenario(url: str) -> None:
        async with _client() as client:
            await stream_chat(client, f"{url}/v1/chat/completions", {"max_tokens": 1}, {}, 10.0)  # warm-up
            time.sleep(0.05)

            async def block() -> None:
                await asyncio.sleep(0.02)
                time.sleep(0.3)  # a busy client: the first token (at 50 ms) and the second (70 ms) wait

            blocker = asyncio.create_task(block())
            r = await stream_chat(client, f"{url}/v1/chat/completions", {"max_tokens": 3}, {}, 10.0)
            await blocker
        assert r.status == "ok", r.error
        assert r.ttft_clock == "kernel"
        # The read came ~250 ms after the second token; the stamp is not the read's moment.
        assert r.late_s is not None and 0.1 < r.late_s < 1.0, r.late_s
        assert r.ttft_s is not None and r.ttft_s < 0.2, r.ttft_s

    asyncio.run(scenario(url))
