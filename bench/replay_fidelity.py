"""How much error does the replay client add to TTFT, what does it cost, and does it say when it is late?

A local server (bench/stamped_sse_server.py, its own process, sharing no code with the client) streams
with an injected TTFT and inter-token gap and records, per request id, the delay it really achieved
before writing the first token, from the kernel's arrival stamp of the request. Each client runs a
closed loop of N concurrent streams for a while; the error of a request is the client-measured TTFT minus
the server-side delay for the same request id (network + client overhead + lateness).

Clients, each against a fresh server in the same run (so ratios between them hold on a noisy machine):
- floor: a bare asyncio socket client, no HTTP library, one connection per request, stamps on read;
- sdk: `openai` AsyncOpenAI on its httpx client, the way LMCache's multi-round-qa measures;
- the ablation of our client (`replay/client.py` stream_chat) by connection handling and stamps:
  pool/read (httpx's default transport: httpcore's connection pool, stamps on read), pool/kernel
  (httpcore's pool on our stamped network backend), conn/read and conn/kernel (our `StampedTransport`,
  one connection per request in flight, with and without kernel stamps; conn/kernel is the product);
- conn/kernel xW: the product's client split over W processes (streams / W each), the workers' effect.

For our client the table also shows how many records it flagged late (`late_s`: the first token's read
took in a later token too), how many say their TTFT clock is the read's (`ttft_clock` "read"), and how
many records with an error above 3 ms said neither ("unflagged"). "no ref" counts completed requests the
server has no reference for (their last bytes reached it without a kernel stamp); they are left out.
CPU is the client process's user + system seconds per 1000 streamed tokens (getrusage), and its ratio
to the floor client's in the same run. Targets (issue 16): p99 <= 1 ms at 64 streams, <= 3 ms at 512 or a
late flag on every late record, and at most half the SDK client's p99.

    .venv/bin/python bench/replay_fidelity.py [--streams 64 512] [--seconds 20] [--ttft 0.5 --itl 0.02]

`--pin SERVER_CPU CLIENT_CPU` runs the server on one CPU and the client on another (each client run
alone on its core): how many streams ONE core of the replay client drives, the per-core budget that
`plan` sizes the client pool with (kvoffload/config/clients.py STREAMS_PER_CORE):

    .venv/bin/python bench/replay_fidelity.py --pin 0 1 --clients floor conn/kernel --workers 0 \
        --streams 64 128 192 256 --ttft 0.3 --itl 0.02 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpcore
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvoffload.replay.client import stream_chat  # noqa: E402
from kvoffload.replay.netstamp import (  # noqa: E402
    StampedBackend,
    StampedTransport,
    _Body,
    _httpx_errors,
    stamped_client,
)
from tests.support.procs import sse_server  # noqa: E402

SERVER = ROOT / "bench/stamped_sse_server.py"
LATE_MS = 3.0


@dataclass
class Run:
    """One client's closed loop: TTFT per request id, the ids it flagged late, CPU seconds, tokens."""

    ttft: dict[str, float] = field(default_factory=dict)
    late: set[str] = field(default_factory=set)
    read_clock: set[str] = field(default_factory=set)  # TTFT stamped at read time (no kernel stamp)
    cpu_s: float = 0.0
    tokens: int = 0


Measure = Callable[[str], Awaitable[tuple[float | None, bool, bool]]]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def closed_loop(streams: int, seconds: float, tokens: int, measure: Measure) -> Run:
    run = Run()
    stop = time.monotonic() + seconds
    cpu0 = _cpu()

    async def slot(i: int) -> None:
        await asyncio.sleep(i * 0.5 / streams)  # stagger starts over half a second
        while time.monotonic() < stop:
            rid = uuid.uuid4().hex
            ttft, late, read_clock = await measure(rid)
            if ttft is not None:
                run.ttft[rid] = ttft
                run.tokens += tokens
                if late:
                    run.late.add(rid)
                if read_clock:
                    run.read_clock.add(rid)

    await asyncio.gather(*(slot(i) for i in range(streams)))
    run.cpu_s = _cpu() - cpu0
    return run


def _payload(tokens: int) -> dict[str, object]:
    return {
        "model": "bench",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class PoolTransport(httpx.AsyncBaseTransport):
    """The old connection handling for the ablation: httpcore's connection pool on a given backend."""

    def __init__(self, backend: httpcore.AsyncNetworkBackend, connections: int) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            max_connections=connections, max_keepalive_connections=None, network_backend=backend
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,  # an async iterable of bytes
            extensions=request.extensions,
        )
        with _httpx_errors(request):
            resp = await self._pool.handle_async_request(core)

        async def release() -> None:
            pass  # the pool takes its connection back when the response closes

        return httpx.Response(
            resp.status,
            headers=resp.headers,
            stream=_Body(resp, request, release),
            extensions=resp.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


def _client(kind: str, streams: int) -> httpx.AsyncClient:
    timeout = httpx.Timeout(600.0)
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=None)
    if kind == "pool/read":
        return httpx.AsyncClient(limits=limits, timeout=timeout)
    if kind == "pool/kernel":
        return httpx.AsyncClient(timeout=timeout, transport=PoolTransport(StampedBackend(), streams + 8))
    if kind == "conn/read":
        return httpx.AsyncClient(timeout=timeout, transport=StampedTransport(stamps=False))
    return stamped_client(limits=limits, timeout=timeout)


async def run_ours(kind: str, url: str, streams: int, seconds: float, tokens: int) -> Run:
    async with _client(kind, streams) as client:

        async def measure(rid: str) -> tuple[float | None, bool, bool]:
            r = await stream_chat(
                client, f"{url}/v1/chat/completions", _payload(tokens), {"x-request-id": rid}, 600.0
            )
            return r.ttft_s, r.late_s is not None, r.ttft_clock == "read"

        return await closed_loop(streams, seconds, tokens, measure)


async def run_floor(url: str, streams: int, seconds: float, tokens: int) -> Run:
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(_payload(tokens)).encode()

    async def measure(rid: str) -> tuple[float | None, bool, bool]:
        reader, writer = await asyncio.open_connection(host, int(port))
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"x-request-id: {rid}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        t0 = time.perf_counter()
        writer.write(head + body)
        seen, ttft = b"", None
        while chunk := await reader.read(65536):
            if ttft is None:
                seen += chunk
                if b"tok0" in seen:
                    ttft = time.perf_counter() - t0
        writer.close()
        return ttft, False, True

    return await closed_loop(streams, seconds, tokens, measure)


async def run_sdk(url: str, streams: int, seconds: float, tokens: int) -> Run:
    import httpx2  # the HTTP client of openai 3.x (a fork of httpx)
    from openai import AsyncOpenAI

    limits = httpx2.Limits(max_connections=streams + 8, max_keepalive_connections=None)
    http = httpx2.AsyncClient(limits=limits)
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600.0, http_client=http)

    async def measure(rid: str) -> tuple[float | None, bool, bool]:
        t0 = time.perf_counter()
        stream = await client.chat.completions.create(
            model="bench",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"x-request-id": rid},
        )
        ttft = None
        async for chunk in stream:
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - t0
        return ttft, False, True

    try:
        return await closed_loop(streams, seconds, tokens, measure)
    finally:
        await client.close()


def _loop_run(coro: Awaitable[Run], loop: str) -> Run:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)  # type: ignore[arg-type]
    return asyncio.run(coro)  # type: ignore[arg-type]


def _worker(args: tuple[str, int, float, int, str]) -> Run:
    url, streams, seconds, tokens, loop = args
    _raise_fd_limit()
    return _loop_run(run_ours("conn/kernel", url, streams, seconds, tokens), loop)


def run_workers(url: str, streams: int, seconds: float, tokens: int, workers: int, loop: str) -> Run:
    """The product's client over `workers` processes; CPU is the sum of the workers' own."""
    shares = [streams // workers + (1 if i < streams % workers else 0) for i in range(workers)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        parts = pool.map(_worker, [(url, n, seconds, tokens, loop) for n in shares])
    merged = Run()
    for part in parts:
        merged.ttft.update(part.ttft)
        merged.late |= part.late
        merged.read_clock |= part.read_clock
        merged.cpu_s += part.cpu_s
        merged.tokens += part.tokens
    return merged


def pct(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1]


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@dataclass(frozen=True)
class Row:
    streams: int
    client: str
    requests: int
    unreferenced: int  # completed, but the server's arrival stamp was missing: no reference to judge by
    p50: float
    p99: float
    late: int | None
    read: int | None
    unflagged: int | None
    cpu_per_1k: float


def row(streams: int, name: str, run: Run, server: dict[str, float], flags: bool) -> Row:
    errors = {k: (run.ttft[k] - server[k]) * 1000 for k in run.ttft if k in server}
    values = sorted(errors.values())
    said = run.late | run.read_clock  # a record that says it is late, or that its clock is the read's
    unflagged = sum(1 for k, e in errors.items() if e > LATE_MS and k not in said)
    cpu = 1000 * run.cpu_s / run.tokens if run.tokens else float("nan")
    return Row(
        streams, name, len(values), len(run.ttft) - len(values), pct(values, 50), pct(values, 99),
        len(run.late) if flags else None, len(run.read_clock) if flags else None,
        unflagged if flags else None, cpu,
    )  # fmt: skip


def client_run(name: str, url: str, streams: int, args: argparse.Namespace) -> Run:
    """One closed loop of client `name` against the server at `url`."""
    if name.startswith("conn/kernel x"):
        return run_workers(url, streams, args.seconds, args.tokens, args.workers, args.loop)
    if name == "floor":
        coro = run_floor(url, streams, args.seconds, args.tokens)
    elif name == "sdk":
        coro = run_sdk(url, streams, args.seconds, args.tokens)
    else:
        coro = run_ours(name, url, streams, args.seconds, args.tokens)
    return _loop_run(coro, args.loop)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--ttft", type=float, default=0.5, help="injected server TTFT, s")
    parser.add_argument(
        "--itl", type=float, default=0.02, help="injected inter-token gap, s (5-30 ms is real)"
    )
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer")
    parser.add_argument("--workers", type=int, default=2, help="processes for the workers row (0: no row)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop", help="client event loop")
    parser.add_argument(
        "--clients",
        nargs="+",
        help="only these clients (floor sdk pool/read pool/kernel conn/read conn/kernel)",
    )
    parser.add_argument(
        "--pin",
        type=int,
        nargs=2,
        metavar=("SERVER_CPU", "CLIENT_CPU"),
        help="pin the server to one CPU and the client to another: the client's per-core figure",
    )
    args = parser.parse_args()
    _raise_fd_limit()  # 512 streams hold over a thousand sockets at once; the server inherits the limit
    kinds = ["floor", "sdk", "pool/read", "pool/kernel", "conn/read", "conn/kernel"]
    kinds = [k for k in kinds if not args.clients or k in args.clients]
    names = kinds + ([f"conn/kernel x{args.workers}"] if args.workers > 1 else [])
    rows: list[Row] = []
    for streams in args.streams:
        for name in names:
            # a fresh server per run, so the timings of one client never mix with another's
            server_args = ("--ttft", str(args.ttft), "--itl", str(args.itl), "--tokens", str(args.tokens))
            if args.pin:
                os.sched_setaffinity(0, {args.pin[0]})  # the server inherits it as it starts
            with sse_server(*server_args, script=SERVER) as url:
                if args.pin:
                    os.sched_setaffinity(0, {args.pin[1]})
                # The kernel turns receive stamping on host-wide a moment after a socket first asks for
                # it (and off when the last such socket closes): one request turns it on, then a pause.
                httpx.post(f"{url}/v1/chat/completions", json=_payload(1), timeout=30)
                time.sleep(0.2)
                run = client_run(name, url, streams, args)
                server = httpx.get(f"{url}/timings", timeout=30).json()
            rows.append(row(streams, name, run, server, flags=name not in ("floor", "sdk")))
            print(f"  done: {streams} streams, {name}", file=sys.stderr, flush=True)
    print(
        f"injected TTFT {args.ttft * 1000:.0f} ms, inter-token {args.itl * 1000:.0f} ms, "
        f"{args.tokens} tokens, {args.seconds:.0f} s each, client loop {args.loop}"
        + (f", server on CPU {args.pin[0]}, client on CPU {args.pin[1]}" if args.pin else "")
        + "; "
        "errors in ms; CPU s per 1000 tokens"
    )
    print(
        f"{'streams':>7}  {'client':<18} {'requests':>8} {'no ref':>6} {'err p50':>8} {'err p99':>8} "
        f"{'late':>6} {'read':>6} {'unflagged':>9} {'cpu/1k':>7} {'cpu/floor':>9}"
    )
    for streams in args.streams:
        mine = [r for r in rows if r.streams == streams]
        floor = next((r for r in mine if r.client == "floor"), None)
        for r in mine:
            late = "-" if r.late is None else str(r.late)
            read = "-" if r.read is None else str(r.read)
            unflagged = "-" if r.unflagged is None else str(r.unflagged)
            ratio = f"{r.cpu_per_1k / floor.cpu_per_1k:.2f}" if floor is not None else "-"
            print(
                f"{streams:>7}  {r.client:<18} {r.requests:>8} {r.unreferenced:>6} {r.p50:>8.3f} "
                f"{r.p99:>8.3f} {late:>6} {read:>6} {unflagged:>9} {r.cpu_per_1k:>7.3f} {ratio:>9}"
            )
        ours = next((r for r in mine if r.client == "conn/kernel"), None)
        sdk = next((r for r in mine if r.client == "sdk"), None)
        if ours is not None and sdk is not None:
            target = 1.0 if streams <= 64 else LATE_MS
            print(
                f"{streams:>7}  conn/kernel p99 {ours.p99:.3f} ms (target <= {target:g}, or every late "
                f"record flagged: {ours.unflagged} unflagged); "
                f"ratio to sdk {ours.p99 / sdk.p99:.2f} (target <= 0.5)"
            )


if __name__ == "__main__":
    main()
