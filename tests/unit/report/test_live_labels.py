"""The live page names cells by their values, not by id alone (issue 53): `cell_label`, the labels
of kvoffload/report/live.py's JSON (from campaign.json `cells` as the runner writes it, else a cell's
cell.json), and the page's own script (templates/watch.html) rendering them, run in Node with a
stand-in for the browser's document."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvoffload.config import Campaign, Cell, resolve_cells
from kvoffload.orchestrate.campaign.status import StatusBoard
from kvoffload.report.live import LiveView, cell_label, varied_keys
from kvoffload.report.watch_page import page
from tests.support.campaigns import sim_campaign
from tests.support.watch import Clock, mid_run_campaign

NODE = shutil.which("node")


def test_a_label_names_tier_concurrency_rounds_and_only_what_varies() -> None:
    config = {"tier": "gpu", "concurrency": 16, "num_rounds": 5, "isl": 4096, "osl": 256, "repeat": 1}
    assert cell_label(config) == "gpu c=16 r=5"
    assert cell_label({**config, "repeat": 2}) == "gpu c=16 r=5 #2"
    assert cell_label({**config, "repeat": 3}, {"isl", "osl"}) == "gpu c=16 r=5 isl=4096 osl=256 #3"
    assert cell_label({**config, "osl": "recorded"}, {"osl"}) == "gpu c=16 r=5 osl=recorded"
    # without one of the three, no label: the page shows the id
    assert cell_label({"tier": "gpu", "num_rounds": 5}) is None
    assert cell_label({**config, "concurrency": "16"}) is None
    # several values in the campaign's lists, or among the cells when campaign.json has no lists
    assert varied_keys({"isl": [4096], "osl": [128, 256]}, []) == {"osl"}
    assert varied_keys(None, [{"isl": 1024, "osl": 32}, {"isl": 4096, "osl": 32}]) == {"isl"}
    assert varied_keys({"isl": [4096], "osl": [32]}, [config]) == set()


def _campaign(tmp_path: Path, **fields: Any) -> tuple[Path, list[Cell]]:
    """A results folder with campaign.json as the runner writes it (`campaign`, `cells`)."""
    campaign = Campaign.model_validate(sim_campaign("labels", **fields))
    cells = resolve_cells(campaign)
    root = tmp_path / "labels"
    (root / "cells").mkdir(parents=True)
    record = {
        "schema": 1,
        "name": "labels",
        "campaign": campaign.model_dump(mode="json"),
        "cells": [{"id": c.id, **c.config} for c in cells],
    }
    (root / "campaign.json").write_text(json.dumps(record))
    return root, cells


def _by(cells: list[Cell], tier: str, rounds: int, repeat: int = 1, osl: int | None = None) -> str:
    return next(
        c.id
        for c in cells
        if (c.tier, c.num_rounds, c.repeat) == (tier, rounds, repeat) and osl in (None, c.osl)
    )


def _mid_run(tmp_path: Path) -> tuple[Path, list[Cell], dict[str, Any]]:
    """gpu c=16 r=5 running on n1, the campaign's other cells queued; a knee-search step (in no
    campaign.json `cells`, its cell.json written as it started) running on n2."""
    root, cells = _campaign(
        tmp_path, tiers=["gpu", "cpu"], concurrency=[16], num_rounds=[5, 10], osl=[64], repeats=2
    )
    clock = Clock(100.0)
    board = StatusBoard(root / "status.json", "labels", clock=clock, min_interval_s=0)
    running = _by(cells, "gpu", 5)
    board.start({"n1": [c.id for c in cells], "n2": ["0123456789"]}, [])
    board.phase("n1", running, "replay")
    knee = {"tier": "cpu", "concurrency": 48, "num_rounds": 5, "isl": 4096, "osl": 64, "repeat": 1}
    (root / "cells" / "kneestep01").mkdir()
    (root / "cells" / "kneestep01" / "cell.json").write_text(json.dumps({"config": knee}))
    board.phase("n2", "kneestep01", "deploy")
    state = LiveView(root, findings=lambda _root: [], clock=lambda: 110.0).state()
    json.dumps(state)  # the endpoint serves it as JSON
    return root, cells, state


def test_the_json_labels_queued_and_running_cells(tmp_path: Path) -> None:
    _root, cells, state = _mid_run(tmp_path)
    labels = state["labels"]
    n1, n2 = state["nodes"]
    assert n1["cell"] == _by(cells, "gpu", 5) and labels[n1["cell"]] == "gpu c=16 r=5"
    # the ids stay what status.json says (the terminal table and the ETAs read them)
    assert n1["queued"] == [c.id for c in cells][1:]
    assert [labels[c] for c in n1["queued"]] == [
        "gpu c=16 r=5 #2",
        "gpu c=16 r=10",
        "gpu c=16 r=10 #2",
        "cpu c=16 r=5",
        "cpu c=16 r=5 #2",
        "cpu c=16 r=10",
        "cpu c=16 r=10 #2",
    ]
    # a knee-search step from its cell.json; a cell known nowhere keeps its id alone
    assert n2["cell"] == "kneestep01" and labels["kneestep01"] == "cpu c=48 r=5"
    assert n2["queued"] == ["0123456789"] and "0123456789" not in labels


def test_isl_and_osl_are_named_only_where_the_campaign_has_several(tmp_path: Path) -> None:
    root, cells = _campaign(tmp_path, tiers=["gpu"], concurrency=[16], num_rounds=[5], osl=[128, 256])
    StatusBoard(root / "status.json", "labels").start({"n1": [c.id for c in cells]}, [])
    labels = LiveView(root, findings=lambda _root: []).state()["labels"]
    assert labels[_by(cells, "gpu", 5, osl=128)] == "gpu c=16 r=5 osl=128"
    assert labels[_by(cells, "gpu", 5, osl=256)] == "gpu c=16 r=5 osl=256"


def test_an_older_campaign_json_without_cells_labels_from_cell_json(tmp_path: Path) -> None:
    # the fixture's campaign.json predates `cells`; its cells' cell.json files have their configs
    state = LiveView(mid_run_campaign(tmp_path), findings=lambda _root: [], clock=lambda: 2045.0).state()
    assert state["labels"]["b2cpu"] == "cpu c=8 r=3"  # the running cell
    assert state["labels"]["a1gpu"] == "gpu c=2 r=3"
    assert "c1" not in state["labels"]  # queued, no folder yet: the page shows its id
    assert state["nodes"][1]["queued"] == ["c1", "c2"]


# The page's script with just enough of a browser around it: elements by id or selector that keep
# what is written into them, a fetch that answers the state given on stdin, one poll.
NODE_HARNESS = r"""
const fs = require("fs");
const state = JSON.parse(fs.readFileSync(0, "utf8"));
const script = fs.readFileSync(process.argv[2], "utf8");
const elements = {};
const element = key => (elements[key] = elements[key] || {innerHTML: "", textContent: "", className: ""});
globalThis.document = {getElementById: element, querySelector: element};
globalThis.location = {search: ""};
globalThis.fetch = async () => ({json: async () => state});
globalThis.setTimeout = () => {
  process.stdout.write(JSON.stringify({rows: elements["#nodes tbody"].innerHTML}));
};
eval(script);
"""


def _rendered_rows(state: dict[str, Any], tmp_path: Path) -> str:
    assert NODE is not None
    match = re.search(r"<script>(.*)</script>", page("labels"), re.S)
    assert match is not None
    script = tmp_path / "watch.js"
    script.write_text(match.group(1))
    harness = tmp_path / "harness.js"
    harness.write_text(NODE_HARNESS)
    done = subprocess.run(
        [NODE, str(harness), str(script)],
        input=json.dumps(state),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows: str = json.loads(done.stdout)["rows"]
    return rows


@pytest.mark.skipif(NODE is None, reason="node is not installed (the page's script runs in it)")
def test_the_page_shows_labels_with_the_ids_at_hand(tmp_path: Path) -> None:
    _root, cells, state = _mid_run(tmp_path)
    rows = _rendered_rows(state, tmp_path)
    running, queued = _by(cells, "gpu", 5), _by(cells, "cpu", 10, repeat=2)
    # the running cell: its label, then its id in full
    assert (
        f'<b class="cell-label" title="{running}">gpu c=16 r=5</b> <span class="muted">{running}</span>: '
        '<span class="phase">replay</span>'
    ) in rows
    # a queued cell: its label, its id on hover; one with no label: its id
    assert f'<span class="cell-label" title="{queued}">cpu c=16 r=10 #2</span>' in rows
    assert "<td>0123456789</td>" in rows
    # with no labels in the state (none known yet), the ids as before
    bare = _rendered_rows({**state, "labels": None}, tmp_path)
    assert f"<b>{running}</b>: " in bare and "gpu c=16 r=5" not in bare
