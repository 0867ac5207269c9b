"""Rules between the inventory and the campaign, checked before any host is touched."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvoffload.config import ConfigError, load_lab

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
    assert lab.client_host.name == "h1"


def test_two_clients(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    inventory["all"]["children"]["client"]["hosts"]["h2"] = None
    inv, problems = _problems(write_yaml, inventory, campaign)
    assert problems == [f"{inv}: all.children.client: needs exactly one host, has 2 (h1, h2)"]


def test_offload_replicas_must_share_the_lmcache_node(
    write_yaml: Writer, multi_host_inventory: Any, campaign: Any
) -> None:
    inv, problems = _problems(write_yaml, multi_host_inventory, campaign)
    assert len(problems) == 1
    assert problems[0].startswith(f"{inv}: all.children.vllm: tiers cpu, nvme (")
    assert "need every vLLM replica on the lmcache host h2" in problems[0]
    assert "but h3 also has vllm_replicas" in problems[0]
    # The gpu tier runs no lmcache-server: replicas may spread over hosts.
    campaign["tiers"] = ["gpu"]
    assert len(load_lab(inv, write_yaml("campaign.yml", campaign)).replicas) == 2


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


def test_one_replica_needs_no_load_balancer(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    del inventory["all"]["children"]["lb"]
    inventory["all"]["hosts"]["h2"]["vllm_replicas"] = [{"index": 0, "gpus": "0"}]
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.lb_host is None


def test_vllm_host_without_replicas_and_two_lmcache_hosts(
    write_yaml: Writer, multi_host_inventory: Any, campaign: Any
) -> None:
    inventory = multi_host_inventory
    del inventory["all"]["hosts"]["h3"]["vllm_replicas"]
    inventory["all"]["children"]["lmcache"]["hosts"]["h3"] = None
    inv, problems = _problems(write_yaml, inventory, campaign)
    assert len(problems) == 2
    assert problems[0].startswith(f"{inv}: host h3 (group vllm): vllm_replicas is missing or empty")
    assert problems[1] == f"{inv}: all.children.lmcache: at most one host, has 2 (h2, h3)"


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
    assert len(lab.inventory.group("vllm")) == 1
    assert len(lab.replicas) == 8
    assert lab.lb_host == lab.lmcache_host
    assert lab.lmcache_host is not None and lab.lmcache_host.nvme_devices
    assert len(lab.cells) == 3 * 3 * 2


def test_demo_campaign_is_valid_on_the_lab_layout(write_yaml: Writer, inventory: Any) -> None:
    root = Path(__file__).resolve().parents[3]
    demo = root / "inventories" / "local" / "campaign-demo.yml"
    lab = load_lab(write_yaml("hosts.yml", inventory), demo)
    assert lab.campaign.engine == "sim"
    assert {c.tier for c in lab.cells} == {"gpu", "cpu", "nvme"}
    assert len(lab.campaign.concurrency) >= 2
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
