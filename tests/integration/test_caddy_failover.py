"""Caddy with our rendered Caddyfile keeps serving POSTs when one replica dies.

Real Caddy (Debian's 2.6.2), the role's template rendered for each tier's policy, two upstreams on
loopback that answer with the length of the body they read; after Caddy's first health check one of
them is closed (a killed replica: connection refused), and requests follow at once.
Every request must reach the live one with its whole body, whether it was sent with a Content-Length
or chunked. Without `buffer_requests`, Caddy 2.6.2 retries the POST with a body the transport already
closed ("invalid Read on closed Body"), counts that failure against the live replica too, and after
`max_fails` answers 503 for every request (docs/contracts.md, Load balancer).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from kvoffload.profiles import resolve as r
from tests.unit.roles.render import render, role_defaults

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("caddy") is None, reason="caddy missing (apt: caddy)"),
    pytest.mark.timeout(180),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while size := int(self.rfile.readline().strip(), 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers["Content-Length"]))
        answer = str(len(body)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self) -> None:  # the active health check
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _serve() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def live() -> Iterator[int]:
    server = _serve()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _caddy(tmp_path: Path, tier: str, upstreams: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    dep = r.Deployment(
        tier=tier,  # type: ignore[arg-type]
        gpu_vendor="nvidia",
        engine="sim",
        model="m",
        replicas=(
            r.Replica(host="n", address="127.0.0.1", index=0, gpus="0"),
            r.Replica(host="n", address="127.0.0.1", index=1, gpus="1"),
        ),
        lmcache_address="127.0.0.1",
        lb_address="127.0.0.1",
        sim_profile="tiny",
        kv_cache_memory_bytes=1 << 30,
    )
    port = _free_port()
    variables = {
        **role_defaults("caddy"),
        **r.resolve(dep),
        "ansible_host": "127.0.0.1",
        "caddy_upstreams": upstreams,
        "caddy_listen_port": port,
        "caddy_metrics_port": _free_port(),
        "caddy_admin_address": f"127.0.0.1:{_free_port()}",
    }
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(render("caddy", "etc/kvoffload/caddy/Caddyfile.j2", variables))
    proc = subprocess.Popen(
        ["caddy", "run", "--adapter", "caddyfile", "--config", str(caddyfile)],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "caddy.log").open("wb"),
        env={"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, port
        except OSError:
            assert proc.poll() is None, (tmp_path / "caddy.log").read_text()[-2000:]
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("caddy did not listen within 30 s")


def _chunks(data: bytes) -> Iterator[bytes]:
    yield data[: len(data) // 2]
    yield data[len(data) // 2 :]


@pytest.mark.parametrize("tier", ["gpu", "cpu"])
def test_posts_survive_a_dead_replica(tmp_path: Path, live: int, tier: str) -> None:
    victim = _serve()
    victim_port = int(victim.server_address[1])
    proc, port = _caddy(tmp_path, tier, [f"127.0.0.1:{victim_port}", f"127.0.0.1:{live}"])
    body = b'{"messages": "' + b"x" * 50_000 + b'"}'
    try:
        # Both replicas pass Caddy's first active health check; then one is killed. The next check is
        # a health interval (10 s) away, so until then Caddy still dials the dead one.
        time.sleep(1.0)
        victim.shutdown()
        victim.server_close()
        answers = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            for i in range(12):
                headers = {"X-User-Id": f"user-{i}"}
                if i % 2:
                    resp = client.post("/v1/chat/completions", content=_chunks(body), headers=headers)
                else:
                    resp = client.post("/v1/chat/completions", content=body, headers=headers)
                answers.append((resp.status_code, resp.text))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert answers == [(200, str(len(body)))] * 12, (tmp_path / "caddy.log").read_text()[-3000:]
