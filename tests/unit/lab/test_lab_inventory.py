"""The lab's inventory: the layout issue 6 asks for, valid for the config models and the demo."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kvoffload.config import load_inventory, load_lab
from kvoffload.engines.lab import node_sets
from kvoffload.errors import UserError
from kvoffload.lab.inventory import assign_groups, render, shape_problem
from kvoffload.lab.network import plan_addresses
from kvoffload.lab.state import LabHost, LabState

ROOT = Path(__file__).resolve().parents[3]


def _state(count: int, nodes: int = 1) -> LabState:
    gateway, addresses = plan_addresses("10.213.0.0/24", count)
    names = [f"kvlab{i}" for i in range(1, count + 1)]
    groups = assign_groups(names, nodes)
    hosts = [LabHost(n, ip, groups[n]) for n, ip in zip(names, addresses, strict=True)]
    for i, host in enumerate(h for h in hosts if "lmcache" in h.groups):
        host.loop_device = f"/dev/loop{7 + i}"
    return LabState(
        state_dir="/tmp/x",
        bridge="kvlab0",
        subnet="10.213.0.0/24",
        gateway=gateway,
        rootfs="/r",
        ssh_key="/tmp/x/ssh/id_ed25519",
        inventory="/tmp/hosts.yml",
        hosts=hosts,
    )


def test_addresses() -> None:
    assert plan_addresses("10.213.0.0/24", 3) == ("10.213.0.1", ["10.213.0.11", "10.213.0.12", "10.213.0.13"])
    with pytest.raises(UserError, match="private network"):
        plan_addresses("8.8.8.0/24", 3)
    with pytest.raises(UserError, match="not an IPv4 network"):
        plan_addresses("10.213.0.1/24", 3)


def test_layout_runs_the_demo_campaigns_on_one_node(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text(render(_state(3)))
    inv = load_inventory(path)
    assert [h.name for h in inv.group("client")] == ["kvlab1"]
    # The node of every run: both replicas, the lmcache-server and Caddy (a run is node-local).
    for group in ("vllm", "lmcache", "lb"):
        assert [h.name for h in inv.group(group)] == ["kvlab2"], group
    assert [(r.index, r.gpus) for r in inv.host("kvlab2").replicas] == [(0, "0"), (1, "1")]
    assert inv.host("kvlab3").groups == frozenset()  # a spare node
    assert [d.device for d in inv.host("kvlab2").nvme_devices] == ["/dev/loop7"]
    extra = inv.host("kvlab2").vars.model_extra or {}
    exclude = extra["node_exporter_diskstats_device_exclude"]
    assert re.match(exclude, "sda1") and not re.match(exclude, "loop7")
    assert inv.host("kvlab3").address == "10.213.0.13"
    assert inv.all_vars["ansible_user"] == "root"
    # No GPU on lab hosts: real vLLM takes its CPU build there.
    assert inv.all_vars["kvoffload_engine_build"] == "cpu"
    assert "StrictHostKeyChecking=no" in inv.all_vars["ansible_ssh_common_args"]
    assert inv.all_vars["ansible_host_key_checking"] is False
    lab = load_lab(path, ROOT / "inventories" / "local" / "campaign-demo.yml")
    assert len(lab.replicas) == 2 and lab.lb_host is not None
    assert node_sets(lab) == {}  # the simulator installs no engine set
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text("{}")
    campaign = yaml.safe_load((ROOT / "inventories" / "local" / "campaign-vllm.yml").read_text())
    campaign["model"] = str(model)
    campaign["dataset"]["path"] = str(ROOT / "data" / "tau2-bench")
    (tmp_path / "campaign-vllm.yml").write_text(yaml.safe_dump(campaign))
    real = load_lab(path, tmp_path / "campaign-vllm.yml")
    assert {s.spec.build for s in node_sets(real).values()} == {"cpu"}
    assert real.model_folder == model and real.served_model_name == "tiny"
    assert {c.tier for c in real.cells} == {"gpu", "cpu", "nvme"}


def test_one_or_two_host_labs() -> None:
    assert assign_groups(["a"]) == {"a": ["client", "vllm", "lmcache", "lb"]}
    assert assign_groups(["a", "b"]) == {"a": ["client"], "b": ["vllm", "lmcache", "lb"]}


def test_a_lab_with_two_client_hosts() -> None:
    node = ["vllm", "lmcache", "lb"]
    assert assign_groups(["a", "b", "c", "d", "e"], nodes=2, clients=2) == {
        "a": ["client"],
        "b": ["client"],
        "c": node,
        "d": node,
        "e": [],
    }
    assert shape_problem(4, 2, 2) is None and shape_problem(4, 3, 2) is not None
    assert shape_problem(1, 1, 1) is None and shape_problem(1, 1, 2) is not None
