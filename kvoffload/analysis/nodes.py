"""Whether the nodes of a node-parallel campaign, and its client hosts, are alike (docs/architecture.md
section 3).

A comparison group runs on one node, so a tier comparison never mixes hardware; but figures of groups
that ran on different nodes (a concurrency sweep spread over two nodes) compare only when the nodes
are alike. This reads the host facts every cell.json records (`hosts`: CPU, vCPUs, RAM, OS, kernel,
GPUs, NVMe) for the nodes that ran cells (the `node` column of the cells table) and says what differs.
A device is compared by what it is (NVMe: model, size, file system; GPU: model, driver), never by its
name on the host (`/dev/loop0` against `/dev/loop1`, a PCI address, a mount point), which says nothing
about the figures. Software differences are `analysis.software`'s (version_splits across the cells of
one role's hosts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

# Host facts compared between nodes, with the words the warning uses.
COMPARED_FACTS = {
    "cpu": "CPU",
    "vcpus": "vCPUs",
    "ram_gib": "RAM GiB",
    "os": "OS",
    "kernel": "kernel",
    "gpus": "GPUs",
    "nvme": "NVMe",
}
# What decides how many streams a client host drives well: its CPU, memory and OS.
CLIENT_FACTS = {key: COMPARED_FACTS[key] for key in ("cpu", "vcpus", "ram_gib", "os", "kernel")}


# Keys of a device record that name it on its host rather than say what it is: left out of the
# comparison (nvme_storage's kvoffload_nvme fact: device, mount; gpu_driver's kvoffload_gpu: pci).
DEVICE_NAME_KEYS = frozenset({"device", "mount", "pci", "path", "firmware"})


def _device_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in DEVICE_NAME_KEYS}
    return json.dumps(value, sort_keys=True)


def _fact_text(value: Any) -> str:
    if isinstance(value, list):
        models = [_device_text(v) for v in value]
        return f"{len(models)} x {' + '.join(sorted(set(models)))}" if models else "none"
    return "unknown" if value is None else str(value)


def node_facts(
    cells: pd.DataFrame, column: str = "node", compared: Mapping[str, str] = COMPARED_FACTS
) -> dict[str, dict[str, str]]:
    """host -> compared fact -> its text, for every host named in `column` (the node a cell ran on,
    or the client host that replayed it) of a cell (facts from any cell.json)."""
    if column not in cells or cells.empty:
        return {}
    hosts: dict[str, dict[str, Any]] = {}
    for text in cells["hosts"].dropna():
        hosts.update(json.loads(text))
    out = {}
    for name in sorted({str(n) for n in cells[column].dropna()}):
        facts = hosts.get(name, {})
        out[name] = {key: _fact_text(facts.get(key)) for key in compared}
    return out


def node_differences(
    cells: pd.DataFrame, column: str = "node", compared: Mapping[str, str] = COMPARED_FACTS
) -> list[dict[str, Any]]:
    """One entry per compared fact whose value differs between the hosts of `column` (the nodes by
    default): {fact, values: {host: text}}. Empty with one host, or when every host is alike."""
    facts = node_facts(cells, column, compared)
    if len(facts) < 2:
        return []
    out = []
    for key, words in compared.items():
        values = {node: f[key] for node, f in facts.items()}
        if len(set(values.values())) > 1:
            out.append({"fact": words, "values": values})
    return out


def _parts(differences: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"{d['fact']} ({', '.join(f'{n}: {v}' for n, v in sorted(d['values'].items()))})" for d in differences
    )


def _warning(hosts: str, differences: list[dict[str, Any]], consequence: str) -> str | None:
    return f"the {hosts} differ in {_parts(differences)}: {consequence}" if differences else None


def node_warning_text(differences: list[dict[str, Any]]) -> str | None:
    """The campaign warning for nodes that differ, or None when they are alike."""
    return _warning(
        "nodes",
        differences,
        "tier comparisons stay within one node and remain valid, but figures of groups that ran on "
        "different nodes do not compare with each other",
    )


def client_differences(cells: pd.DataFrame) -> list[dict[str, Any]]:
    """The client hosts that replayed the campaign's cells, where their CPU, RAM or OS differ."""
    return node_differences(cells, "client", CLIENT_FACTS)


def client_warning_text(differences: list[dict[str, Any]]) -> str | None:
    """The campaign warning for client hosts that differ, or None when they are alike."""
    return _warning(
        "client hosts",
        differences,
        "a node keeps its client host, so tier comparisons remain valid, but the replay client's own "
        "share of TTFT may differ between groups replayed from different client hosts",
    )
