"""playbooks/preflight.yml: inventory checks run on the controller only, before any host is touched.

Runs the real playbook with ansible-playbook against inventories written here (no host is contacted:
the play targets localhost with a local connection).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def inventory(**groups: dict[str, Any]) -> dict[str, Any]:
    return {"all": {"children": {name: {"hosts": hosts} for name, hosts in groups.items()}}}


GOOD = inventory(
    vllm={"gpu1": {"vllm_replicas": [{"index": 0, "gpus": "0"}, {"index": 1, "gpus": "1"}]}},
    lmcache={"cache": {"nvme_storage_devices": [{"device": "/dev/nvme1n1", "mount": "/mnt/kvoffload-nvme"}]}},
    lb={"cache": {}},
    client={"client": {}},
)


def preflight(
    tmp_path: Path, inv: dict[str, Any], tier: str, node: str = ""
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(inv))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), NO_COLOR="1")
    return subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(path),
            str(REPO / "playbooks" / "preflight.yml"),
            "-e",
            json.dumps(
                {"kvoffload_tier": tier, "kvoffload_node": node, "ansible_python_interpreter": sys.executable}
            ),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("tier", ["gpu", "cpu", "nvme"])
def test_a_complete_inventory_passes(tmp_path: Path, tier: str) -> None:
    # as a plain run of one cell (kvoffload_node set) without --limit: a lab of one node has no other
    # node to rewire, its lmcache and lb hosts are the node's
    result = preflight(tmp_path, GOOD, tier, node="gpu1")
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize(
    ("inv", "tier", "message"),
    [
        (
            inventory(vllm={"gpu1": {}}, client={}),
            "gpu",
            ">= 1 in client (have 0)",
        ),
        (
            inventory(vllm={"gpu1": {}}, client={"c1": {}}),
            "cpu",
            "exactly 1 host in lmcache for tier cpu (have 0)",
        ),
        (
            inventory(vllm={"gpu1": {}}, lmcache={"cache": {}}, client={"c1": {}}),
            "nvme",
            "inventory host cache: tier nvme needs nvme_storage_devices",
        ),
        (
            inventory(
                vllm={"gpu1": {"vllm_replicas": [{"index": 0, "gpus": "0"}, {"index": 1, "gpus": "1"}]}},
                client={"c1": {}},
            ),
            "gpu",
            "2 replicas need exactly 1 host in group lb",
        ),
        (
            inventory(
                vllm={"gpu1": {"vllm_replicas": [{"index": 0, "gpus": "0"}, {"index": 0, "gpus": "1"}]}},
                lb={"gpu1": {}},
                client={"c1": {}},
            ),
            "gpu",
            "inventory host gpu1: vllm_replicas must list replicas with unique `index`",
        ),
        (
            inventory(
                vllm={"gpu1": {"vllm_replicas": [{"index": 0, "gpus": "0,1"}, {"index": 1, "gpus": "1"}]}},
                lb={"gpu1": {}},
                client={"c1": {}},
            ),
            "gpu",
            "inventory host gpu1: vllm_replicas must list replicas with unique `index`, and no GPU given to "
            "two of them (GPU 1 is): replicas of one machine cannot share a GPU",
        ),
    ],
)
def test_a_bad_inventory_is_refused_with_the_group_or_variable_named(
    tmp_path: Path, inv: dict[str, Any], tier: str, message: str
) -> None:
    result = preflight(tmp_path, inv, tier)
    assert result.returncode != 0
    assert message in " ".join(result.stdout.split()), result.stdout[-3000:]


TWO = [{"index": 0, "gpus": "0"}, {"index": 1, "gpus": "1"}]
NVME = [{"device": "/dev/nvme1n1", "mount": "/mnt/kvoffload-nvme"}]
TWO_NODES = inventory(
    vllm={"gpu1": {"vllm_replicas": TWO, "nvme_storage_devices": NVME}, "gpu2": {"vllm_replicas": TWO}},
    lmcache={"gpu1": {}, "gpu2": {"nvme_storage_devices": NVME}},
    lb={"gpu1": {}, "gpu2": {}},
    client={"client": {}},
)


@pytest.mark.parametrize("tier", ["gpu", "cpu", "nvme"])
def test_two_nodes_each_with_its_own_cache_server_and_caddy_pass(tmp_path: Path, tier: str) -> None:
    result = preflight(tmp_path, TWO_NODES, tier)
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize(
    ("change", "tier", "message"),
    [
        # a node outside lmcache has no cache server for its offload cells
        (lambda inv: inv["all"]["children"]["lmcache"]["hosts"].pop("gpu2"), "cpu", "inventory host gpu2:"),
        # Caddy on a host that is no node
        (
            lambda inv: inv["all"]["children"]["lb"]["hosts"].update({"client": {}}),
            "gpu",
            "groups lmcache and lb",
        ),
        # a node with two replicas and no Caddy of its own
        (lambda inv: inv["all"]["children"]["lb"]["hosts"].pop("gpu1"), "gpu", "inventory host gpu1:"),
    ],
)
def test_a_lab_of_two_nodes_needs_each_nodes_own_services(
    tmp_path: Path, change: Any, tier: str, message: str
) -> None:
    inv = json.loads(json.dumps(TWO_NODES))
    change(inv)
    result = preflight(tmp_path, inv, tier)
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert message in text and "a node with 2 or more replicas is in lb" in text, result.stdout[-3000:]
