"""plugins/modules/kvoffload_unit_states.py: which units it asks for and what it keeps of `systemctl
show`, run as Ansible runs it (a JSON arguments file) against a stand-in systemctl on PATH. The collect
role calls it on the virtual lab's hosts in the lab tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.unit.roles.render import collection_module, run_collection_module
from tests.unit.roles.systemctl_standin import calls, stateful_systemctl

# Two blocks as systemd 252 prints them: a loaded replica and a unit that is not installed.
SHOW = (
    "Id=kvoffload-vllm@0.service\nLoadState=loaded\nActiveState=active\nNRestarts=1\nResult=success\n"
    "\n"
    "Id=kvoffload-caddy.service\nLoadState=not-found\nActiveState=inactive\nNRestarts=0\n"
)


def run_module(tmp_path: Path, bindir: Path, args: dict[str, object]) -> dict[str, Any]:
    return run_collection_module("kvoffload_unit_states", tmp_path, bindir, args)


def test_replica_units_follow_the_env_files_in_number_order() -> None:
    mod = collection_module("kvoffload_unit_states")
    names = ["replica-10.env", "replica-2.env", "replica-x.env", "lmcache.env", "replica-0.env.bak"]
    assert mod.replica_units(names, "kvoffload-vllm@{}.service") == [
        "kvoffload-vllm@2.service",
        "kvoffload-vllm@10.service",
    ]


def test_parse_show_keeps_loaded_units_with_every_property() -> None:
    parsed = collection_module("kvoffload_unit_states").parse_show(SHOW)
    assert parsed == {
        "kvoffload-vllm@0.service": {
            "Id": "kvoffload-vllm@0.service",
            "LoadState": "loaded",
            "ActiveState": "active",
            "NRestarts": "1",
            "Result": "success",
        }
    }


def test_the_module_asks_systemctl_once_for_units_and_replicas(tmp_path: Path) -> None:
    replicas = tmp_path / "vllm"
    replicas.mkdir()
    (replicas / "replica-0.env").write_text("")
    (replicas / "replica-1.env").write_text("")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    systemctl = bindir / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncat <<"EOF"\n{SHOW}EOF\n')
    systemctl.chmod(0o755)
    result = run_module(
        tmp_path,
        bindir,
        {
            "units": ["kvoffload-caddy.service"],
            "replica_dir": str(replicas),
            "properties": ["ActiveState", "NRestarts", "Id"],
        },
    )
    assert result["changed"] is False
    assert result["asked"] == [
        "kvoffload-caddy.service",
        "kvoffload-vllm@0.service",
        "kvoffload-vllm@1.service",
    ]
    assert list(result["units"]) == ["kvoffload-vllm@0.service"]
    assert calls.read_text().split() == [
        "show",
        "--property=Id,LoadState,ActiveState,SubState,NRestarts",
        "--",
        "kvoffload-caddy.service",
        "kvoffload-vllm@0.service",
        "kvoffload-vllm@1.service",
    ]


def test_the_module_fails_when_systemctl_does(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text("#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n")
    (bindir / "systemctl").chmod(0o755)
    result = run_module(
        tmp_path, bindir, {"units": ["a.service"], "replica_dir": str(tmp_path / "none"), "properties": []}
    )
    assert result["failed"] is True
    assert "Failed to connect to bus" in result["msg"]
    assert result["asked"] == ["a.service"]


def test_a_unit_waiting_to_restart_is_read_again_until_it_has_restarted(tmp_path: Path) -> None:
    # the first read catches the cache server between its crash and its restart (RestartSec), the
    # second one after it: what is recorded is the restart, not a unit that looks dead
    bindir = tmp_path / "bin"
    bindir.mkdir()
    reads = tmp_path / "reads"
    waiting = "Id=kvoffload-lmcache.service\nLoadState=loaded\nActiveState=activating\nSubState=auto-restart\nNRestarts=0"
    restarted = (
        "Id=kvoffload-lmcache.service\nLoadState=loaded\nActiveState=active\nSubState=running\nNRestarts=1"
    )
    (bindir / "systemctl").write_text(
        f'#!/bin/sh\necho x >> {reads}\nif [ "$(wc -l < {reads})" -lt 2 ]; then printf "{waiting}\\n"; '
        f'else printf "{restarted}\\n"; fi\n'
    )
    (bindir / "systemctl").chmod(0o755)
    args = {
        "units": ["kvoffload-lmcache.service"],
        "replica_dir": str(tmp_path / "none"),
        "properties": ["NRestarts"],
    }
    result = run_module(tmp_path, bindir, args)
    assert result["units"]["kvoffload-lmcache.service"]["NRestarts"] == "1"
    assert result["unsettled"] == [] and len(reads.read_text().split()) == 2
    # a unit that stays in its transition is recorded as it is once `settle` runs out
    reads.write_text("")
    (bindir / "systemctl").write_text(f'#!/bin/sh\necho x >> {reads}\nprintf "{waiting}\\n"\n')
    result = run_module(tmp_path, bindir, {**args, "settle": 1.0})
    assert result["units"]["kvoffload-lmcache.service"]["SubState"] == "auto-restart"
    assert result["unsettled"] == ["kvoffload-lmcache.service"]
    assert 2 <= len(reads.read_text().split()) <= 4  # every 0.5 s for 1 s


def _loaded(active: str, result: str = "success") -> dict[str, str]:
    return {"LoadState": "loaded", "ActiveState": active, "SubState": "x", "Result": result}


def test_stop_stops_the_running_units_in_one_call_and_reads_how_they_stopped(tmp_path: Path) -> None:
    replicas = tmp_path / "vllm"
    replicas.mkdir()
    for i in (0, 1, 2):
        (replicas / f"replica-{i}.env").write_text("")
    units = {
        "kvoffload-vllm@0.service": _loaded("active"),
        "kvoffload-vllm@1.service": _loaded("inactive", "timeout"),  # an earlier cell's stop, not this one's
        "kvoffload-vllm@2.service": _loaded("activating"),  # still loading its model: stopped too
    }
    bindir, log = stateful_systemctl(tmp_path, units, on_stop={"kvoffload-vllm@2.service": "timeout"})
    args = {
        "units": ["kvoffload-gpu-telemetry.service"],
        "replica_dir": str(replicas),
        "properties": ["Result"],
        "stop": True,
        "settle": 0,
    }
    result = run_module(tmp_path, bindir, args)
    assert result["changed"] is True
    assert result["stopped"] == ["kvoffload-vllm@0.service", "kvoffload-vllm@2.service"]
    assert calls(log) == ["stop kvoffload-vllm@0.service kvoffload-vllm@2.service"]
    assert {u: p["Result"] for u, p in result["units"].items()} == {
        "kvoffload-vllm@0.service": "success",
        "kvoffload-vllm@1.service": "timeout",
        "kvoffload-vllm@2.service": "timeout",
    }
    assert all(p["ActiveState"] == "inactive" for p in result["units"].values())
    # nothing runs any more: no stop call, nothing changed
    again = run_module(tmp_path, bindir, args)
    assert again["changed"] is False and again["stopped"] == []
    assert len(calls(log)) == 1


def test_stop_in_check_mode_names_what_it_would_stop_and_stops_nothing(tmp_path: Path) -> None:
    bindir, log = stateful_systemctl(tmp_path, {"kvoffload-gpu-telemetry.service": _loaded("active")})
    args = {
        "units": ["kvoffload-gpu-telemetry.service"],
        "replica_dir": str(tmp_path / "none"),
        "properties": ["Result"],
        "stop": True,
        "_ansible_check_mode": True,
    }
    result = run_module(tmp_path, bindir, args)
    assert result["changed"] is True and result["stopped"] == ["kvoffload-gpu-telemetry.service"]
    assert not log.exists()
    assert result["units"]["kvoffload-gpu-telemetry.service"]["ActiveState"] == "active"
