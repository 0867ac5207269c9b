"""Plain Ansible: the phase playbooks work without the Python wrapper (issue 14).

`--tags` selections run on their own (preflight always, teardown alone, `service` without the
variables `configure` registers, `install` with GPU detection), the inventory preflight survives
`--limit` and runs once on the controller, a failed host stops a deploy, and the vllm GPU check lets a
`--check` run on a fresh host through. ansible-playbook runs against fake inventories: `--list-tasks`,
or plays whose tasks only assert or stat on this machine (local connection).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.ansible import ansible_playbook as run_playbook

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EXAMPLE = REPO / "inventories" / "example" / "hosts.yml"


def ansible_playbook(*argv: str, extravars: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    # facts only where a play asks: these plays assert on inventory
    return run_playbook(
        *argv, extravars=extravars, env={"ANSIBLE_NOCOLOR": "1", "ANSIBLE_GATHERING": "explicit"}
    )


def local_inventory(tmp_path: Path, vllm: dict[str, Any], client: str = "client1") -> Path:
    """Every host on this machine (local connection), one node: the vllm hosts, lmcache and lb the
    first one, and a client."""
    first = next(iter(vllm))
    hosts = {
        name: {"ansible_connection": "local", "ansible_host": "127.0.0.1", **hv} for name, hv in vllm.items()
    }
    hosts[client] = {"ansible_connection": "local", "ansible_host": "127.0.0.1"}
    inv = {
        "all": {
            "hosts": hosts,
            "children": {
                "vllm": {"hosts": dict.fromkeys(vllm)},
                "lmcache": {"hosts": {first: None}},
                "lb": {"hosts": {first: None}},
                "client": {"hosts": {client: None}},
            },
        }
    }
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def listed(out: str) -> dict[str, list[str]]:
    """`--list-tasks` output as {play name: [task names]}."""
    plays: dict[str, list[str]] = {}
    current = ""
    for line in out.splitlines():
        play = re.match(r"\s*play #\d+ \([^)]*\): (.*?)\tTAGS", line)
        if play:
            current = play.group(1)
            plays[current] = []
        elif current and "\tTAGS:" in line and line.strip() != "tasks:":
            plays[current].append(line.split("\t")[0].strip())
    return plays


def test_preflight_runs_once_on_the_controller_under_limit(tmp_path: Path) -> None:
    bad = local_inventory(
        tmp_path, {"gpu1": {"vllm_replicas": [{"index": 0, "gpus": "0"}, {"index": 0, "gpus": "1"}]}}
    )
    # --limit to the client only: a play on `hosts: localhost` would vanish; this one still checks
    result = ansible_playbook("-i", str(bad), "--limit", "client1", "playbooks/preflight.yml")
    assert result.returncode != 0, result.stdout[-2000:]
    assert "vllm_replicas must list replicas with unique `index`" in result.stdout
    good = local_inventory(tmp_path, {"gpu1": {}, "gpu2": {}})
    result = ansible_playbook("-i", str(good), "--limit", "gpu2", "-v", "playbooks/preflight.yml")
    assert result.returncode == 0, result.stdout[-2000:]
    # once, delegated to the controller, not once per host
    assert result.stdout.count("TASK [preflight : Check the inventory groups]") == 1
    assert re.search(r"ok: \[gpu2 -> localhost\]", result.stdout), result.stdout[-2000:]


def test_phase_tags_select_their_phase_with_preflight_and_gpu_detection() -> None:
    install = ansible_playbook("-i", str(EXAMPLE), "playbooks/site.yml", "--list-tasks", "--tags", "install")
    teardown = ansible_playbook(
        "-i", str(EXAMPLE), "playbooks/site.yml", "--list-tasks", "--tags", "teardown"
    )
    assert install.returncode == 0 and teardown.returncode == 0, install.stderr + teardown.stderr
    plays = listed(install.stdout)
    # the inventory checks and every role's own checks run whatever --tags selects
    assert "preflight : Check the inventory groups" in plays["Check the inventory before touching any host"]
    assert "vllm : Check the vllm variables" in plays["The vLLM replicas"]
    # --tags install detects the GPUs first and stops the role where there are none
    gpu = plays["GPU drivers on the vLLM hosts"]
    assert gpu.index("gpu_driver : Install the GPU detection fact") < gpu.index(
        "gpu_driver : Skip the rest of the role"
    )
    assert gpu.index("gpu_driver : Skip the rest of the role") < gpu.index(
        "gpu_driver : Install the NVIDIA driver packages"
    )
    # --tags teardown: the teardown plays, and of the other phases only checks
    plays = listed(teardown.stdout)
    phase = {
        # one module run per host stops every unit of the cell (one systemctl stop)
        "Stop the cell's units": [
            "Stop Caddy, the replicas, the GPU telemetry and lmcache-server where they run",
            "Keep the journal of units that did not stop in time",
            "Wipe the L2 folder",
        ],
        "Give the periodic disk jobs back": ["Unmask their timers and start those that ran"],
    }
    # each play first checks the shared variables (the kvoffload role, first in every play)
    assert all(plays[name][0].startswith("kvoffload : Validating arguments") for name in phase), plays
    assert {name: plays[name][1:] for name in phase} == phase
    others = [t for name, tasks in plays.items() if name not in phase for t in tasks]
    read_only = (" : Check ", "Validating arguments", " : Read ", " : Inspect ", " : Refuse ")
    # an include_role of the preflight role's host checks is listed by its own name, without a role
    included = ("Check the NVIDIA device files and fabric",)
    assert others and all(any(word in t for word in read_only) or t in included for t in others), others


def _names_set_outside_service(role: str) -> set[str]:
    names: set[str] = set()
    for path in (REPO / "roles" / role / "tasks").glob("*.yml"):
        if path.name in ("service.yml", "preflight.yml", "main.yml", "teardown.yml"):
            continue  # preflight runs with every tag (always); teardown is not in main
        for task in yaml.safe_load(path.read_text()) or []:
            if "register" in task:
                names.add(task["register"])
            names.update((task.get("ansible.builtin.set_fact") or {}).keys())
    return names


@pytest.mark.parametrize("role", ["vllm", "lmcache_server", "caddy", "node_exporter"])
def test_service_reads_what_install_and_configure_set_with_a_default(role: str) -> None:
    # `--tags service` runs service.yml without configure.yml or install.yml: what they register is
    # undefined then, and must read as "nothing changed".
    lines = (REPO / "roles" / role / "tasks" / "service.yml").read_text().splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    for name in _names_set_outside_service(role):
        for found in re.finditer(rf"\b{name}\b((?:\.\w+)*)", text):
            after = text[found.end() :]
            assert re.match(r"\s*\|\s*default\(", after), (
                f"roles/{role}/tasks/service.yml: {name} without default"
            )


def test_deploy_stops_every_host_when_one_fails(tmp_path: Path) -> None:
    plays = yaml.safe_load((REPO / "playbooks" / "deploy.yml").read_text())
    servers = [p for p in plays if p["hosts"] in ("lmcache", "vllm", "lb")]
    assert len(servers) == 3 and all(p.get("any_errors_fatal") is True for p in servers)
    # gpu2's replicas are invalid: the vllm play stops gpu1 too, and Caddy never starts routing
    inv = local_inventory(tmp_path, {"gpu1": {}, "gpu2": {"vllm_replicas": [{"index": 0, "gpus": "x"}]}})
    result = ansible_playbook(
        "-i", str(inv), "--check", "playbooks/deploy.yml", "--skip-tags", "quiet",
        extravars={"kvoffload_engine": "sim", "vllm_sim_profile": "tiny", "ansible_become": False},
    )  # fmt: skip
    assert result.returncode != 0
    assert "fatal: [gpu2]" in result.stdout and "must list replicas with unique" in result.stdout
    assert "PLAY [Caddy in front of 2 or more replicas]" not in result.stdout
    assert "TASK [vllm : Install" not in result.stdout


def test_the_vllm_gpu_check_lets_a_check_run_on_a_fresh_host_through(tmp_path: Path) -> None:
    # No detection fact yet (gpu_driver writes it in provision, not in --check): nothing to compare.
    play = [{"hosts": "all", "gather_facts": False, "roles": [{"role": "kvoffload"}, {"role": "vllm"}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    argv = ("-i", "gpu1,", "-c", "local", "--tags", "preflight", str(tmp_path / "play.yml"))
    variables = {"vllm_gpu_telemetry": False}
    checked = ansible_playbook(*argv, "--check", extravars=variables)
    assert checked.returncode == 0, checked.stdout[-2000:]
    # a real run still refuses a host without the GPUs the replicas ask for
    real = ansible_playbook(*argv, extravars=variables)
    assert real.returncode != 0
    assert "the gpu_driver role found 0 GPU(s) on gpu1" in real.stdout


def test_a_plain_cell_run_reaches_only_its_node_and_the_client(tmp_path: Path) -> None:
    # two nodes, each its own lmcache and lb host (as `plan` requires of a lab of several nodes)
    inv = local_inventory(tmp_path, {"gpu1": {}, "gpu2": {}})
    data = yaml.safe_load(inv.read_text())
    for group in ("lmcache", "lb"):
        data["all"]["children"][group]["hosts"] = {"gpu1": None, "gpu2": None}
    inv.write_text(yaml.safe_dump(data))
    cell = {"kvoffload_node": "gpu2", "kvoffload_tier": "cpu"}
    # without --limit the play would rewire gpu1's replicas and Caddy to gpu2's services
    unlimited = ansible_playbook("-i", str(inv), "playbooks/preflight.yml", extravars=cell)
    assert unlimited.returncode != 0
    text = " ".join(unlimited.stdout.split())
    assert "the play also reaches gpu1," in text, unlimited.stdout[-2000:]
    assert "use --limit gpu2,client1" in text
    limited = ansible_playbook(
        "-i", str(inv), "--limit", "gpu2,client1", "playbooks/preflight.yml", extravars=cell
    )
    assert limited.returncode == 0, limited.stdout[-2000:]
    # a node that is no node is named; a whole-lab run (no kvoffload_node, as `run` provisions) passes
    stray = ansible_playbook(
        "-i", str(inv), "--limit", "gpu2,client1", "playbooks/preflight.yml",
        extravars={**cell, "kvoffload_node": "client1"},
    )  # fmt: skip
    assert stray.returncode != 0 and "kvoffload_node client1 is not a host of group vllm" in stray.stdout
    assert ansible_playbook("-i", str(inv), "playbooks/preflight.yml").returncode == 0


def test_a_plain_cell_run_reaches_only_its_own_client_host(tmp_path: Path) -> None:
    # two client hosts: the cell's extravars name gpu2's (replay_client_host); the other would replay
    # the cell a second time
    inv = local_inventory(tmp_path, {"gpu1": {}, "gpu2": {}})
    data = yaml.safe_load(inv.read_text())
    for group in ("lmcache", "lb"):
        data["all"]["children"][group]["hosts"] = {"gpu1": None, "gpu2": None}
    data["all"]["hosts"]["client2"] = {"ansible_connection": "local", "ansible_host": "127.0.0.1"}
    data["all"]["children"]["client"]["hosts"]["client2"] = None
    inv.write_text(yaml.safe_dump(data))
    cell = {"kvoffload_node": "gpu2", "kvoffload_tier": "cpu", "replay_client_host": "client2"}
    both = ansible_playbook(
        "-i", str(inv), "--limit", "gpu2,client1,client2", "playbooks/preflight.yml", extravars=cell
    )  # fmt: skip
    assert both.returncode != 0
    text = " ".join(both.stdout.split())
    assert "the play also reaches client1, " in text and "use --limit gpu2,client2" in text, text[-2000:]
    limited = ansible_playbook(
        "-i", str(inv), "--limit", "gpu2,client2", "playbooks/preflight.yml", extravars=cell
    )  # fmt: skip
    assert limited.returncode == 0, limited.stdout[-2000:]


def test_a_plain_replay_keeps_the_earlier_attempt_and_never_touches_a_done_cell(tmp_path: Path) -> None:
    # the replay role's first tasks on the controller, as site.yml runs them before a replay
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "roles": [{"role": "kvoffload"}],
            "tasks": [{"ansible.builtin.include_role": {"name": "replay", "tasks_from": "attempts.yml"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    cells = tmp_path / "results" / "camp" / "cells"

    def replay(cell: str) -> subprocess.CompletedProcess[str]:
        variables = {"replay_cell_id": cell, "replay_controller_dir": str(cells / cell)}
        argv = ("-i", "client1,", "-c", "local", str(tmp_path / "play.yml"))
        return ansible_playbook(*argv, extravars=variables)

    # an earlier plain run's results: moved whole under attempts/, not overwritten by the next fetch
    (cells / "c1" / "metrics").mkdir(parents=True)
    (cells / "c1" / "requests.jsonl").write_text('{"status": "ok"}\n')
    (cells / "c1" / "metrics" / "vllm-0.jsonl").write_text("{}\n")
    assert replay("c1").returncode == 0
    kept = list((tmp_path / "results" / "camp" / "attempts").iterdir())
    assert [p.name[:3] for p in kept] == ["c1-"] and not (cells / "c1").exists()
    assert (kept[0] / "requests.jsonl").read_text() == '{"status": "ok"}\n'
    # the folder `run` starts a cell with (its cell.json, empty folders) stays
    (cells / "c2" / "units").mkdir(parents=True)
    (cells / "c2" / "cell.json").write_text("{}")
    assert replay("c2").returncode == 0 and (cells / "c2" / "cell.json").is_file()
    # a DONE cell is refused
    (cells / "c3").mkdir()
    (cells / "c3" / "DONE").write_text("")
    done = replay("c3")
    assert done.returncode != 0 and "is DONE: a cell's results are never overwritten" in done.stdout
    assert (cells / "c3" / "DONE").is_file()
