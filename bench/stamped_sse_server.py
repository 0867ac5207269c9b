"""A lean streaming chat server for bench/replay_fidelity.py that stamps requests with kernel receive times.

It is the bench's independent reference: it shares no code with the replay client (its stamping below
is its own, on SO_TIMESTAMP's microsecond timeval, where the client uses SO_TIMESTAMPNS through
kvoffload/replay/netstamp.py). tests/support/sse_server.py (aiohttp) starts a request's clock when its
handler runs, so with hundreds of streams its own dispatch lateness would count as client error. This
server starts it when the kernel received the bytes that completed the request (the stamp of the recvmsg
that brought in the last of the headers and body, converted to the perf_counter clock), writes the first
token at arrival + --ttft and the others every --itl, and records, per `x-request-id`, the delay it
really achieved: perf_counter just before the first token's send, minus the arrival. Scheduling
precision does not matter; only that record does. A request whose last bytes came without a kernel stamp
(rare: receive stamping is host-wide and turns on a moment after a socket asks) gets no record, since its
arrival would be the server's own read; the bench leaves such requests out and counts them.

Wire format as tests/support/sse_server.py: a role chunk, ` tok0`.. content chunks, a usage chunk and
`data: [DONE]`, as HTTP/1.1 chunked transfer encoding on keep-alive connections (`Connection: close` is
honoured). Request bodies may come with Content-Length or chunked (the replay client sends them chunked).
`POST /v1/chat/completions` streams, `GET /timings` returns the achieved delays as JSON and
`GET /stamps` each request's [arrival, first send] on the perf_counter clock.
Raw non-blocking sockets on one event loop (uvloop when importable); no threads, no HTTP library. It is
a benchmark fixture: it trusts its clients and implements only what they send.

    python bench/stamped_sse_server.py --port 0 [--ttft 0.5 --itl 0.2 --tokens 6]   # prints PORT <n>
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import socket
import struct
import sys
import time

SO_TIMESTAMP = getattr(socket, "SO_TIMESTAMP", 29)  # Linux: struct timeval per packet, as a SOL_SOCKET cmsg
_TIMEVAL = struct.Struct("ll")


def stamp_on(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)


def recv_with_arrival(sock: socket.socket) -> tuple[bytes, float, bool]:
    """The data, its kernel arrival on the perf_counter clock (the read's moment when unstamped), and
    whether the kernel stamped it."""
    data, anc, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(_TIMEVAL.size))
    wall, mono = time.time(), time.perf_counter()
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMP and len(raw) >= _TIMEVAL.size:
            sec, usec = _TIMEVAL.unpack_from(raw)
            return data, mono - max(0.0, wall - (sec + usec / 1e6)), True
    return data, mono, False


def _chunked_end(buf: bytes, start: int) -> int:
    """Where a chunked body starting at `start` ends (after its last chunk's CRLF), or -1 if incomplete."""
    pos = start
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return -1
        size = int(buf[pos:eol].split(b";")[0] or b"0", 16)
        if size == 0:
            end = buf.find(b"\r\n", eol + 2)  # no trailers from our clients: the next CRLF ends it
            return -1 if end < 0 else end + 2
        pos = eol + 2 + size + 2
        if pos > len(buf):
            return -1


def _dechunk(raw: bytes) -> bytes:
    out, pos = b"", 0
    while True:
        eol = raw.find(b"\r\n", pos)
        size = int(raw[pos:eol].split(b";")[0] or b"0", 16)
        if size == 0:
            return out
        out += raw[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


class Server:
    def __init__(self, loop: asyncio.AbstractEventLoop, ttft: float, itl: float, tokens: int) -> None:
        self.loop = loop
        self.ttft, self.itl, self.tokens = ttft, itl, tokens
        self.timings: dict[str, float] = {}
        # Per request id, arrival and first send on the perf_counter clock (CLOCK_MONOTONIC on Linux, so
        # comparable with a client's on the same host): splits a client's error into its two legs.
        self.stamps: dict[str, tuple[float, float]] = {}

    def accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE: leave the rest in the backlog for the next wake-up
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            stamp_on(sock)
            Conn(self, sock)


class Conn:
    """One client connection: reads requests, answers one at a time (clients here do not pipeline)."""

    def __init__(self, server: Server, sock: socket.socket) -> None:
        self.server, self.sock = server, sock
        self.fd = sock.fileno()
        self.inbuf = b""
        self.rx_stamped = False
        self.rx = 0.0  # when the kernel received the last bytes read (perf_counter clock)
        self.outbuf = bytearray()
        self.busy = False  # a response is being streamed
        self.close_after = False
        self.closed = False
        self.handles: list[asyncio.TimerHandle] = []
        server.loop.add_reader(self.fd, self.on_readable)

    def on_readable(self) -> None:
        try:
            data, stamp, self.rx_stamped = recv_with_arrival(self.sock)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        self.inbuf += data
        self.rx = stamp
        self.dispatch()

    def dispatch(self) -> None:
        """Answer the request in inbuf once it is complete: it arrived with the last read (self.rx)."""
        if self.busy or self.closed:
            return
        end = self.inbuf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.inbuf[:end].decode("latin-1").split("\r\n")
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            stop = _chunked_end(self.inbuf, end + 4)
            if stop < 0:
                return
            body = _dechunk(self.inbuf[end + 4 : stop])
        else:
            stop = end + 4 + int(headers.get("content-length", "0"))
            if len(self.inbuf) < stop:
                return
            body = self.inbuf[end + 4 : stop]
        self.inbuf = self.inbuf[stop:]
        method, path, *_ = head[0].split(" ")
        self.close_after = headers.get("connection", "").lower() == "close"
        if method == "POST" and path == "/v1/chat/completions":
            rid = headers.get("x-request-id") if self.rx_stamped else None  # no kernel stamp: no reference
            self.stream(self.rx, rid, json.loads(body or b"{}"))
        elif method == "GET" and path == "/timings":
            self.reply(200, json.dumps(self.server.timings).encode(), "application/json")
        elif method == "GET" and path == "/stamps":
            self.reply(200, json.dumps(self.server.stamps).encode(), "application/json")
        else:
            self.reply(404, b'{"error": {"message": "not found"}}', "application/json")

    def reply(self, status: int, body: bytes, ctype: str) -> None:
        conn = "close" if self.close_after else "keep-alive"
        head = (
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Not Found'}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: {conn}\r\n\r\n"
        )
        self.send(head.encode() + body)
        self.finish()

    def stream(self, arrival: float, rid: str | None, body: dict[str, object]) -> None:
        self.busy = True
        model = body.get("model")
        max_tokens = body.get("max_tokens")
        n = min(self.server.tokens, max_tokens if isinstance(max_tokens, int) and max_tokens else 1 << 30)
        base = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "model": model}
        role = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        conn = "\r\nConnection: close" if self.close_after else ""
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
            f"Transfer-Encoding: chunked{conn}\r\n\r\n"
        )
        self.send(head.encode() + _chunk(role))
        # Timer deadlines on the loop's clock, from the arrival on the perf_counter clock.
        offset = self.server.loop.time() - time.perf_counter()
        for i in range(n):
            when = arrival + self.server.ttft + i * self.server.itl + offset
            self.handles.append(self.server.loop.call_at(when, self.token, i, n, rid, arrival, base))

    def token(self, i: int, n: int, rid: str | None, arrival: float, base: dict[str, object]) -> None:
        if self.closed:
            return
        chunk = {**base, "choices": [{"index": 0, "delta": {"content": f" tok{i}"}, "finish_reason": None}]}
        data = _chunk(chunk)
        if i == n - 1:
            usage = {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": 1,
                    "completion_tokens": n,
                    "total_tokens": 1 + n,
                    "prompt_tokens_details": {"cached_tokens": 0},
                },
            }
            data += _chunk(usage) + _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        if i == 0 and rid:
            sent = time.perf_counter()
            self.server.timings[rid] = sent - arrival
            self.server.stamps[rid] = (arrival, sent)
        self.send(data)
        if i == n - 1:
            self.handles.clear()
            self.busy = False
            self.finish()

    def finish(self) -> None:
        """After a response: close when asked, else answer a request that is already buffered."""
        if self.close_after:
            if not self.outbuf:
                self.close()
            return
        if self.inbuf:
            self.dispatch()

    def send(self, data: bytes) -> None:
        # Straight to the socket when nothing is queued: no extra loop turn between deciding and sending.
        if self.closed:
            return
        if not self.outbuf:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.close()
                return
            if sent == len(data):
                return
            data = data[sent:]
            self.server.loop.add_writer(self.fd, self.on_writable)
        self.outbuf += data

    def on_writable(self) -> None:
        try:
            sent = self.sock.send(self.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        del self.outbuf[:sent]
        if not self.outbuf:
            self.server.loop.remove_writer(self.fd)
            if self.close_after and not self.busy:
                self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for handle in self.handles:
            handle.cancel()
        loop = self.server.loop
        loop.remove_reader(self.fd)
        if self.outbuf:
            loop.remove_writer(self.fd)
        with contextlib.suppress(OSError):
            self.sock.close()


def _frame(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _chunk(obj: dict[str, object]) -> bytes:
    return _frame(b"data: " + json.dumps(obj).encode() + b"\n\n")


def raise_fd_limit() -> None:
    """Hundreds of streams, each a socket at both ends: take the hard limit on open files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    server = Server(loop, args.ttft, args.itl, args.tokens)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(4096)
    listener.setblocking(False)
    loop.add_reader(listener.fileno(), server.accept, listener)
    print(f"PORT {listener.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft", type=float, default=0.05, help="delay of the first token after arrival, s")
    p.add_argument("--itl", type=float, default=0.01, help="delay between tokens, s")
    p.add_argument("--tokens", type=int, default=8, help="tokens per answer (fewer if max_tokens asks)")
    args = p.parse_args()
    raise_fd_limit()
    run = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        run = uvloop.run
    try:
        run(serve(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
