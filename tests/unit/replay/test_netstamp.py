"""The kernel-stamped httpcore backend on real loopback sockets: stamps, timeouts, a full streamed request."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator

import httpcore
import httpx
import pytest

from kvoffload.replay import client as client_module
from kvoffload.replay.client import stream_chat
from kvoffload.replay.netstamp import StampedBackend, StampedStream, stamped_client
from tests.support.loopback import free_port
from tests.support.procs import sse_server


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    try:
        yield sock
    finally:
        sock.close()


@contextlib.asynccontextmanager
async def _connected(listener: socket.socket) -> AsyncIterator[tuple[StampedStream, socket.socket]]:
    """A stamped stream connected to `listener`, and the listener's end of it; both closed on the way out."""
    stream = await StampedBackend().connect_tcp("127.0.0.1", listener.getsockname()[1], timeout=5.0)
    peer, _ = listener.accept()
    try:
        yield stream, peer
    finally:
        peer.close()
        await stream.aclose()


@pytest.mark.skipif(sys.platform != "linux", reason="SO_TIMESTAMPNS is Linux's")
def test_read_reports_when_the_kernel_received_the_data(listener: socket.socket) -> None:
    async def scenario() -> None:
        async with _connected(listener) as (stream, peer):
            # The kernel turns receive stamping on for the whole host a moment after the first socket asks
            # for it (deferred work): data sent right away may come unstamped.
            time.sleep(0.05)
            peer.sendall(b"token")
            time.sleep(0.05)  # the data waits in the kernel; a loop busy elsewhere looks just like this
            data = await stream.read(1024, timeout=5.0)
            age = time.perf_counter() - stream.last_rx
            clock, reads, read_age = stream.last_clock, stream.reads, stream.last_read - stream.last_rx
        assert data == b"token"
        # A read-time stamp would give an age of microseconds.
        assert 0.03 < age < 0.5, age
        assert (clock, reads) == ("kernel", 1)
        assert 0.03 < read_age <= age

    asyncio.run(scenario())


def test_last_tx_is_the_send_that_handed_over_the_last_bytes(listener: socket.socket) -> None:
    async def scenario() -> None:
        async with _connected(listener) as (stream, peer):
            t_first = time.perf_counter()
            await stream.write(b"headers", timeout=5.0)
            assert t_first <= stream.last_tx <= time.perf_counter()
            # A write larger than both socket buffers: its last bytes go out only once the peer reads.
            big = b"x" * (32 << 20)
            got = bytearray()

            def drain() -> None:
                time.sleep(0.2)
                while len(got) < len(b"headers") + len(big):
                    got.extend(peer.recv(1 << 20))

            loop = asyncio.get_running_loop()
            reader = loop.run_in_executor(None, drain)
            t_write = time.perf_counter()
            await stream.write(big, timeout=10.0)
            await reader
        assert bytes(got) == b"headers" + big
        # Stamped at the last partial send, after the peer began to read, not when the write began.
        assert stream.last_tx - t_write >= 0.15, stream.last_tx - t_write

    asyncio.run(scenario())


def test_read_timeout_and_eof(listener: socket.socket) -> None:
    async def scenario() -> None:
        async with _connected(listener) as (stream, peer):
            t0 = time.perf_counter()
            with pytest.raises(httpcore.ReadTimeout):
                await stream.read(1024, timeout=0.05)
            assert time.perf_counter() - t0 < 1.0
            assert stream.get_extra_info("is_readable") is False
            peer.close()
            assert await stream.read(1024, timeout=5.0) == b""
            await stream.aclose()  # and again on the way out: closing is idempotent

    asyncio.run(scenario())


def test_connect_to_a_closed_port_is_a_connect_error() -> None:
    port = free_port()  # nothing listens there now

    async def scenario() -> None:
        with pytest.raises(httpcore.ConnectError):
            await StampedBackend().connect_tcp("127.0.0.1", port, timeout=5.0)

    asyncio.run(scenario())


def test_stamped_client_streams_and_times_the_first_token(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)

    async def scenario(url: str) -> None:
        limits = httpx.Limits(max_connections=4)
        async with stamped_client(limits=limits, timeout=httpx.Timeout(10.0)) as client:
            async with client.stream("POST", f"{url}/v1/chat/completions", json={"max_tokens": 1}) as resp:
                assert isinstance(resp.extensions["network_stream"], StampedStream)
                await resp.aread()
            rid = "stamped-1"
            r = await stream_chat(
                client, f"{url}/v1/chat/completions", {"max_tokens": 3}, {"x-request-id": rid}, 10.0
            )
            achieved = (await client.get(f"{url}/timings")).json()[rid]
        assert r.status == "ok", r.error
        assert r.completion_tokens == 3
        assert r.ttft_s is not None and r.latency_s is not None and r.ttft_s <= r.latency_s
        # The server writes no token before its injected 0.1 s, counted from the request's arrival
        # (after our clock started), and stamps `achieved` after the write: a loaded server may stamp
        # milliseconds after the client already read the token, so the lower bound is the injected
        # delay, the upper one the server's stamp plus the loop's lateness.
        assert achieved >= 0.1
        assert 0.1 - 0.001 <= r.ttft_s < achieved + 0.05, (r.ttft_s, achieved)

    with sse_server("--ttft", "0.1", "--itl", "0.01", "--tokens", "3") as url:
        asyncio.run(scenario(url))


def test_a_client_pause_between_headers_and_body_is_not_ttft(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock starts when the request's last bytes went out, not when its headers did."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)

    async def paused(body: bytes) -> AsyncIterator[bytes]:
        await asyncio.sleep(0.3)  # the client's own delay (a loop busy elsewhere, a collection)
        yield body

    monkeypatch.setattr(client_module, "_chunked", paused)

    async def scenario(url: str) -> None:
        limits = httpx.Limits(max_connections=4)
        async with stamped_client(limits=limits, timeout=httpx.Timeout(10.0)) as client:
            r = await stream_chat(client, f"{url}/v1/chat/completions", {"max_tokens": 2}, {}, 10.0)
        assert r.status == "ok", r.error
        assert r.ttft_clock == "kernel"
        # The server answers 0.1 s after the body is in; timed from the headers, the client would measure
        # the 0.3 s pause on top.
        assert r.ttft_s is not None and r.ttft_s < 0.25, r.ttft_s

    with sse_server("--ttft", "0.1", "--itl", "0.01", "--tokens", "2") as url:
        asyncio.run(scenario(url))
