"""plugins/modules/kvoffload_start_units.py: what it enables, restarts and starts (one systemctl call
each) and how it waits for the units' /health, run as Ansible runs it against a stand-in systemctl
with state and a local HTTP server. The vllm role starts its replicas through it in the lab tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.unit.roles.render import REPO, collection_module

# `show` prints the asked units from a JSON file (absent: not-found); enable/restart/start log their
# arguments and change the file as systemd would; "on_start" names units that fail as they start.
SYSTEMCTL = """#!{python}
import json, sys
path, log = {state!r}, {log!r}
state = json.load(open(path))
args = sys.argv[1:]
units = args[args.index("--") + 1:]
if args[0] != "show":
    open(log, "a").write(args[0] + " " + " ".join(units) + "\\n")
    for unit in units:
        if args[0] == "enable":
            state[unit]["UnitFileState"] = "enabled"
        else:
            state[unit]["ActiveState"] = state["on_start"].get(unit, "active")
            state[unit]["Result"] = "exit-code" if state[unit]["ActiveState"] == "failed" else "success"
    json.dump(state, open(path, "w"))
    sys.exit(0)
blocks = []
for unit in units:
    props = state.get(unit, {{"LoadState": "not-found", "ActiveState": "inactive"}})
    blocks.append("\\n".join(f"{{k}}={{v}}" for k, v in {{"Id": unit, **props}}.items()))
print("\\n\\n".join(blocks))
"""


def _unit(active: str, file_state: str = "enabled") -> dict[str, str]:
    return {"LoadState": "loaded", "ActiveState": active, "UnitFileState": file_state, "Result": "success"}


def _systemctl(
    tmp_path: Path, units: dict[str, dict[str, str]], on_start: dict[str, str] | None = None
) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "state.json").write_text(json.dumps({**units, "on_start": on_start or {}}))
    tool = bindir / "systemctl"
    tool.write_text(
        SYSTEMCTL.format(python=sys.executable, state=str(tmp_path / "state.json"), log=str(tmp_path / "log"))
    )
    tool.chmod(0o755)
    return bindir


def run_module(tmp_path: Path, bindir: Path, args: dict[str, object]) -> dict[str, Any]:
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    out = subprocess.run(
        [sys.executable, str(REPO / "plugins" / "modules" / "kvoffload_start_units.py"), str(path)],
        env={**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
    )
    return dict(json.loads(out.stdout))


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


def _log(tmp_path: Path) -> list[str]:
    log = tmp_path / "log"
    return log.read_text().splitlines() if log.exists() else []


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
    bindir = _systemctl(tmp_path, units)
    args = {
        "units": list(units),
        "restart": ["kvoffload-vllm@0.service"],
        "wait": {"kvoffload-vllm@0.service": url, "kvoffload-vllm@1.service": url + "?1"},
        "interval": 0.05,
    }
    result = run_module(tmp_path, bindir, args)
    assert result["changed"] is True and not result.get("failed"), result
    assert _log(tmp_path) == [
        "enable kvoffload-vllm@1.service",
        "restart kvoffload-vllm@0.service",
        "start kvoffload-vllm@1.service kvoffload-vllm@2.service",
    ]
    assert result["started"] == ["kvoffload-vllm@1.service", "kvoffload-vllm@2.service"]
    assert handler.answers == []  # it polled until the 200s came
    # everything enabled and running, nothing to restart: no call but `show`, nothing changed
    again = run_module(tmp_path, bindir, {**args, "restart": []})
    assert again["changed"] is False and len(_log(tmp_path)) == 3


def test_a_unit_that_fails_while_starting_ends_the_wait_and_is_named(
    tmp_path: Path, health: tuple[str, type[_Health]]
) -> None:
    url, handler = health
    handler.answers = [503] * 1000
    bindir = _systemctl(
        tmp_path, {"kvoffload-vllm@0.service": _unit("inactive")}, {"kvoffload-vllm@0.service": "failed"}
    )
    args = {
        "units": ["kvoffload-vllm@0.service"],
        "wait": {"kvoffload-vllm@0.service": url},
        "timeout": 60,
        "interval": 0.05,
    }
    result = run_module(tmp_path, bindir, args)
    assert result["failed"] is True and result["waited_s"] < 30
    assert result["msg"].startswith("kvoffload-vllm@0.service failed (Result=exit-code)")
    assert "HTTP 503" in result["msg"] and "journalctl -u kvoffload-vllm@0.service" in result["msg"]


def test_a_url_that_never_answers_fails_at_the_timeout(tmp_path: Path) -> None:
    bindir = _systemctl(tmp_path, {"x.service": _unit("active")})
    args = {"units": ["x.service"], "wait": {"x.service": "http://127.0.0.1:9/health"}, "timeout": 0.3,
            "interval": 0.05}  # fmt: skip
    result = run_module(tmp_path, bindir, args)
    assert result["failed"] is True and result["changed"] is False
    assert result["msg"].startswith("no 200 within 0.3 s: http://127.0.0.1:9/health last answered ")


def test_check_mode_names_what_it_would_do_and_does_nothing(tmp_path: Path) -> None:
    bindir = _systemctl(tmp_path, {"a.service": _unit("inactive", "disabled")})
    args = {
        "units": ["a.service", "b.service"],  # b: not installed yet, as on a fresh host in check mode
        "wait": {"a.service": "http://127.0.0.1:9/health"},
        "_ansible_check_mode": True,
    }
    result = run_module(tmp_path, bindir, args)
    assert result["changed"] is True and result["started"] == ["a.service", "b.service"]
    assert _log(tmp_path) == []
    # outside check mode a unit that is not installed is an error that names it
    result = run_module(tmp_path, bindir, {"units": ["a.service", "b.service"]})
    assert result["failed"] is True and result["msg"].startswith("no such unit: b.service")
