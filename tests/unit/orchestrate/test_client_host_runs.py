"""Client hosts over a run's life (issue 43, defect 13): a cell whose client host failed to install fails
at once with that error, without deploying engines; a resumed run's knee search installs the client host
of the node it ramps on before replaying from it. The playbooks and the lab's HTTP are the recorders of
test_campaign_flow.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from kvoffload.config import load_lab
from tests.unit.orchestrate.test_campaign_flow import (
    _cell_json,
    _lab_files,
    _run_with_a_failed_client_install,
    _runner_of,
    fakes,
)

__all__ = ["fakes"]  # the fixture, shared with test_campaign_flow.py
NODE = "gpu01.lab.example"


def test_a_failed_client_host_fails_the_nodes_later_cells_at_once_without_deploying(
    tmp_path: Path, fakes: dict[str, Any]
) -> None:
    runner, rec = _run_with_a_failed_client_install(tmp_path, nodes=1)
    # The first cell deployed while the client host installed, and its replay found the install failed;
    # the five cells after it failed before deploying or tearing down anything (they used to run
    # "deploy.yml", "teardown.yml" each: ten playbooks and five engine starts for nothing).
    assert rec.for_node(NODE) == [
        "deploy.yml:install,model,quiet", "teardown.yml", "deploy.yml", "teardown.yml",
        "teardown.yml:unquiet",
    ]  # fmt: skip
    order = [c.id for c in runner.plan(runner.lab.cells)[0].cells]
    first, *later = (_cell_json(runner, cell_id) for cell_id in order)
    assert "deploy" in first["timings"] and first["status"] == "failed"
    for record in later:
        assert record["status"] == "failed" and "client01.lab.example failed" in record["error"]
        assert {"deploy", "reset", "teardown", "replay"}.isdisjoint(record["timings"]), record["timings"]
    assert rec.when("replay ") == []


def _measured(root: Path) -> pd.DataFrame:
    """The campaign summary as the knee search reads it: a server whose later-round p95 TTFT is
    concurrency / 10 seconds (the SLO of 1 s breaks above 10), each cell on the node it ran on."""
    rows = []
    for done in (root / "cells").glob("*/DONE"):
        record = json.loads((done.parent / "cell.json").read_text())
        rows.append({**record["config"], "node": record["node"], "status": "done",
                     "steady_held": True, "steady_ttft_later_p95_s": record["config"]["concurrency"] / 10,
                     "steady_later_cached_share": None})  # fmt: skip
    return pd.DataFrame(rows)


def test_a_resumed_runs_knee_search_installs_the_client_host_of_each_node_it_ramps_on(
    tmp_path: Path, fakes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two nodes, each replayed from its own client host; two ramps (num_rounds 5 and 6), one per node.
    inv, camp = _lab_files(tmp_path, nodes=2, clients=2)
    doc = yaml.safe_load(camp.read_text())
    doc.update(tiers=["gpu"], concurrency=[2], num_rounds=[5, 6],
               knee_search={"slo_p95_ttft_s": 1.0, "max_concurrency": 8})  # fmt: skip
    camp.write_text(yaml.safe_dump(doc))
    lab = load_lab(inv, camp)
    monkeypatch.setattr("kvoffload.orchestrate.campaign.knee.campaign_summary", _measured)

    # The first run: the campaign's cells only (--cells runs no knee search), one on each node.
    first, _ = _runner_of(tmp_path, lab, inv)
    ran = first.run(only=[c.id for c in lab.cells], provision=False)
    assert len(ran.done) == 2 and not ran.failed
    nodes = {_cell_json(first, c.id)["node"] for c in lab.cells}
    assert nodes == {"gpu01.lab.example", "gpu02.lab.example"}

    # The resumed run: every campaign cell is DONE, so the knee search is all it runs, on both nodes.
    second, rec = _runner_of(tmp_path, lab, inv)
    outcome = second.run(provision=False)
    assert not outcome.failed and sorted(outcome.skipped) == sorted(c.id for c in lab.cells)
    assignment = lab.client_assignment
    for node in ("gpu01.lab.example", "gpu02.lab.example"):
        client = assignment[node]
        at = [i for i, (p, _n, limit) in enumerate(rec.runs) if p == "replay.yml:install" and limit == client]
        replays = [i for i, (p, n, _l) in enumerate(rec.runs) if n == node and p.startswith("replay.yml") and
                   ":install" not in p]  # fmt: skip
        assert replays, f"the knee search replayed nothing on {node}"
        # this run installed the node's client host, once, before the node's first knee replay
        assert len(at) == 1 and at[0] < replays[0], (node, rec.runs)
