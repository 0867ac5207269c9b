"""Shared builders for the config tests: a valid lab inventory and campaign as plain dicts."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.campaigns import sim_campaign

BASE_CAMPAIGN: dict[str, Any] = sim_campaign(
    "t1",
    model="tiny-llama",
    dataset={"code": "tau2-bench-v1", "path": "data/tau2"},
    concurrency=[2, 16],
    isl=16384,
    osl=32,
)

BASE_INVENTORY: dict[str, Any] = {
    "all": {
        "vars": {"ansible_user": "root"},
        "hosts": {
            "h1": {"ansible_host": "10.0.0.1"},
            # The node of every run (docs/architecture.md section 3): replicas, lmcache-server and Caddy.
            "h2": {
                "ansible_host": "10.0.0.2",
                "vllm_replicas": [{"index": 0, "gpus": "0"}, {"index": 1, "gpus": "1"}],
                "nvme_storage_devices": [{"device": "/dev/loop0", "mount": "/mnt/kvoffload-nvme"}],
            },
        },
        "children": {
            "vllm": {"hosts": {"h2": None}},
            "lmcache": {"hosts": {"h2": None}},
            "lb": {"hosts": {"h2": None}},
            "client": {"hosts": {"h1": None}},
        },
    }
}


def _multi_host() -> dict[str, Any]:
    """Two GPU hosts with one replica each and Caddy on the client: the inventory model itself is
    layout-free (that a cpu/nvme run is node-local is a rule of load_lab, tested there)."""
    inventory = copy.deepcopy(BASE_INVENTORY)
    hosts, children = inventory["all"]["hosts"], inventory["all"]["children"]
    hosts["h2"]["vllm_replicas"] = [{"index": 0, "gpus": "0"}]
    hosts["h3"] = {"ansible_host": "10.0.0.3", "vllm_replicas": [{"index": 0, "gpus": "0"}]}
    children["vllm"]["hosts"]["h3"] = None
    children["lb"] = {"hosts": {"h1": None}}
    return inventory


@pytest.fixture
def multi_host_inventory() -> dict[str, Any]:
    return _multi_host()


@pytest.fixture
def campaign() -> dict[str, Any]:
    return copy.deepcopy(BASE_CAMPAIGN)


@pytest.fixture
def inventory() -> dict[str, Any]:
    return copy.deepcopy(BASE_INVENTORY)


@pytest.fixture
def write_yaml(tmp_path: Path) -> Callable[[str, Any], Path]:
    """Write `data` as YAML to tmp_path/<name> and return the path."""

    def write(name: str, data: Any) -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
