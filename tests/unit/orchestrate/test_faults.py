"""Faults of a cell: outages seen by polling, restarted or dead units, and what happened after them."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from kvoffload.orchestrate.cell.faults import Fault, TargetWatch, fault_effects, unit_faults


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"vllm:num_requests_running 0\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Server:
    """A metrics endpoint that can be stopped and started again on the same port."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.httpd: ThreadingHTTPServer | None = None

    def start(self) -> None:
        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _Metrics)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        assert self.httpd is not None
        self.httpd.shutdown()
        self.httpd.server_close()
        self.httpd = None


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    srv.start()
    yield srv
    if srv.httpd is not None:
        srv.stop()


def test_an_outage_is_opened_and_closed_with_its_times(server: _Server) -> None:
    url = f"http://127.0.0.1:{server.port}/metrics"
    watch = TargetWatch(
        [{"name": "vllm-h2-1", "url": url}, {"name": "node-h2", "url": "http://127.0.0.1:9/x"}],
        timeout_s=1.0,
    )
    assert list(watch.targets) == ["vllm-h2-1"], "only engines and lmcache are watched"
    with httpx.Client(timeout=1.0) as client:
        watch.poll_once(client)
        assert watch.faults() == []
        server.stop()
        watch.poll_once(client)
        watch.poll_once(client)  # still down: one outage, not two
        (still_open,) = watch.faults()
        assert still_open.until is None and "until the replay ended" in still_open.reason()
        server.start()
        watch.poll_once(client)
    (fault,) = watch.faults()
    assert fault.target == "vllm-h2-1" and fault.kind == "unreachable"
    assert fault.at is not None and fault.until is not None and fault.until >= fault.at
    assert fault.answered is not None and fault.answered <= fault.at  # the fault came after that poll
    assert "ConnectError" in fault.detail
    assert fault.reason().startswith("vllm-h2-1 unreachable at ")


def test_the_watch_thread_polls_until_stopped(server: _Server) -> None:
    url = f"http://127.0.0.1:{server.port}/metrics"
    with TargetWatch([{"name": "lmcache", "url": url}], interval_s=0.05) as watch:
        server.stop()
        done = threading.Event()
        while not watch.faults():
            done.wait(0.05)
    assert watch.faults()[0].target == "lmcache"


def _state(active: str = "active", restarts: int = 0) -> dict[str, str]:
    return {"ActiveState": active, "SubState": "running" if active == "active" else "dead",
            "Result": "success" if active == "active" else "signal", "NRestarts": str(restarts),
            "ExecMainStatus": "0" if active == "active" else "9"}  # fmt: skip


def test_unit_faults_only_for_the_cells_units() -> None:
    units = {
        "h2--kvoffload-vllm@0.service": _state(),
        "h2--kvoffload-vllm@1.service": _state(restarts=1),
        "h2--kvoffload-lmcache.service": _state(active="inactive"),  # a gpu cell runs no lmcache
        "h2--prometheus-node-exporter.service": _state(restarts=4),
    }
    expected = ["h2--kvoffload-vllm@0.service", "h2--kvoffload-vllm@1.service", "h2--kvoffload-caddy.service"]
    faults = unit_faults(units, expected)
    assert [(f.target, f.kind) for f in faults] == [
        ("kvoffload-caddy.service on h2", "not running"),
        ("kvoffload-vllm@1.service on h2", "restarted"),
    ]
    assert "1 time(s)" in faults[1].detail
    dead = unit_faults(
        {"h2--kvoffload-lmcache.service": _state(active="failed")}, ["h2--kvoffload-lmcache.service"]
    )
    assert dead[0].kind == "not running" and "result signal" in dead[0].detail


def test_fault_effects_count_what_happened_from_the_first_fault(tmp_path: Path) -> None:
    records = [
        {"t_start": 100.0, "latency_s": 1.0, "status": "ok", "replica": "a", "error": None},  # before
        {"t_start": 108.0, "latency_s": 3.0, "status": "error", "replica": "b", "error": "stream cut"},
        {"t_start": 109.0, "latency_s": None, "status": "error", "replica": "b", "error": "stream cut"},
        {"t_start": 112.0, "latency_s": 1.0, "status": "ok", "replica": "a", "error": None},
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"truncated')
    faults = [Fault("vllm-h2-1", "unreachable", "ConnectError", at=110.0, until=130.0),
              Fault("kvoffload-vllm@1.service on h2", "restarted", "1 time(s)")]  # fmt: skip
    effects = fault_effects(path, faults)
    assert effects == {
        "since": 110.0,
        "requests_ok": {"a": 1},
        "requests_failed": {"b": 2},
        "errors": [{"error": "stream cut", "count": 2}],
    }
    assert fault_effects(path, faults[1:]) is None, "no timed fault: no window to count"
    # the window opens at the last poll that still answered: a stream the fault cut at 109.5 s, seen
    # by the poll at 110 s, counts
    seen_late = [Fault("vllm-h2-1", "unreachable", "ConnectError", at=110.0, answered=109.2)]
    records.append({"t_start": 109.3, "latency_s": 0.2, "status": "error", "replica": "b", "error": "cut"})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    late = fault_effects(path, seen_late)
    assert late is not None and late["since"] == 109.2 and late["requests_failed"] == {"b": 3}


def test_a_stopped_watch_records_no_outage(server: _Server) -> None:
    url = f"http://127.0.0.1:{server.port}/metrics"
    watch = TargetWatch([{"name": "lmcache", "url": url}], timeout_s=1.0)
    with httpx.Client(timeout=1.0) as client:
        watch.poll_once(client)
        watch.stop()  # a teardown begins: its stops are not outages
        server.stop()
        watch.poll_once(client)
    assert watch.faults() == []
