"""The simulator's processes stop on SIGTERM in every state, and its engine start-up is modelled.

systemd stops a unit by sending SIGTERM to every process of it, then SIGKILL after TimeoutStopSec (60 s
in the vllm role). The simulated engine used to stay up to 2 x 60 s (aiohttp's graceful shutdown
waiting for in-flight handlers) while a stream was open or requests were queued, so the lab's "Stop
every replica" took 60.6 s. Each test here signals the whole process group, as systemd does, and
asserts that the process exited by itself with status 0 long before any such kill: the bound (10 s) is
a function check ("it exits, it does not hang"), not a performance figure. Loopback only; every
process is killed by its group in `finally`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.loopback import free_port
from tests.support.procs import stop_group

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CLI = str(Path(sys.executable).parent / "kvoffload-lab")
MODEL = "sim-llama"
# Well before systemd's TimeoutStopSec=60, well after the simulator's own shutdown (about 0.6 s).
EXITS_WITHIN_S = 10.0
# tiny profile: about 2 ms per decode step, so this stream runs about 30 s if nothing stops it.
LONG_STREAM_TOKENS = 15000


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [CLI, "sim", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sim process exited early:\n{log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1, trust_env=False).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"sim process not healthy in {timeout_s} s:\n{log.read_text()}")
        time.sleep(0.05)


def _sigterm_and_time(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    """SIGTERM the process group (as systemd signals a unit); exit status and seconds to exit."""
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait(timeout=3 * EXITS_WITHIN_S)
    except subprocess.TimeoutExpired:
        code = -999  # still running: the finally's stop_group kills it
    return code, time.monotonic() - started


@contextlib.contextmanager
def _cache_server(tmp: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    port, http_port = free_port(), free_port()
    args = ["cache-server", "--host", "127.0.0.1", "--port", str(port), "--http-host", "127.0.0.1"]
    args += ["--http-port", str(http_port), "--l1-size-gb", "0.25", "--eviction-policy", "LRU"]
    args += ["--sim-profile", "tiny"]
    log = tmp / "cache.log"
    proc = _spawn(args, log)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{http_port}/healthcheck", log)
        yield proc, port, http_port
    finally:
        stop_group(proc)


def _engine_args(port: int, cache_port: int | None, extra: list[str]) -> list[str]:
    args = ["serve", MODEL, "--host", "127.0.0.1", "--port", str(port), "--sim-profile", "tiny"]
    args += ["--max-model-len", "16384", *extra]
    if cache_port is not None:
        cfg = {
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "lmcache.mp.host": "tcp://127.0.0.1",
                "lmcache.mp.port": cache_port,
                "lmcache.mp.mq_timeout": 300,
            },
        }
        args += ["--kv-transfer-config", json.dumps(cfg)]
    return args


def _open_stream(port: int, max_tokens: int) -> socket.socket:
    """A streaming chat request on a raw socket, read up to its first token event; left open."""
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "tell me about caches " * 40}],
            "max_tokens": max_tokens,
            "stream": True,
        }
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    seen = b""
    while b'"content":" ' not in seen:  # a token, past the role event
        chunk = sock.recv(65536)
        assert chunk, f"stream closed early: {seen!r}"
        seen += chunk
    assert seen.startswith(b"HTTP/1.1 200"), seen[:200]
    return sock


def _idle_keepalive(port: int, path: str) -> socket.socket:
    """One answered keep-alive request, then the connection left open and idle."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    return sock


def _drain(sock: socket.socket, timeout_s: float = 5) -> bytes:
    """What the server still sent before it closed the connection."""
    sock.settimeout(timeout_s)
    got = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            got += chunk
    return got


def test_engine_mid_stream_with_keepalive_and_cache_connection_exits_on_sigterm(tmp_path: Path) -> None:
    with _cache_server(tmp_path) as (cache, cache_port, http_port):
        port = free_port()
        log = tmp_path / "engine.log"
        engine = _spawn(_engine_args(port, cache_port, []), log)
        socks: list[socket.socket] = []
        try:
            _wait_healthy(engine, f"http://127.0.0.1:{port}/health", log)
            socks.append(stream := _open_stream(port, LONG_STREAM_TOKENS))
            socks.append(_idle_keepalive(port, "/health"))
            socks.append(queued := _open_stream(port, 4))  # a short one, done before the signal
            _drain(queued, timeout_s=2)
            code, took = _sigterm_and_time(engine)
            rest = _drain(stream)
        finally:
            for s in socks:
                s.close()
            stop_group(engine)
        # The cache server, with the engine's connector connection gone and an idle keep-alive
        # connection on each of its ports, stops as promptly.
        socks = [_idle_keepalive(http_port, "/healthcheck"), _idle_keepalive(cache_port, "/sim/ping")]
        try:
            cache_code, cache_took = _sigterm_and_time(cache)
        finally:
            for s in socks:
                s.close()
    text = log.read_text()
    assert code == 0, text
    assert took < EXITS_WITHIN_S, f"engine took {took:.1f} s to exit after SIGTERM:\n{text}"
    assert "shutting down" in text
    assert b"data: [DONE]" not in rest  # the open stream was cut, as vLLM's shutdown cuts it
    assert cache_code == 0, (tmp_path / "cache.log").read_text()
    assert cache_took < EXITS_WITHIN_S, f"cache server took {cache_took:.1f} s to exit after SIGTERM"


def test_engine_start_up_is_modelled_refuses_connections_and_logs_like_vllm(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "engine.log"
    load_s, capture_s = 2.0, 1.0
    extra = ["--sim-model-load-s", str(load_s), "--sim-graph-capture-s", str(capture_s)]
    started = time.monotonic()
    engine = _spawn(_engine_args(port, None, extra), log)
    refused = 0
    try:
        deadline = started + load_s  # surely still loading until then
        while time.monotonic() < deadline:
            for path in ("/health", "/metrics"):
                with contextlib.suppress(httpx.ConnectError):
                    response = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1, trust_env=False)
                    pytest.fail(f"{path} answered {response.status_code} during the modelled start-up")
                refused += 1
            time.sleep(0.2)
        _wait_healthy(engine, f"http://127.0.0.1:{port}/health", log)
        ready_after = time.monotonic() - started
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False).status_code == 200
    finally:
        stop_group(engine)
    text = log.read_text()
    assert refused >= 4
    assert ready_after >= load_s + capture_s, text
    assert "simulated start-up: weights load 2.0 s (--sim-model-load-s), graph capture 1.0 s" in text
    lines = [line.split(": ", 1)[-1] for line in text.splitlines()]
    order = [
        next(i for i, line in enumerate(lines) if line.startswith(prefix))
        for prefix in (
            f"Starting to load model {MODEL}...",
            "Loading weights took 2.",
            "GPU KV cache size: ",
            "Graph capturing finished in 1 secs",
            "init engine (profile, create kv cache, warmup model) took 3.",
            "Starting vLLM API server on http://127.0.0.1:",
        )
    ]
    assert order == sorted(order), text


@pytest.mark.parametrize(
    ("extra", "with_cache", "marker"),
    [
        (["--sim-model-load-s", "120"], False, "Starting to load model"),  # loading weights
        (["--sim-model-load-s", "0", "--sim-graph-capture-s", "120"], False, "Maximum concurrency"),
        ([], True, "Maximum concurrency"),  # a cache server that never answers (mq_timeout 300 s)
    ],
    ids=["loading", "capturing", "waiting-for-cache-server"],
)
def test_engine_exits_on_sigterm_during_start_up(
    tmp_path: Path, extra: list[str], with_cache: bool, marker: str
) -> None:
    port = free_port()
    log = tmp_path / "engine.log"
    engine = _spawn(_engine_args(port, free_port() if with_cache else None, extra), log)
    try:
        deadline = time.monotonic() + 30
        while marker not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            assert engine.poll() is None, log.read_text()
            time.sleep(0.05)
        time.sleep(0.5)  # well inside the wait now
        code, took = _sigterm_and_time(engine)
    finally:
        stop_group(engine)
    text = log.read_text()
    assert code == 0, text
    assert took < EXITS_WITHIN_S, f"engine took {took:.1f} s to exit after SIGTERM:\n{text}"
    assert "shutting down (start-up not finished)" in text
    assert "Starting vLLM API server" not in text


def test_reset_prefix_cache_refuses_while_a_stream_holds_blocks(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "engine.log"
    engine = _spawn(_engine_args(port, None, []), log, env={"VLLM_SERVER_DEV_MODE": "1"})
    url = f"http://127.0.0.1:{port}/reset_prefix_cache"
    try:
        _wait_healthy(engine, f"http://127.0.0.1:{port}/health", log)
        stream = _open_stream(port, LONG_STREAM_TOKENS)
        held = httpx.post(url, params={"reset_external": "true"}, trust_env=False)
        stream.close()  # the client goes away: vLLM aborts the request and frees its blocks
        deadline = time.monotonic() + 10
        while (after := httpx.post(url, trust_env=False).json()) != {"success": True}:
            assert time.monotonic() < deadline, after
            time.sleep(0.1)
        aborted = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False).text
    finally:
        stop_group(engine)
    assert (held.status_code, held.json()) == (200, {"success": False})
    assert (
        'vllm:request_success_total{engine="0",finished_reason="abort",model_name="sim-llama"} 1.0' in aborted
    )


def test_the_tokenizer_worker_leaves_soon_after_its_own_sigterm() -> None:
    """systemd signals every process of the unit: the worker must not outlive a stop by ignoring it
    (a worker left behind held the next stop of the same unit for all of TimeoutStopSec)."""
    import asyncio

    from kvoffload.sim.prep import TERM_GRACE_S, PrepWorker

    worker = PrepWorker("tiny-llama", 16, b"seed")
    try:
        asyncio.run(worker.start())
        pid = worker.pid
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S + 8.0
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap it: our child
            time.sleep(0.1)
        else:
            pytest.fail(
                f"the tokenizer worker {pid} was still running {TERM_GRACE_S + 8:.0f} s after SIGTERM"
            )
    finally:
        with contextlib.suppress(Exception):
            worker.close()


def test_nothing_of_the_engine_outlives_its_main_process(tmp_path: Path) -> None:
    """systemd in the lab's hosts is not told when a unit's last process ends: a helper that outlived
    the engine's main process, even by milliseconds, held the unit's stop for TimeoutStopSec. So when
    the main process (alone, as KillMode=mixed signals it) has exited, its process group is empty."""
    port = free_port()
    log = tmp_path / "engine.log"
    proc = _spawn(_engine_args(port, None, []), log)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}/health", log)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=3 * EXITS_WITHIN_S) == 0, log.read_text()
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)  # any process left in the engine's group would take the signal
    finally:
        stop_group(proc)
