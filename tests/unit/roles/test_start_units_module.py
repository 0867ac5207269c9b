"""plugins/modules/kvoffload_start_units.py: what it enables, restarts and starts (one systemctl call
each) and how it waits for the units' /health, run as Ansible runs it against a stand-in systemctl
with state and a local HTTP server. The vllm role starts its replicas through it in the lab tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.unit.roles.render import collection_module, run_collection_module
from tests.unit.roles.systemctl_standin import calls, stateful_systemctl


def _unit(active: str, file_state: str = "enabled") -> dict[str, str]:
    return {"LoadState": "loaded", "ActiveState": active, "UnitFileState": file_state, "Result": "success"}


def run_module(tmp_path: Path, bindir: Path, args: dict[str, object]) -> dict[str, Any]:
    return run_collection_module("kvoffload_start_units", tmp_path, bindir, args)


class _Health(BaseHTTPRequestHandler):
    answers: ClassVar[list[int]] = []  # popped per request; 200 once empty

    def do_GET(self) -> None:
        code = self.answers.pop(0) if self.answers else 200
        self.send_response(code)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def health() -> Iterator[tuple[str, type[_Health]]]:
    handler = type("Health", (_Health,), {"answers": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health", handler
    server.shutdown()


@pytest.fixture
def down(health: tuple[str, type[_Health]]) -> str:
    """A health URL that answers 503, always."""
    url, handler = health
    handler.answers = [503] * 1000
    return url


def test_the_plan_enables_restarts_and_starts_only_what_needs_it() -> None:
    mod = collection_module("kvoffload_start_units")
    states = {
        "a": _unit("active"),
        "b": _unit("inactive", "disabled"),
        "c": _unit("failed"),
        "d": _unit("activating"),  # starting already: a start would do nothing
    }
    assert mod.plan(["a", "b", "c", "d"], ["a"], states) == (["b"], ["a"], ["b", "c"])


def test_one_call_per_verb_then_a_wait_until_every_url_answers(
    tmp_path: Path, health: tuple[str, type[_Health]]
) -> None:
    url, handler = health
    handler.answers = [503, 503]  # the replicas load their model: two polls before a 200
    units = {
        "kvoffload-vllm@0.service": _unit("active"),
        "kvoffload-vllm@1.service": _unit("inactive", "disabled"),
        "kvoffload-vllm@2.service": _unit("inactive"),
    }
    bindir, log = stateful_systemctl(tmp_path, units)
    args = {
        "units": list(units),
        "restart": ["kvoffload-vllm@0.service"],
        "wait": {"kvoffload-vllm@0.service": url, "kvoffload-vllm@1.service": url + "?1"},
        "interval": 0.05,
    }
    result = run_module(tmp_path, bindir, args)
    assert result["changed"] is True and not result.get("failed"), result
    assert calls(log) == [
        "enable kvoffload-vllm@1.service",
        "restart kvoffload-vllm@0.service",
        "start kvoffload-vllm@1.service kvoffload-vllm@2.service",
    ]
    assert result["started"] == ["kvoffload-vllm@1.service", "kvoffload-vllm@2.service"]
    assert handler.answers == []  # it polled until the 200s came
    # everything enabled and running, nothing to restart: no call but `show`, nothing changed
    again = run_module(tmp_path, bindir, {**args, "restart": []})
    assert again["changed"] is False and len(calls(log)) == 3


def test_a_unit_that_fails_while_starting_ends_the_wait_and_is_named_with_its_journal(
    tmp_path: Path, down: str
) -> None:
    bindir, _log = stateful_systemctl(
        tmp_path,
        {"kvoffload-vllm@0.service": _unit("inactive")},
        on_start={"kvoffload-vllm@0.service": "failed"},
        journal={"kvoffload-vllm@0.service": ["CUDA error: out of memory", "x" * 1000]},
    )
    args = {
        "units": ["kvoffload-vllm@0.service"],
        "wait": {"kvoffload-vllm@0.service": down},
        "timeout": 60,
        "interval": 0.05,
    }
    result = run_module(tmp_path, bindir, args)
    assert result["failed"] is True and result["waited_s"] < 30
    assert result["msg"].startswith("kvoffload-vllm@0.service failed (Result=exit-code)")
    assert "HTTP 503" in result["msg"] and "journalctl -u kvoffload-vllm@0.service" in result["msg"]
    tail = result["msg"].split("last 2 lines of kvoffload-vllm@0.service's journal:\n")[1]
    assert tail.splitlines() == ["CUDA error: out of memory", "x" * 400]  # a line is cut at 400 characters


def test_a_unit_that_exits_at_start_is_refused_with_the_end_of_its_journal(tmp_path: Path) -> None:
    # Caddy exits before it tells systemd it is ready: `systemctl start` exits 1 with a pointer to the
    # journal; the error carries the journal's last lines, since the lab is gone when one reads it.
    said = ["starting caddy", "Error: loading initial config: listen tcp :8100: bind: address already in use"]
    bindir, log = stateful_systemctl(
        tmp_path,
        {"kvoffload-caddy.service": _unit("inactive"), "kvoffload-lmcache.service": _unit("inactive")},
        refuse=["kvoffload-caddy.service", "kvoffload-lmcache.service"],
        journal={"kvoffload-caddy.service": said},
    )
    result = run_module(tmp_path, bindir, {"units": ["kvoffload-caddy.service"]})
    assert result["failed"] is True and calls(log) == ["start kvoffload-caddy.service"]
    assert result["msg"].startswith("systemctl start exited 1: Job for kvoffload-caddy.service failed")
    assert result["msg"].endswith("last 2 lines of kvoffload-caddy.service's journal:\n" + "\n".join(said)), (
        result["msg"]
    )
    # a unit that left no journal adds nothing to the error
    other = run_module(tmp_path, bindir, {"units": ["kvoffload-lmcache.service"]})
    assert other["failed"] is True and "journal" not in other["msg"], other


def test_a_failed_start_that_systemd_restarts_is_waited_for_and_kept(
    tmp_path: Path, health: tuple[str, type[_Health]]
) -> None:
    # A unit with Restart=on-failure whose first try failed in a control process: `systemctl start`
    # exits 1, systemd starts it again after RestartSec; the wait decides, the failure is kept.
    url, handler = health
    handler.answers = [503]  # down while systemd waits out RestartSec, then up
    units = {"a.service": _unit("inactive"), "b.service": _unit("inactive")}
    said = ["b.service: Control process exited, code=exited, status=1/FAILURE"]
    bindir, log = stateful_systemctl(
        tmp_path, units, refuse=["b.service"], auto_restart=["b.service"], journal={"b.service": said}
    )
    args = {"units": ["a.service", "b.service"], "wait": {"b.service": url}, "interval": 0.05}
    result = run_module(tmp_path, bindir, args)
    assert not result.get("failed"), result
    assert calls(log) == ["start a.service b.service"] and handler.answers == []
    assert [r["units"] for r in result["restarting"]] == ["b.service"]
    assert result["restarting"][0]["error"].endswith("journal:\n" + said[0])
    assert "b.service failed to start and systemd starts it again" in str(result["warnings"]), result
    assert result["nrestarts"] == {"b.service": 1}  # the orchestrator's baseline for the cell's faults


def test_a_unit_that_systemd_restarts_again_and_again_is_given_up_before_the_timeout(
    tmp_path: Path, down: str
) -> None:
    bindir, _log = stateful_systemctl(
        tmp_path,
        {"a.service": _unit("inactive")},
        refuse=["a.service"],
        auto_restart=["a.service"],
        keeps_failing=["a.service"],
        journal={"a.service": ["the pre-start check refused"]},
    )
    args = {"units": ["a.service"], "wait": {"a.service": down}, "timeout": 600, "interval": 0.05}
    result = run_module(tmp_path, bindir, args)
    assert result["failed"] is True and result["waited_s"] < 60, result
    assert result["msg"].startswith("a.service restarted by systemd 3 times meanwhile: ")
    assert result["msg"].endswith("journal:\nthe pre-start check refused")


def test_a_failed_start_is_an_error_where_nothing_would_watch_the_restart(tmp_path: Path) -> None:
    bindir, _log = stateful_systemctl(
        tmp_path, {"a.service": _unit("inactive")}, refuse=["a.service"], auto_restart=["a.service"]
    )
    result = run_module(tmp_path, bindir, {"units": ["a.service"]})  # no wait URL for it
    assert result["failed"] is True and result["msg"].startswith("systemctl start exited 1")
    assert result["restarting"] == []


def test_a_url_that_never_answers_fails_at_the_timeout(tmp_path: Path) -> None:
    bindir, _log = stateful_systemctl(tmp_path, {"x.service": _unit("active")})
    args = {"units": ["x.service"], "wait": {"x.service": "http://127.0.0.1:9/health"}, "timeout": 0.3,
            "interval": 0.05}  # fmt: skip
    result = run_module(tmp_path, bindir, args)
    assert result["failed"] is True and result["changed"] is False
    assert result["msg"].startswith("no 200 within 0.3 s: http://127.0.0.1:9/health last answered ")


def test_check_mode_names_what_it_would_do_and_does_nothing(tmp_path: Path) -> None:
    bindir, log = stateful_systemctl(tmp_path, {"a.service": _unit("inactive", "disabled")})
    args = {
        "units": ["a.service", "b.service"],  # b: not installed yet, as on a fresh host in check mode
        "wait": {"a.service": "http://127.0.0.1:9/health"},
        "_ansible_check_mode": True,
    }
    result = run_module(tmp_path, bindir, args)
    assert result["changed"] is True and result["started"] == ["a.service", "b.service"]
    assert calls(log) == []
    # outside check mode a unit that is not installed is an error that names it
    result = run_module(tmp_path, bindir, {"units": ["a.service", "b.service"]})
    assert result["failed"] is True and result["msg"].startswith("no such unit: b.service")


def test_a_unit_file_change_reloads_first_and_every_port_of_a_unit_is_waited_for(
    tmp_path: Path, health: tuple[str, type[_Health]]
) -> None:
    url, handler = health
    handler.answers = [503]  # /healthcheck: one poll before the 200
    port = int(url.split(":")[2].split("/")[0])
    bindir, log = stateful_systemctl(tmp_path, {"kvoffload-lmcache.service": _unit("inactive")})
    unit = "kvoffload-lmcache.service"
    args = {
        "units": [unit],
        "restart": [unit],  # its flags changed: a stopped unit is started once by the restart
        "daemon_reload": True,
        "wait": {unit: [f"tcp://127.0.0.1:{port}", url]},  # the ZMQ port and the HTTP API
        "interval": 0.05,
    }
    result = run_module(tmp_path, bindir, args)
    assert result["changed"] is True and not result.get("failed"), result
    assert calls(log) == ["daemon-reload", "restart kvoffload-lmcache.service"]
    assert handler.answers == []
    # a port that accepts nothing fails the wait and is named
    closed = {**args, "wait": {unit: ["tcp://127.0.0.1:9", url]}, "timeout": 0.3, "daemon_reload": False}
    failed = run_module(tmp_path, bindir, closed)
    assert (
        failed["failed"] is True and "tcp://127.0.0.1:9 last answered ConnectionRefusedError" in failed["msg"]
    )


def test_one_first_starts_one_unit_and_waits_for_it_before_the_rest(tmp_path: Path) -> None:
    units = {f"kvoffload-vllm@{i}.service": _unit("inactive") for i in range(3)}
    bindir, log = stateful_systemctl(tmp_path, units)
    seen: list[list[str]] = []  # the systemctl calls made when each /health poll came

    class Recording(_Health):
        answers: ClassVar[list[int]] = [503, 503]  # the first replica compiles: two polls before a 200

        def do_GET(self) -> None:
            seen.append(calls(log))
            super().do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/health"
        args = {
            "units": list(units),
            "restart": ["kvoffload-vllm@1.service"],
            "wait": {u: f"{url}?{i}" for i, u in enumerate(units)},
            "interval": 0.05,
            "one_first": True,
        }
        result = run_module(tmp_path, bindir, args)
    finally:
        server.shutdown()
    assert result["changed"] is True and not result.get("failed"), result
    # The first to (re)start in `units` order (a restart counts) goes alone, the rest after its 200.
    assert result["first"] == "kvoffload-vllm@0.service"
    assert calls(log) == [
        "start kvoffload-vllm@0.service",
        "restart kvoffload-vllm@1.service",
        "start kvoffload-vllm@2.service",
    ]
    first_polls = [s for s in seen if len(s) == 1]
    assert len(first_polls) == 3  # two 503s and the 200, all before the others started
    assert len(seen) == 3 + 3  # then one 200 from each of the three URLs
    # Without it (and with one unit to start) there is one step, as before.
    mod = collection_module("kvoffload_start_units")
    assert mod.stages(False, ["a", "b", "c"], ["a"], ["b", "c"]) == [(["a"], ["b", "c"])]
    assert mod.stages(True, ["a", "b"], [], ["b"]) == [([], ["b"])]
    assert mod.stages(True, ["a", "b", "c"], ["c"], ["a", "b"]) == [([], ["a"]), (["c"], ["b"])]
