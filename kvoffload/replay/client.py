"""One streamed chat completion, timed: the only place that talks HTTP to the server under test.

TTFT runs from the moment the request's last bytes were handed to the kernel (`StampedStream.last_tx`:
the server can start no earlier) to the arrival of the first streamed token (content or reasoning
content), both on the `time.perf_counter()` clock. Where the connection is not ours (https, a proxy),
the clock starts just before the request headers go out (httpcore's trace hook), so it also holds any
pause of the client between its headers and its body. The arrival is when the kernel received the bytes
that completed the token's chunk (`netstamp.StampedStream.last_rx`, SO_TIMESTAMPNS), not when our
event loop got round to reading them: with hundreds of streams on one loop, the loop is often busy with
other streams when a token arrives, and that lateness is the client's, not the server's. Connections
that carry no kernel stamps (https, a proxy, another client passed in) fall back to the moment the chunk
is read; each result says which clock stamped its TTFT (`ttft_clock`: "kernel" or "read").

A kernel stamp belongs to the last TCP segment a read took in. A loop later than one inter-token gap
finds the first token and later ones waiting together, and one read stamps the first token with a later
segment's arrival: the TTFT is then too long by up to the lateness. The client cannot undo that, but it
sees it: the read that carried the first token also carried a later token. Such a result has `late_s`,
how long that read's newest data had waited in the kernel (read moment minus stamp); any other result
has `late_s` None (its stamp is the first token's own, or the clock is "read").

To keep client overhead out of the measurement, only chunks up to the first token are JSON-decoded; later
chunks are timestamped and the usage chunk is decoded at the end. The server's own account of the request
(schema 3: its `id`, `metrics` with --enable-per-request-metrics, `kv_transfer_params.cached_token_stats`
when asked) is read from the chunks that carry it (`ServerAnswer`), each field null when none does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from kvoffload.replay.netstamp import Clock, StampedStream
from kvoffload.replay.records import Measurement, Status
from kvoffload.replay.watchdog import Activity

# How long to wait for the end of a response body after `[DONE]` before giving up on its connection.
DRAIN_S = 1.0
REPLICA_HEADERS = ("x-kvoffload-replica", "x-kvoffload-upstream")


# The measurements of one request: the request record's own fields (kvoffload/contracts/records.py).
StreamResult = Measurement


def _has_token(data: bytes) -> bool:
    """True when an SSE chunk carries generated text (content or reasoning), not just the role."""
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        return False
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            return True
        if delta.get("tool_calls"):
            return True
    return False


def _error_text(body: bytes) -> str:
    try:
        obj = json.loads(body)
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        if obj.get("detail"):
            return str(obj["detail"])[:500]
    except (json.JSONDecodeError, AttributeError):
        pass
    text = body.decode(errors="replace").strip()[:500]
    return text or "empty response body"


def _object_with(data: bytes, key: bytes) -> dict[str, Any] | None:
    """The JSON object of an SSE data line that mentions `key` (a cheap test before decoding)."""
    if key not in data:
        return None
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _stream_error(data: bytes) -> str | None:
    """The message of an error event inside a 200 stream, else None.

    vLLM answers 200 before the engine has run the request; a request that fails later (a KV load that
    failed under `kv_load_failure_policy: fail`, an engine error) ends its stream with a data line
    `{"error": {"message": ..., "type": ..., "code": ...}}` (older servers: `{"object": "error",
    "message": ...}`) and then `[DONE]`.
    """
    obj = _object_with(data, b'"error"')
    if obj is None:
        return None
    err = obj.get("error")
    if isinstance(err, dict):
        text = str(err.get("message") or err)
        kind = err.get("type") or err.get("code")
        return f"error event in the stream: {text}" + (f" ({kind})" if kind else "")
    if isinstance(err, str) and err:
        return f"error event in the stream: {err}"
    if obj.get("object") == "error":
        return f"error event in the stream: {obj.get('message') or obj}"
    return None


def _finish_reason(data: bytes) -> str | None:
    """The finish_reason a chunk gives its first choice, if any (read only while no token has come)."""
    obj = _object_with(data, b'"finish_reason"')
    for choice in obj.get("choices") or () if obj is not None else ():
        reason = choice.get("finish_reason") if isinstance(choice, dict) else None
        if isinstance(reason, str):
            return reason
    return None


def _tokenless(finish: str | None, usage: dict[str, Any] | None, ended: bool) -> str:
    """Why a 200 stream carried no token, in the server's own terms where it gave them."""
    if not ended:
        return "the stream ended before [DONE] without a token (cut by the server or a proxy)"
    said = []
    if usage is not None and _count(usage.get("completion_tokens")) is not None:
        said.append(f"{usage['completion_tokens']} completion tokens, none with text")
    if finish is not None:
        said.append(f"finish_reason {finish!r}")
    return "stream ended without a token" + (f" ({'; '.join(said)})" if said else "")


def _usage(data: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        return None
    usage = obj.get("usage")
    return usage if isinstance(usage, dict) else None


def _count(value: Any) -> int | None:
    """A usage count as the record takes it; anything but a whole number (a broken server) is None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _seconds(value: Any) -> float | None:
    """A server's milliseconds as seconds; anything but a non-negative number is None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value) / 1000.0


class ServerAnswer:
    """What the server said about the request itself, gathered from the chunks that carry it.

    vLLM 0.32 puts `id` on every chunk, `metrics` (--enable-per-request-metrics) on the usage chunk and
    `kv_transfer_params` where its version sends it (tests/fixtures/vllm-0.32-cpu-attribution/README.md
    says which chunk); only chunks that contain the key are decoded for it.
    """

    def __init__(self) -> None:
        self.response_id: str | None = None
        self.queue_s: float | None = None
        self.ttft_s: float | None = None
        self.stats: dict[str, Any] = {}

    def read(self, data: bytes) -> None:
        """Take what one SSE data line (or a whole JSON body) says."""
        wanted = self.response_id is None or b'"metrics"' in data or b'"kv_transfer_params"' in data
        if not wanted:
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        if self.response_id is None and isinstance(obj.get("id"), str):
            self.response_id = obj["id"]
        metrics = obj.get("metrics")
        if isinstance(metrics, dict):
            self.queue_s = _seconds(metrics.get("queue_time_ms"))
            self.ttft_s = _seconds(metrics.get("time_to_first_token_ms"))
        params = obj.get("kv_transfer_params")
        stats = params.get("cached_token_stats") if isinstance(params, dict) else None
        if isinstance(stats, dict):
            self.stats = stats

    def fields(self) -> dict[str, Any]:
        """The record's schema-3 fields (null where the server said nothing)."""
        return {
            "response_id": self.response_id,
            "server_queue_s": self.queue_s,
            "server_ttft_s": self.ttft_s,
            "vllm_cached_tokens": _count(self.stats.get("num_vllm_cached_tokens")),
            "lmcache_cached_tokens": _count(self.stats.get("num_lmcache_cached_tokens")),
            "lmcache_loaded_tokens": _count(self.stats.get("num_lmcache_extra_cached_tokens")),
        }


async def _drain(resp: httpx.Response, chunks: AsyncIterator[bytes]) -> None:
    """Read what follows `[DONE]` (normally just the chunked body's terminator), for DRAIN_S at most.

    httpcore reuses a connection only when the response was read to its end; leaving right after
    `[DONE]` would close it, and the next request would open a new one (connect, and a server that must
    accept it before it can read the request: up to a millisecond of TTFT on a busy server). A server
    that does not end the body in time gets its socket shut down, so the read fails through httpcore's
    own error path: cancelling a read inside httpcore instead can leave its pool waiting forever.
    """

    async def rest() -> None:
        async for _ in chunks:
            pass

    task = asyncio.create_task(rest())
    try:
        done, _ = await asyncio.wait({task}, timeout=DRAIN_S)
        if not done:
            stream = resp.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                # Through a duplicate descriptor: asyncio's transport sockets refuse shutdown() itself.
                with contextlib.suppress(OSError), socket.socket(fileno=os.dup(sock.fileno())) as dup:
                    dup.shutdown(socket.SHUT_RDWR)
            await asyncio.wait({task}, timeout=DRAIN_S)
    finally:
        if not task.done():
            task.cancel()  # last resort (a stream without a socket to shut down)
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await task


async def _chunked(body: bytes) -> AsyncIterator[bytes]:
    """The request body as one chunk of a chunked body (`Transfer-Encoding: chunked`, not Content-Length).

    Through Caddy 2.6.2 (Go 1.19 net/http) a Content-Length body races on a kept-alive connection: the
    proxy's transport reads the body once more after its last byte, and if the upstream has answered by
    then, the server has already consumed and closed that body (it does so when the response headers
    go out), the read fails, the upstream connection is torn down and Caddy ends the stream cleanly
    after its headers: a 200 with no token (golang/go#40747, docs/contracts.md). A chunked body ends
    with its terminator, which the proxy forwards only after its last read: the upstream cannot answer
    before it.
    """
    yield body


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    headers: dict[str, str],
    timeout_s: float,
    activity: Activity | None = None,
) -> StreamResult:
    """POST a streaming chat completion and time it; never raises for server or network failures.

    The body is encoded and the request built before the clock starts, so TTFT does not include our own
    JSON encoding of a long history; raw bytes are split into SSE lines without text decoding. With an
    `activity` (the stall watchdog's), the request reports every chunk it reads, and a watchdog abort
    ends it as a `timeout` whose error is the abort's reason.
    """
    marks: dict[str, float] = {}

    async def trace(event: str, _info: dict[str, Any]) -> None:
        # httpcore calls this as it writes the request: the clock starts as the request goes out, so
        # neither a wait for a pooled connection nor our own request building counts as server latency.
        if event == "http11.send_request_headers.started":
            marks["t0"] = time.perf_counter()

    request = client.build_request(
        "POST",
        url,
        content=_chunked(json.dumps(payload).encode()),
        headers={**headers, "content-type": "application/json"},
        extensions={"trace": trace},
    )
    t_wall = time.time()
    t0 = time.perf_counter()
    t_first: float | None = None
    t_last: float | None = None
    t_end: float | None = None
    usage: dict[str, Any] | None = None
    status: Status = "ok"
    http_status: int | None = None
    error: str | None = None
    replica: str | None = None
    clock: Clock = "read"
    late_s: float | None = None
    answer = ServerAnswer()
    finish: str | None = None  # the finish_reason of a stream that ends before any token
    ended = False  # `[DONE]` came
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            if activity is not None:
                activity.begin(deadline)
            try:
                resp = await client.send(request, stream=True)
                stream = resp.extensions.get("network_stream")
                stamped = stream if isinstance(stream, StampedStream) else None
                # The request's last write: nothing is written on the stream while its answer is read.
                t0 = stamped.last_tx if stamped is not None else marks.get("t0", t0)
                if activity is not None:
                    activity.touch()
                try:
                    http_status = resp.status_code
                    replica = next((resp.headers[h] for h in REPLICA_HEADERS if h in resp.headers), None)
                    if resp.status_code != 200:
                        return StreamResult(
                            t_start=t_wall, ttft_s=None, latency_s=time.perf_counter() - t0,
                            tpot_s=None, prompt_tokens=None, completion_tokens=None, cached_tokens=None,
                            status="error", http_status=resp.status_code,
                            error=_error_text(await resp.aread()), replica=replica,
                        )  # fmt: skip
                    # The read that produced a chunk is the stream's latest read: httpcore reads again
                    # only when asked for the next chunk.
                    buffer = b""
                    done = False
                    first_read = -1  # the stream's read count at the first token (kernel clock only)
                    chunks = resp.aiter_raw()
                    async for raw in chunks:
                        now = stamped.last_rx if stamped is not None else time.perf_counter()
                        reads = stamped.reads if stamped is not None else 0
                        if activity is not None:
                            activity.touch()
                        buffer += raw
                        *lines, buffer = buffer.split(b"\n")
                        for line in lines:
                            if not line.startswith(b"data:"):
                                continue
                            data = line[5:].strip()
                            # A later token in the first token's read: the stamp may be its segment's
                            # (module docstring). Usage and [DONE] follow the last token at once.
                            if (
                                reads == first_read
                                and late_s is None
                                and stamped is not None
                                and data != b"[DONE]"
                                and _has_token(data)
                            ):
                                late_s = stamped.last_read - stamped.last_rx
                            if data == b"[DONE]":
                                done = ended = True
                                t_end = now
                                break
                            answer.read(data)
                            said = _stream_error(data)
                            if said is not None:
                                status, error = "error", said[:500]
                            if t_first is None and finish is None:
                                finish = _finish_reason(data)
                            if b'"usage"' in data:
                                found = _usage(data)
                                if found is not None:
                                    usage = found
                                if b'"choices":[]' in data.replace(b" ", b""):
                                    continue  # the usage-only chunk carries no token
                            if t_first is None:
                                if _has_token(data):
                                    t_first = t_last = now
                                    if stamped is not None and stamped.last_clock == "kernel":
                                        clock, first_read = "kernel", reads
                            else:
                                t_last = now
                        if done:
                            break
                    if done:
                        await _drain(resp, chunks)
                finally:
                    await resp.aclose()
            finally:
                if activity is not None:
                    activity.end(deadline)
    except TimeoutError:
        aborted = activity.abort_reason if activity is not None else None
        status, error = "timeout", aborted or f"no complete answer within {timeout_s:g} s"
    except httpx.HTTPError as exc:
        status, error = "error", f"{type(exc).__name__}: {exc}"[:500]
    # The answer ends at `[DONE]`'s arrival (what follows is the body's framing, drained above).
    latency = (t_end if t_end is not None else time.perf_counter()) - t0
    prompt_tokens = completion_tokens = cached = None
    if usage:
        prompt_tokens = _count(usage.get("prompt_tokens"))
        completion_tokens = _count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details") or {}
        cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    if status == "ok" and t_first is None:
        status, error = "error", error or _tokenless(finish, usage, ended)
    ttft = t_first - t0 if t_first is not None else None
    tpot = None
    if t_first is not None and t_last is not None and completion_tokens and completion_tokens > 1:
        tpot = (t_last - t_first) / (completion_tokens - 1)
    return StreamResult(
        t_start=t_wall,
        ttft_s=ttft,
        latency_s=latency,
        tpot_s=tpot,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached,
        status=status,
        http_status=http_status,
        error=error,
        replica=replica,
        ttft_clock=clock,
        late_s=late_s,
        **answer.fields(),
    )
