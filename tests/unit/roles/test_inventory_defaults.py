"""Role defaults derived from the inventory alone agree with what kvoffload-lab's resolver passes.

Plain `ansible-playbook` (no extravars) takes the caddy role's upstreams, enabling and policy and the
lmcache_server role's enabling from its defaults: hostvars and the tier. ansible-playbook evaluates
those defaults on each lb/lmcache host of an inventory, for each tier, and they must equal
`cell_extravars` for a cell of that tier on that host's node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.config import load_lab
from kvoffload.orchestrate.cell.deployment import cell_extravars
from kvoffload.orchestrate.installs.wheelhouse import Wheels

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "inventories" / "example" / "hosts.yml"
KEYS = ("caddy_upstreams", "caddy_enabled", "caddy_lb_policy", "lmcache_server_enabled")


def _one_node_caddy_elsewhere(tmp_path: Path) -> Path:
    """The example with one node, Caddy on the client host, a bind address on the node."""
    inv = yaml.safe_load(EXAMPLE.read_text())
    del inv["all"]["hosts"]["gpu02.lab.example"]
    inv["all"]["hosts"]["gpu01.lab.example"]["kvoffload_bind_address"] = "198.51.100.7"
    inv["all"]["hosts"]["gpu01.lab.example"]["vllm_replicas"] = [
        {"index": 0, "gpus": "0"},
        {"index": 3, "gpus": "1"},
    ]
    children = inv["all"]["children"]
    for group in ("vllm", "lmcache"):
        children[group]["hosts"] = {"gpu01.lab.example": None}
    children["lb"]["hosts"] = {"client01.lab.example": None}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def role_defaults_per_tier(inventory: Path, tmp_path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """{(host, tier): the KEYS as the roles' defaults evaluate them on that host}."""
    play = [
        {
            "hosts": "lb:lmcache",
            "gather_facts": False,
            "vars_files": [
                str(REPO / "roles" / r / "defaults" / "main.yml") for r in ("kvoffload", "caddy", "lmcache_server")
            ],
            "tasks": [
                {
                    "ansible.builtin.debug": {
                        "msg": "{{ {" + ", ".join(f"'{k}': {k}" for k in KEYS) + "} }}"
                    },
                    "vars": {"kvoffload_tier": "{{ item }}"},
                    "loop": ["gpu", "cpu", "nvme"],
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json")
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory),
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    task = json.loads(result.stdout)["plays"][0]["tasks"][0]
    return {(host, r["item"]): r["msg"] for host, res in task["hosts"].items() for r in res["results"]}


@pytest.mark.parametrize("variant", ["example", "one node, caddy elsewhere"])
def test_inventory_derived_defaults_equal_the_resolver(variant: str, tmp_path: Path) -> None:
    inventory = EXAMPLE if variant == "example" else _one_node_caddy_elsewhere(tmp_path)
    evaluated = role_defaults_per_tier(inventory, tmp_path)
    lab = load_lab(inventory, None)
    wheels = Wheels(tmp_path / "k.whl", None)
    checked = 0
    for node in lab.nodes:
        for tier in ("gpu", "cpu", "nvme"):
            cell = next(c for c in lab.cells if c.tier == tier)
            want = cell_extravars(lab, cell, tmp_path, wheels, node)
            lb, lmcache = lab.node_lb(node), lab.node_lmcache(node)
            assert lb is not None and lmcache is not None
            got = evaluated[(lb.name, tier)]
            assert {k: got[k] for k in KEYS[:3]} == {k: want[k] for k in KEYS[:3]}, (node.name, tier)
            assert evaluated[(lmcache.name, tier)]["lmcache_server_enabled"] == want["lmcache_server_enabled"]
            checked += 1
    assert checked == 3 * len(lab.nodes)
