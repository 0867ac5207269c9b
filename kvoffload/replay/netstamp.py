"""Plain-HTTP sockets for the replay client that remember when the kernel received each read's data.

The replay client (`replay/client.py`) times the first streamed token. Stamping the chunk when our event
loop gets round to it would add the loop's lateness (other streams, httpx parsing, a busy client host)
to every TTFT; with SO_TIMESTAMPNS the kernel stamps each packet as it arrives, and `StampedStream.read`
keeps that stamp in `last_rx`, converted to the `time.perf_counter()` clock. Where the option is missing
(not Linux), `last_rx` falls back to the moment of the read; so does data the kernel left unstamped
(Linux turns receive stamping on host-wide a moment after the first socket asks for it, so the first
packets after that may carry none; the replay's warm-up requests cover that moment).

This module is an httpcore network backend and nothing more: it parses no HTTP, does no TLS (https goes
through httpx's default transport, see `stamped_client`) and must not block the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
import struct
import time
from collections.abc import Iterable
from typing import Any
from urllib.request import getproxies

import httpcore
import httpx

from kvoffload.replay.pool import LinearPool

# Linux's SO_TIMESTAMPNS (the stamp comes back as a cmsg of the same type at SOL_SOCKET); Python's socket
# module does not export it. 35 is the generic value (x86_64, aarch64); other values are Linux's too.
SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("ll")  # struct timespec on 64-bit Linux: tv_sec, tv_nsec as native longs
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)

SocketOption = tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]


def enable_rx_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp received data; False where it cannot (reads are then stamped on read)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def recv_stamped(sock: socket.socket, max_bytes: int) -> tuple[bytes, float]:
    """One non-blocking recvmsg: the data and when the kernel received it, on the perf_counter clock.

    The kernel stamp is on the realtime clock; only the packet's age (realtime now minus stamp, a span of
    microseconds to milliseconds) is taken from it and subtracted from perf_counter now, so a clock step
    or NTP slew of the realtime clock does not leak into the measurement. For TCP the stamp is that of
    the last segment this call consumed (the kernel also moves it onto segments coalesced in the queue).
    Raises BlockingIOError when nothing is there, like `sock.recv`.
    """
    data, ancdata, _flags, _addr = sock.recvmsg(max_bytes, _CMSG_SPACE)
    real, now = time.time(), time.perf_counter()
    for level, kind, cdata in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(cdata) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(cdata)
            return data, now - max(0.0, real - (sec + nsec * 1e-9))
    return data, now


def _readable(sock: socket.socket) -> bool:
    """Whether a read would return at once (data or EOF), without reading; httpcore's own test."""
    if sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class StampedStream(httpcore.AsyncNetworkStream):
    """A connected non-blocking TCP socket; `last_rx` is when the kernel received the last read's data."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._closed = False
        self.last_rx = time.perf_counter()

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        sock = self._sock
        try:
            while True:
                try:
                    data, self.last_rx = recv_stamped(sock, max_bytes)
                    return data
                except BlockingIOError:
                    await self._wait_readable(timeout)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc) or "read timed out") from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc

    async def _wait_readable(self, timeout: float | None) -> None:
        # A one-shot reader callback rather than loop.sock_recv: the asyncio and uvloop sock_* helpers
        # call recv(), which cannot return the ancillary data that carries the stamp.
        if self._closed:
            raise OSError("stream is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        fd = self._sock.fileno()
        loop.add_reader(fd, _wake, fut)
        try:
            if timeout is None:
                await fut
            else:
                async with asyncio.timeout(timeout):
                    await fut
        finally:
            loop.remove_reader(fd)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                await loop.sock_sendall(self._sock, buffer)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc) or "write timed out") from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        # stamped_client routes https:// through httpx's default transport; reaching this is a wiring bug.
        raise httpcore.ConnectError("StampedBackend serves plain http only; https goes through httpx's own")

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self._sock
        if info == "is_readable":
            return _readable(self._sock)
        with contextlib.suppress(OSError):
            if info == "client_addr":
                return self._sock.getsockname()
            if info == "server_addr":
                return self._sock.getpeername()
        return None


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class StampedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend for plain-http connections whose reads carry kernel receive stamps."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> StampedStream:
        try:
            async with asyncio.timeout(timeout):
                sock = await _connect(host, port, local_address)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc) or "connect timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
        except OSError as exc:
            sock.close()
            raise httpcore.ConnectError(str(exc)) from exc
        enable_rx_stamps(sock)
        return StampedStream(sock)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise NotImplementedError("StampedBackend connects over TCP only")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def _connect(host: str, port: int, local_address: str | None) -> socket.socket:
    """Connect to the first of host's addresses that answers, as httpcore's anyio backend does."""
    loop = asyncio.get_running_loop()
    try:
        # An IP literal (the usual case for a lab server) needs no resolver thread.
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    last: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _name, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            if local_address is not None:
                sock.bind((local_address, 0))
            await loop.sock_connect(sock, addr)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        # Tokens are small writes that must not wait for Nagle's algorithm (asyncio sets it by default too).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise last


def stamped_client(*, limits: httpx.Limits, timeout: httpx.Timeout) -> httpx.AsyncClient:
    """An httpx client whose plain-http connections carry kernel receive stamps (`StampedStream`).

    The stamped transport is httpx's own AsyncHTTPTransport with its connection pool swapped for one on
    `StampedBackend` (a `pool.LinearPool`, which stays cheap at hundreds of connections), built with the
    same settings: this keeps httpx's request/response mapping and, above
    all, its mapping of httpcore errors to httpx.HTTPError, which a hand-written transport would have to
    copy from httpx's private module. https:// keeps httpx's default transport (no stamps, TLS as usual).
    When the environment names a proxy, the client is httpx's default one, so the proxy is honoured as
    before (TTFT then falls back to read-time stamps).
    """
    if any(scheme != "no" for scheme in getproxies()):
        return httpx.AsyncClient(limits=limits, timeout=timeout)
    transport = httpx.AsyncHTTPTransport(limits=limits)
    transport._pool = LinearPool(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        http1=True,
        http2=False,
        network_backend=StampedBackend(),
    )
    # transport= (rather than a mount) also keeps httpx from routing NO_PROXY hosts around our transport.
    return httpx.AsyncClient(
        limits=limits,
        timeout=timeout,
        transport=transport,
        mounts={"https://": httpx.AsyncHTTPTransport(limits=limits)},
    )
