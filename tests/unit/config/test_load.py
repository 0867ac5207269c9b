"""Rules between the inventory and the campaign, checked before any host is touched."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvoffload.config import ConfigError, load_lab
from kvoffload.orchestrate.campaign.schedule import group_key

Writer = Callable[[str, Any], Path]


def _problems(write_yaml: Writer, inventory: Any, campaign: Any) -> tuple[Path, list[str]]:
    inv = write_yaml("hosts.yml", inventory)
    with pytest.raises(ConfigError) as info:
        load_lab(inv, write_yaml("campaign.yml", campaign))
    return inv, info.value.problems


def test_the_lab_layout_is_valid(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert [(h.name, i) for h, i in lab.replicas] == [("h2", 0), ("h2", 1)]
    assert lab.lmcache_host is not None and lab.lmcache_host.name == "h2"
    assert lab.lb_host is not None and lab.lb_host.name == "h2"
    assert [c.name for c in lab.clients] == ["h1"]
    assert lab.client_of(lab.node("h2")).name == "h1"


def test_a_client_host_may_also_be_a_node(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    inventory["all"]["children"]["client"]["hosts"]["h2"] = None
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    # Two client hosts, one node: the first client host takes it.
    assert [c.name for c in lab.clients] == ["h1", "h2"] and lab.client_assignment == {"h2": "h1"}


def test_a_node_names_its_client_host(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    inventory["all"]["hosts"]["h3"] = {"ansible_host": "10.0.0.3"}
    inventory["all"]["children"]["client"]["hosts"]["h3"] = None
    inventory["all"]["hosts"]["h2"]["kvoffload_client"] = "h3"
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.client_of(lab.node("h2")).name == "h3"


def test_a_client_host_must_be_in_group_client_and_set_on_a_node(
    write_yaml: Writer, inventory: Any, campaign: Any
) -> None:
    inventory["all"]["hosts"]["h2"]["kvoffload_client"] = "h9"
    inventory["all"]["hosts"]["h1"]["kvoffload_client"] = "h1"
    inv, problems = _problems(write_yaml, inventory, campaign)
    assert problems == [
        f"{inv}: host h1: kvoffload_client is set, but the host is not a node (group vllm): set it on "
        "the node whose cells that client host should replay",
        f"{inv}: host h2: kvoffload_client: 'h9' is not in group client (h1): name one of those, or "
        "add h9 to all.children.client",
    ]


def test_every_node_of_several_runs_its_own_cache_server_and_caddy(
    write_yaml: Writer, multi_host_inventory: Any, campaign: Any
) -> None:
    # h2 and h3 are nodes; only h2 is in lmcache, and Caddy sits on the client h1.
    inv, problems = _problems(write_yaml, multi_host_inventory, campaign)
    assert problems == [
        f"{inv}: all.children.lb: h1 is not a node (group vllm): with several nodes each node runs its own "
        "lb service, so list nodes only",
        f"{inv}: host h3 (group vllm): tiers cpu, nvme ({inv.parent / 'campaign.yml'}: tiers) need every "
        "node in group lmcache (its replicas share KV with a server on the same node)",
        f"{inv}: host h3: nvme_storage_devices is empty, but {inv.parent / 'campaign.yml'}: tiers has nvme: "
        "every node needs the NVMe device for its L2 cache",
    ]
    # Each node its own lmcache host, with its own NVMe device: valid, and node-local.
    inventory = multi_host_inventory
    del inventory["all"]["children"]["lb"]
    inventory["all"]["children"]["lmcache"]["hosts"]["h3"] = None
    inventory["all"]["hosts"]["h3"]["nvme_storage_devices"] = [{"device": "/dev/nvme1n1", "mount": "/mnt/l2"}]
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert [n.name for n in lab.nodes] == ["h2", "h3"] and lab.multi_node
    for node in lab.nodes:
        lmcache = lab.node_lmcache(node)
        assert lmcache is not None and lmcache.name == node.name
        assert lab.node_lb(node) is None  # one replica each: no Caddy
        assert lab.node_hosts(node) == [node.name]


def test_a_node_with_two_replicas_in_a_lab_of_several_needs_caddy_on_it(
    write_yaml: Writer, multi_host_inventory: Any, campaign: Any
) -> None:
    inventory = multi_host_inventory
    campaign["tiers"] = ["gpu"]
    del inventory["all"]["children"]["lb"]
    inventory["all"]["hosts"]["h3"]["vllm_replicas"] = [{"index": 0, "gpus": "0"}, {"index": 1, "gpus": "1"}]
    inv, problems = _problems(write_yaml, inventory, campaign)
    assert problems == [f"{inv}: host h3 (group vllm): 2 replicas need Caddy on the node: add it to group lb"]
    inventory["all"]["children"]["lb"] = {"hosts": {"h3": None}}
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    h2, h3 = lab.nodes
    assert lab.node_lb(h2) is None
    lb = lab.node_lb(h3)
    assert lb is not None and lb.name == "h3"


def test_offload_tiers_need_an_lmcache_host(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    del inventory["all"]["children"]["lmcache"]
    inv, problems = _problems(write_yaml, inventory, campaign)
    assert len(problems) == 1
    assert problems[0].startswith(f"{inv}: all.children.lmcache: tiers cpu, nvme (")
    assert "campaign.yml: tiers) need exactly one host in group lmcache" in problems[0]


def test_gpu_only_campaign_needs_no_lmcache_host(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    del inventory["all"]["children"]["lmcache"]
    campaign["tiers"] = ["gpu"]
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.lmcache_host is None
    assert {c.tier for c in lab.cells} == {"gpu"}


def test_nvme_tier_needs_a_device_on_the_lmcache_host(
    write_yaml: Writer, inventory: Any, campaign: Any
) -> None:
    del inventory["all"]["hosts"]["h2"]["nvme_storage_devices"]
    inv, problems = _problems(write_yaml, inventory, campaign)
    assert len(problems) == 1
    assert problems[0].startswith(f"{inv}: host h2: nvme_storage_devices is empty, but ")
    assert "campaign.yml: tiers has nvme" in problems[0]
    campaign["tiers"] = ["gpu", "cpu"]
    assert load_lab(inv, write_yaml("campaign.yml", campaign)).lmcache_host is not None


def test_two_replicas_need_a_load_balancer(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    del inventory["all"]["children"]["lb"]
    inv, problems = _problems(write_yaml, inventory, campaign)
    assert problems == [f"{inv}: all.children.lb: 2 vLLM replicas need one host in group lb (Caddy)"]


def test_one_machine_under_two_names_may_not_give_a_gpu_to_two_replicas(
    write_yaml: Writer, multi_host_inventory: Any, campaign: Any
) -> None:
    # h3 is h2's machine (same address) with replica index 1: no port clash, but both replicas on GPU 0
    inventory = multi_host_inventory
    campaign["tiers"] = ["gpu"]
    inventory["all"]["hosts"]["h3"] = {
        "ansible_host": "10.0.0.2",
        "vllm_replicas": [{"index": 1, "gpus": "1,0"}],
    }
    inventory["all"]["children"]["lb"] = {"hosts": {"h2": None, "h3": None}}
    inv, problems = _problems(write_yaml, inventory, campaign)
    assert problems == [
        f"{inv}: host h3 (group vllm): vllm_replicas[0].gpus: GPU 0 is also given to vllm_replicas[0] of "
        "host h2, the same machine (10.0.0.2): replicas of one machine cannot share a GPU; give each "
        "replica GPUs of its own, and list each machine once"
    ]
    # other GPUs of that machine: nothing shared
    inventory["all"]["hosts"]["h3"]["vllm_replicas"] = [{"index": 1, "gpus": "1,2"}]
    assert (
        len(load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign)).replicas) == 2
    )
    # the same GPU ids on another machine are that machine's own GPUs
    inventory["all"]["hosts"]["h3"] = {
        "ansible_host": "10.0.0.3",
        "vllm_replicas": [{"index": 0, "gpus": "0"}],
    }
    assert (
        len(load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign)).replicas) == 2
    )


def test_one_replica_needs_no_load_balancer(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    del inventory["all"]["children"]["lb"]
    inventory["all"]["hosts"]["h2"]["vllm_replicas"] = [{"index": 0, "gpus": "0"}]
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.lb_host is None


def test_vllm_host_without_replicas_and_two_lmcache_hosts_in_a_one_node_lab(
    write_yaml: Writer, inventory: Any, campaign: Any
) -> None:
    inventory["all"]["hosts"]["h3"] = {"ansible_host": "10.0.0.3"}
    inventory["all"]["children"]["lmcache"]["hosts"]["h3"] = None
    inv, problems = _problems(write_yaml, inventory, campaign)
    assert problems == [
        f"{inv}: all.children.lmcache: at most one host with one node in vllm, has 2 (h2, h3); with several "
        "nodes each node is its own lmcache host"
    ]


def test_campaign_from_the_inventory(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    inventory["all"]["vars"]["kvoffload_campaign"] = campaign
    inv = write_yaml("hosts.yml", inventory)
    lab = load_lab(inv)
    assert lab.campaign_file == str(inv)
    assert lab.campaign_key == "all.vars.kvoffload_campaign"
    assert len(lab.cells) == 6


def test_no_campaign_anywhere(write_yaml: Writer, inventory: Any) -> None:
    inv = write_yaml("hosts.yml", inventory)
    with pytest.raises(ConfigError) as info:
        load_lab(inv)
    assert str(info.value) == (
        f"{inv}: all.vars.kvoffload_campaign: no campaign here: add one, or pass --campaign FILE"
    )


def test_repo_example_inventory_is_valid() -> None:
    root = Path(__file__).resolve().parents[3]
    lab = load_lab(root / "inventories" / "example" / "hosts.yml")
    assert [n.name for n in lab.nodes] == ["gpu01.lab.example", "gpu02.lab.example"]
    assert len(lab.replicas) == 16
    for node in lab.nodes:
        assert lab.node_lb(node) == lab.node_lmcache(node) == node
        assert node.nvme_devices and len(node.replicas) == 8
    assert len(lab.cells) == 3 * 3 * 2


def test_demo_campaign_is_valid_on_the_lab_layout(write_yaml: Writer, inventory: Any) -> None:
    root = Path(__file__).resolve().parents[3]
    demo = root / "inventories" / "local" / "campaign-demo.yml"
    lab = load_lab(write_yaml("hosts.yml", inventory), demo)
    assert lab.campaign.engine == "sim"
    assert {c.tier for c in lab.cells} == {"gpu", "cpu", "nvme"}
    assert len(lab.campaign.concurrency) >= 2
    assert lab.dataset_path == root / "data" / "tau2-bench"


@pytest.mark.parametrize("name", ["startup-60s.yml", "two-groups.yml"])
def test_bench_campaigns_are_valid_on_the_lab_layout(write_yaml: Writer, inventory: Any, name: str) -> None:
    """The campaign-overhead benchmark's campaigns: three tiers, two or more comparison groups (so
    that two nodes can share them) that run only as long as duration_s, the shipped tau2 sample."""
    root = Path(__file__).resolve().parents[3]
    lab = load_lab(write_yaml("hosts.yml", inventory), root / "bench" / "campaigns" / name)
    assert {c.tier for c in lab.cells} == {"gpu", "cpu", "nvme"}
    assert lab.campaign.duration_s is not None
    groups = {group_key(c) for c in lab.cells}
    assert len(groups) >= 2
    assert len(lab.cells) == 3 * len(groups)
    assert lab.dataset_path == root / "data" / "tau2-bench"


def test_campaign_in_group_vars_all_is_located_there(
    write_yaml: Writer, inventory: Any, campaign: Any, tmp_path: Path
) -> None:
    inv = write_yaml("hosts.yml", inventory)
    (tmp_path / "group_vars").mkdir()
    campaign["repeats"] = 0
    all_file = write_yaml("group_vars/all.yml", {"kvoffload_campaign": campaign})
    with pytest.raises(ConfigError) as info:
        load_lab(inv)
    assert str(info.value) == f"{all_file}: kvoffload_campaign.repeats: must be a positive integer, got 0"
