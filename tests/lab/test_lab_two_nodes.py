"""A node-parallel campaign on a virtual lab of two nodes and two client hosts (`lab up --nodes 2
--clients 2`).

Each node runs its own replicas, lmcache-server and Caddy, and is replayed from its own client host
(the pool shares the nodes out: the first node to the first client host). The campaign's comparison
groups run two per node at most, the nodes at the same time; every tier of a group on its node; each
cell samples only its node and its client host, and records which node ran it and which client host
replayed it; the report names both.
Three groups over two nodes: the node with two runs each tier twice, the second time on the same
engines, made cold by a reset (cold_start: reset, the default) and proven cold by its probes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.lab import free_lab_names, kvlab, lab_marks, small_campaign

pytestmark = lab_marks(2400)
NAMES = free_lab_names("n", 12)
CLIENT_A, CLIENT_B, NODE_A, NODE_B = NAMES.host(1), NAMES.host(2), NAMES.host(3), NAMES.host(4)
CLIENT_OF = {NODE_A: CLIENT_A, NODE_B: CLIENT_B}


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    base = tmp_path_factory.mktemp("nodes")
    env = {**os.environ, "KVOFFLOAD_LAB_STATE": str(base / "state")}
    inventory = base / "hosts.yml"
    up = kvlab(env, "lab", "up", "--hosts", "4", "--nodes", "2", "--clients", "2", *NAMES.up_args(),
               "--inventory", str(inventory), timeout=900)  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        campaign = small_campaign("two-nodes", ["gpu", "cpu"], concurrency=[2, 4, 8], sample_interval_s=2)
        (base / "campaign.yml").write_text(yaml.safe_dump(campaign))
        plan = kvlab(env, "plan", str(inventory), "--campaign", str(base / "campaign.yml"),
                     "--results", str(base / "results"), timeout=300)  # fmt: skip
        assert plan.returncode == 0, plan.stderr[-3000:]
        run = kvlab(env, "run", str(inventory), "--campaign", str(base / "campaign.yml"),
                    "--results", str(base / "results"))  # fmt: skip
        assert run.returncode == 0, run.stderr[-6000:]
        yield base / "results" / "two-nodes", plan.stdout
    finally:
        down = kvlab(env, "lab", "down", timeout=300)
        assert down.returncode == 0, down.stderr[-2000:]


def _records(results: Path) -> list[dict[str, Any]]:
    return [json.loads((c / "cell.json").read_text()) for c in sorted((results / "cells").iterdir())]


def test_plan_shows_which_node_runs_which_cells(two_nodes: tuple[Path, str]) -> None:
    plan = two_nodes[1]
    for node in (NODE_A, NODE_B):
        assert f"node {node}: 2 replica(s); lmcache: {node}; lb: {node}" in plan
    rows = [line for line in plan.splitlines() if line.startswith("│") and "to run" in line]
    assert len(rows) == 6 and {r.split()[1] for r in rows} == {NODE_A, NODE_B}, plan
    assert sum("reset" in r for r in rows) == 2, plan  # the second cell of each tier on the first node
    # each client host's share: its node, and the streams of that node's largest cell
    flat = " ".join(plan.split())
    for node, client in CLIENT_OF.items():
        assert f"client {client}: replays node(s) {node}; up to " in flat, plan


def test_each_group_runs_on_one_node_the_nodes_at_once(two_nodes: tuple[Path, str]) -> None:
    records = _records(two_nodes[0])
    assert len(records) == 6 and all(r["status"] == "done" for r in records), records
    by_group: dict[int, set[str]] = {}
    for r in records:
        by_group.setdefault(r["config"]["concurrency"], set()).add(r["node"])
    assert all(len(nodes) == 1 for nodes in by_group.values()), by_group
    assert set().union(*by_group.values()) == {NODE_A, NODE_B}
    # the two nodes' replays overlapped in time
    spans = {}
    for r in records:
        lo, hi = spans.get(r["node"], (r["started_at"], r["finished_at"]))
        spans[r["node"]] = (min(lo, r["started_at"]), max(hi, r["finished_at"]))
    (a0, a1), (b0, b1) = spans.values()
    assert a0 < b1 and b0 < a1, spans


def test_a_cell_is_replayed_from_its_nodes_client_host_and_samples_only_those_two(
    two_nodes: tuple[Path, str],
) -> None:
    for r in _records(two_nodes[0]):
        client = CLIENT_OF[r["node"]]
        assert r["client"] == client, r
        assert r["hosts"][client]["vcpus"] >= 1  # the client host's facts, for the plan's next check
        hosts = {t["host"] for t in r["targets"].values()}
        assert hosts == {r["node"], client}, r["targets"]
        base_url = r["replay_argv"][r["replay_argv"].index("--base-url") + 1]
        assert base_url.startswith("http://" + NAMES.subnet.rsplit(".", 2)[0] + "."), base_url
        counts = json.loads((two_nodes[0] / "cells" / r["cell_id"] / "sessions.json").read_text())
        assert counts["failed_requests"] == 0 and counts["complete"] == 8, counts
        samples = (two_nodes[0] / "cells" / r["cell_id"] / "metrics").glob("*.jsonl")
        seen = {json.loads(line)["target"] for f in samples for line in f.read_text().splitlines()}
        ours = ("vllm-" + r["node"], "node-" + r["node"], "node-" + client, "lmcache", "caddy")
        assert seen and all(t.startswith(ours) for t in seen), seen


def test_engines_restart_per_tier_and_reset_between_a_nodes_groups(two_nodes: tuple[Path, str]) -> None:
    methods: dict[tuple[str, str], list[str]] = {}
    for r in sorted(_records(two_nodes[0]), key=lambda r: r["started_at"]):
        methods.setdefault((r["node"], r["config"]["tier"]), []).append(r["cold_start"]["method"])
        if r["cold_start"]["method"] == "reset":
            assert r["cold_start"]["cold"] is True and r["cold_start"]["probes"], r["cold_start"]
            assert all(p["problems"] == [] for p in r["cold_start"]["probes"]), r["cold_start"]
    two = next(n for n in (NODE_A, NODE_B) if len(methods[(n, "gpu")]) == 2)
    one = NODE_B if two == NODE_A else NODE_A
    assert methods[(two, "gpu")] == methods[(two, "cpu")] == ["restart", "reset"], methods
    assert methods[(one, "gpu")] == methods[(one, "cpu")] == ["restart"], methods
    report = (two_nodes[0] / "report" / "report.md").read_text()
    assert all(host in report for host in (NODE_A, NODE_B, CLIENT_A, CLIENT_B))
