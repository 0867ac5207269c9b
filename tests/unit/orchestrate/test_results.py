"""The results folder: DONE marks resume points, unfinished attempts are kept aside, never overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.config import Cell
from kvoffload.orchestrate.campaign.runner import host_facts
from kvoffload.orchestrate.cell.record import host_software
from kvoffload.orchestrate.results import CampaignResults

CELL = Cell("abc123", "cpu", 8, 5, 16384, "recorded", 1, {"tier": "cpu"})


def test_unfinished_attempt_is_moved_aside_and_done_is_final(tmp_path: Path) -> None:
    results = CampaignResults.open(tmp_path, "demo")
    first = results.start_cell(CELL)
    (first / "requests.jsonl").write_text('{"partial": true}\n')
    assert not results.is_done(CELL)
    second = results.start_cell(CELL)
    assert second == first and not (second / "requests.jsonl").exists()
    (attempt,) = results.attempts.iterdir()
    assert (attempt / "requests.jsonl").read_text() == '{"partial": true}\n'
    results.mark_done(CELL)
    assert results.is_done(CELL)
    with pytest.raises(FileExistsError, match="never overwritten"):
        results.start_cell(CELL)


def test_fresh_keeps_the_old_campaign(tmp_path: Path) -> None:
    results = CampaignResults.open(tmp_path, "demo")
    results.start_cell(CELL)
    results.mark_done(CELL)
    again = CampaignResults.open(tmp_path, "demo", fresh=True)
    assert not again.is_done(CELL)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("demo-")]
    assert len(kept) == 1 and (kept[0] / "cells" / CELL.id / "DONE").is_file()


def test_host_facts_from_ansible_219_fact_cache(tmp_path: Path) -> None:
    # a real fact-cache file written by ansible-core 2.19 for the lab's lmcache host
    cache = tmp_path / "fact_cache"
    cache.mkdir()
    (cache / "s1_kvlab2").write_bytes((Path(__file__).parent / "fixtures" / "s1_kvlab2").read_bytes())
    facts = host_facts(cache)
    assert list(facts) == ["kvlab2"]
    host = facts["kvlab2"]
    assert host["vcpus"] == 2 and host["ram_gib"] == 23.5 and host["os"] == "Debian 12.15"
    assert host["nvme"][0]["device"] == "/dev/loop0" and host["nvme"][0]["fstype"] == "xfs"
    assert host["gpus"] == []
    assert host["python"] == "3.11.2"
    assert host["numa_nodes"] == []  # recorded before the fact had NUMA nodes


def test_host_facts_carry_the_numa_layout_and_each_devices_node(tmp_path: Path) -> None:
    cache = tmp_path / "fact_cache"
    cache.mkdir()
    facts = json.loads(
        json.loads((Path(__file__).parent / "fixtures" / "s1_kvlab2").read_text())["__payload__"]
    )
    facts["ansible_local"]["kvoffload_gpu"] = {
        "count": 2,
        "numa_nodes": [0, 1],
        "devices": [
            {"pci": "0000:18:00.0", "driver": "nvidia", "numa_node": 0},
            {"pci": "0000:9a:00.0", "driver": "nvidia", "numa_node": 1},
        ],
    }
    facts["ansible_local"]["kvoffload_nvme"]["devices"][0]["numa_node"] = 1
    (cache / "s1_gpu1").write_text(json.dumps({"__payload__": json.dumps(facts)}))
    host = host_facts(cache)["gpu1"]
    assert host["numa_nodes"] == [0, 1]
    assert [g["numa_node"] for g in host["gpus"]] == [0, 1]
    assert host["nvme"][0]["numa_node"] == 1


def test_host_software_reads_the_collect_roles_files(tmp_path: Path) -> None:
    # the shape roles/collect/tasks/software.yml writes (to_nice_json), one file per inventory host
    sim_host = {
        "gpu": {},
        "groups": ["lmcache", "vllm"],
        "host": "kve2",
        "packages": {"prometheus-node-exporter": "1.5.0-1+b6"},
        "python": {"/opt/kvoffload/venv": {"kvoffload-lab": "0.1.0"}},
    }
    folder = tmp_path / "software"
    folder.mkdir()
    (folder / "kve2.json").write_text(json.dumps(sim_host, indent=4) + "\n")
    (folder / "kve1.json").write_text('{"host": "kve1", "python": {}')  # cut short
    (folder / "notes.txt").write_text("not a host file")
    software = host_software(folder)
    assert list(software) == ["kve1", "kve2"]
    assert software["kve2"] == sim_host
    assert software["kve1"] == {"error": "unreadable kve1.json"}


def test_host_software_without_the_folder_is_empty(tmp_path: Path) -> None:
    # a cell that failed before collect ran
    assert host_software(tmp_path / "software") == {}
