"""Nodes of a node-parallel campaign: which host facts differ, and the campaign warning that says so."""

from __future__ import annotations

import json

import pandas as pd

from kvoffload.analysis.compare import warnings_table
from kvoffload.analysis.nodes import node_differences, node_facts, node_warning_text

H200 = {"cpu": "Xeon 8480", "vcpus": 224, "ram_gib": 2015.6, "os": "Debian 12", "kernel": "6.1.0",
        "gpus": ["NVIDIA H200"] * 8, "nvme": [{"model": "PM1733", "size_bytes": 3840755982336}]}  # fmt: skip


def _cells(hosts: dict[str, dict[str, object]], nodes: list[str | None]) -> pd.DataFrame:
    return pd.DataFrame({"cell_id": [f"c{i}" for i in range(len(nodes))], "node": nodes,
                         "hosts": [json.dumps(hosts)] * len(nodes)})  # fmt: skip


def test_alike_nodes_and_a_single_node_give_no_warning() -> None:
    cells = _cells({"gpu01": H200, "gpu02": H200, "client": {"cpu": "other"}}, ["gpu01", "gpu02", "gpu01"])
    assert node_differences(cells) == [] and node_warning_text([]) is None
    assert node_differences(_cells({"gpu01": H200}, ["gpu01", "gpu01"])) == []
    assert set(node_facts(cells)) == {"gpu01", "gpu02"}  # the client is no node


def test_nodes_that_differ_are_named_fact_by_fact() -> None:
    other = {**H200, "gpus": ["NVIDIA H100 80GB HBM3"] * 8, "kernel": "6.8.0"}
    cells = _cells({"gpu01": H200, "gpu02": other}, ["gpu01", "gpu02", None])
    diffs = node_differences(cells)
    assert [d["fact"] for d in diffs] == ["kernel", "GPUs"]
    assert diffs[1]["values"] == {"gpu01": "8 x NVIDIA H200", "gpu02": "8 x NVIDIA H100 80GB HBM3"}
    text = node_warning_text(diffs)
    assert text is not None
    assert text.startswith(
        "the nodes differ in kernel (gpu01: 6.1.0, gpu02: 6.8.0); GPUs (gpu01: 8 x NVIDIA H200"
    )
    table = warnings_table(pd.DataFrame(), cells=cells)
    assert list(table["kind"]) == ["nodes_differ"] and list(table["scope"]) == ["campaign"]


def test_a_node_without_recorded_facts_shows_as_unknown() -> None:
    diffs = node_differences(_cells({"gpu01": H200}, ["gpu01", "gpu02"]))
    assert len(diffs) == 7 and {d["values"]["gpu02"] for d in diffs} == {"unknown"}


def test_devices_compare_by_what_they_are_not_by_their_names() -> None:
    """The demo's two nodes: identical loop devices /dev/loop0 and /dev/loop1 (same size, same file
    system) are alike; a different size or file system is a difference."""

    def node(device: str, size: int = 536870912, fstype: str = "xfs") -> dict[str, object]:
        disk = {"device": device, "model": "unknown", "firmware": "unknown", "size_bytes": size,
                "fstype": fstype, "mount": "/mnt/kvoffload-nvme"}  # fmt: skip
        return {**H200, "gpus": [{"pci": f"0000:{device[-1]}1:00.0", "driver": "nvidia"}], "nvme": [disk]}

    alike = _cells({"kvlab2": node("/dev/loop0"), "kvlab3": node("/dev/loop1")}, ["kvlab2", "kvlab3"])
    assert node_differences(alike) == []
    bigger = _cells({"kvlab2": node("/dev/loop0"), "kvlab3": node("/dev/loop1", size=2 * 536870912)},
                    ["kvlab2", "kvlab3"])  # fmt: skip
    (diff,) = node_differences(bigger)
    assert diff["fact"] == "NVMe" and "1073741824" in diff["values"]["kvlab3"]
    assert "/dev/loop" not in diff["values"]["kvlab3"]
    ext4 = _cells(
        {"kvlab2": node("/dev/loop0"), "kvlab3": node("/dev/loop1", fstype="ext4")}, ["kvlab2", "kvlab3"]
    )
    assert [d["fact"] for d in node_differences(ext4)] == ["NVMe"]
