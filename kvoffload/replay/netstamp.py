"""Plain-HTTP connections for the replay client that remember when the kernel received each read's data.

The replay client (`replay/client.py`) times the first streamed token. Stamping the chunk when our event
loop gets round to it would add the loop's lateness (other streams, httpx parsing, a busy client host)
to every TTFT; with SO_TIMESTAMPNS the kernel stamps each packet as it arrives, and `StampedStream.read`
keeps that stamp in `last_rx`, converted to the `time.perf_counter()` clock, and says in `last_clock`
which clock it is. Where the option is missing (not Linux), `last_rx` falls back to the moment of the
read (`last_clock` "read"); so does data the kernel left unstamped (Linux turns receive stamping on
host-wide a moment after the first socket asks for it, so the first packets after that may carry none;
the replay's warm-up requests cover that moment).

`StampedTransport` is the httpx transport over those streams, built from public API only: httpcore's
`AsyncHTTPConnection` on our `StampedBackend`, one connection per request in flight. A closed loop needs
no connection pool (each slot has one request in flight at a time), so there is none: a finished
connection goes on a stack of idle ones and the next request takes the most recent one that is still
usable, or opens a new one; nothing is ever queued or re-planned.

This module parses no HTTP (h11, through httpcore, does), does no TLS (https goes through httpx's default
transport, see `stamped_client`) and must not block the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Literal
from urllib.request import getproxies

import httpcore
import httpx

# Linux's SO_TIMESTAMPNS (the stamp comes back as a cmsg of the same type at SOL_SOCKET); Python's socket
# module does not export it. 35 is the generic value (x86_64, aarch64); other values are Linux's too.
SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("ll")  # struct timespec on 64-bit Linux: tv_sec, tv_nsec as native longs
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)

log = logging.getLogger(__name__)

SocketOption = tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]


def enable_rx_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp received data; False where it cannot (reads are then stamped on read)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def recv_stamped(sock: socket.socket, max_bytes: int) -> tuple[bytes, float, float | None]:
    """One non-blocking recvmsg: the data, the moment of the read and when the kernel received the data.

    Both times are on the perf_counter clock; the kernel's is None when the data came unstamped.

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
            return data, now, now - max(0.0, real - (sec + nsec * 1e-9))
    return data, now, None


def _readable(sock: socket.socket) -> bool:
    """Whether a read would return at once (data or EOF), without reading; httpcore's own test."""
    if sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


Clock = Literal["kernel", "read"]


class StampedStream(httpcore.AsyncNetworkStream):
    """A connected non-blocking TCP socket that remembers its last read and its last write.

    `last_rx` is when the kernel received the last read's data (`last_clock` "kernel"), or the moment of
    the read where the data came unstamped ("read"); `last_read` is the moment of the read itself and
    `reads` counts reads that returned data, so a caller can tell whether two chunks came in one read.
    `last_tx` is the moment just before the send call that handed the kernel the last bytes written:
    nothing that can pause (an await, a garbage collection) lies between that stamp and the bytes
    leaving, so a request's clock started there holds none of the client's own delays, as the kernel
    stamp keeps them out of its end.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._closed = False
        self.last_rx = self.last_read = self.last_tx = time.perf_counter()
        self.last_clock: Clock = "read"
        self.reads = 0

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        sock = self._sock
        try:
            while True:
                try:
                    data, self.last_read, kernel = recv_stamped(sock, max_bytes)
                    self.last_rx = kernel if kernel is not None else self.last_read
                    self.last_clock = "kernel" if kernel is not None else "read"
                    self.reads += 1
                    return data
                except BlockingIOError:
                    await self._wait_ready(write=False, timeout=timeout)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc) or "read timed out") from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc

    async def _wait_ready(self, *, write: bool, timeout: float | None) -> None:
        # One-shot reader and writer callbacks rather than loop.sock_recv and sock_sendall: the asyncio
        # and uvloop sock_* helpers call recv(), which cannot return the ancillary data that carries the
        # stamp, and send without telling when the last bytes went.
        if self._closed:
            raise OSError("stream is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        fd = self._sock.fileno()
        (loop.add_writer if write else loop.add_reader)(fd, _wake, fut)
        try:
            if timeout is None:
                await fut
            else:
                async with asyncio.timeout(timeout):
                    await fut
        finally:
            (loop.remove_writer if write else loop.remove_reader)(fd)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        send, clock = self._sock.send, time.perf_counter  # bound first: no allocation between stamp and send
        view = memoryview(buffer)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        stamp = clock()
                        sent = send(view)
                    except BlockingIOError:
                        sent = 0
                    if sent:
                        self.last_tx = stamp
                        view = view[sent:]
                        if not view:
                            return
                    await self._wait_ready(write=True, timeout=None)  # write() holds the timeout
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
    """httpcore's network backend for plain-http connections whose reads carry kernel receive stamps.

    With `stamps=False` the sockets do not ask for stamps, so every read is stamped when it is made (the
    benchmark's ablation, bench/replay_fidelity.py).
    """

    def __init__(self, stamps: bool = True) -> None:
        self.stamps = stamps

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
        if self.stamps:
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


# httpcore's exceptions and the httpx ones (all public) they become, most specific first: the replay
# client catches httpx.HTTPError only.
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextlib.contextmanager
def _httpx_errors(request: httpx.Request) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for core, mapped in _ERRORS:
            if isinstance(exc, core):
                raise mapped(str(exc) or type(exc).__name__, request=request) from exc
        raise


class _Body(httpx.AsyncByteStream):
    """A response body: httpcore's, with httpx's errors; its close hands the connection back."""

    def __init__(
        self,
        response: httpcore.Response,
        request: httpx.Request,
        release: Callable[[], Awaitable[None]],
    ) -> None:
        self._response = response
        self._request = request
        self._release = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpx_errors(self._request):
            async for part in self._response.aiter_stream():
                yield part

    async def aclose(self) -> None:
        try:
            with _httpx_errors(self._request):
                await self._response.aclose()
        finally:
            await self._release()


class StampedTransport(httpx.AsyncBaseTransport):
    """Plain-http requests over `StampedBackend`, one `httpcore.AsyncHTTPConnection` per request in flight.

    A connection whose response has been read to its end (and closed) goes on the idle stack and is
    reused; one the server closed or that sat idle past `keepalive_expiry` is dropped when it is next
    looked at. At most `max_idle` idle connections are kept (None: no limit; the closed loop's
    concurrency bounds them). No limit on connections in flight: the caller's concurrency is the limit.
    `stamps=False`: read-time stamps only (see `StampedBackend`).
    """

    def __init__(
        self, keepalive_expiry: float | None = 5.0, max_idle: int | None = None, stamps: bool = True
    ) -> None:
        self._backend = StampedBackend(stamps)
        self._keepalive_expiry = keepalive_expiry
        self._max_idle = max_idle
        self._idle: list[httpcore.AsyncHTTPConnection] = []  # most recently used last
        self._busy: set[httpcore.AsyncHTTPConnection] = set()

    async def _take(self, origin: httpcore.Origin) -> httpcore.AsyncHTTPConnection:
        """The most recent usable idle connection to `origin`, or a new one; unusable ones are closed."""
        while self._idle:
            conn = self._idle.pop()
            if conn.can_handle_request(origin) and conn.is_available() and not conn.has_expired():
                return conn
            await conn.aclose()
        return httpcore.AsyncHTTPConnection(
            origin, keepalive_expiry=self._keepalive_expiry, network_backend=self._backend
        )

    async def _give_back(self, conn: httpcore.AsyncHTTPConnection) -> None:
        self._busy.discard(conn)
        if conn.is_idle() and (self._max_idle is None or len(self._idle) < self._max_idle):
            self._idle.append(conn)
        else:
            await conn.aclose()  # a response left unread, a server's Connection: close, a full stack

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"StampedTransport serves http:// only, not {url}", request=request
            )
        origin = httpcore.Origin(b"http", url.raw_host, url.port or 80)
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=b"http", host=url.raw_host, port=url.port, target=url.raw_path),
            headers=request.headers.raw,
            content=request.stream,  # an async iterable of bytes
            extensions=request.extensions,
        )
        while True:
            conn = await self._take(origin)
            self._busy.add(conn)
            try:
                with _httpx_errors(request):
                    response = await conn.handle_async_request(core)
            except httpcore.ConnectionNotAvailable:
                # A kept connection that stopped being usable as we took it: another, as httpcore's pool does.
                self._busy.discard(conn)
                await conn.aclose()
                continue
            except BaseException:
                self._busy.discard(conn)
                await conn.aclose()
                raise
            break

        async def release() -> None:
            await self._give_back(conn)

        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_Body(response, request, release),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        conns = [*self._idle, *self._busy]
        self._idle.clear()
        self._busy.clear()
        for conn in conns:
            await conn.aclose()


def stamped_client(*, limits: httpx.Limits, timeout: httpx.Timeout) -> httpx.AsyncClient:
    """An httpx client whose plain-http connections carry kernel receive stamps (`StampedStream`).

    Plain http goes through `StampedTransport` (httpx's request/response mapping, httpcore's HTTP/1.1,
    our sockets; `limits` sets its keep-alive expiry and idle limit); https:// keeps httpx's default
    transport (TLS as usual, TTFT stamped at read time). When the environment names a proxy, the client
    is httpx's default one, so the proxy is honoured as before, and TTFT falls back to read-time stamps:
    that fallback is logged here, and every record says which clock stamped it (`ttft_clock`).
    """
    if any(scheme != "no" for scheme in getproxies()):
        log.warning(
            "a proxy is configured in the environment: requests go through it, and TTFT is stamped when "
            "the client reads the first token (ttft_clock 'read'), not when the kernel received it"
        )
        return httpx.AsyncClient(limits=limits, timeout=timeout)
    transport = StampedTransport(
        keepalive_expiry=limits.keepalive_expiry, max_idle=limits.max_keepalive_connections
    )
    # transport= (rather than a mount) also keeps httpx from routing NO_PROXY hosts around our transport.
    return httpx.AsyncClient(
        limits=limits,
        timeout=timeout,
        transport=transport,
        mounts={"https://": httpx.AsyncHTTPTransport(limits=limits)},
    )
