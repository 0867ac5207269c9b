"""What the estimate learns from a results folder: the fixture campaign's cells (tests/fixtures/
campaign-small) given timings by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kvoffload.contracts.layout import CampaignPaths
from kvoffload.orchestrate.estimate_inputs import earlier_cells, earlier_starts, measured_phases

FIXTURE = Path(__file__).parents[2] / "fixtures" / "campaign-small"


def test_done_cells_give_their_timings_requests_and_concurrency(tmp_path: Path) -> None:
    root = tmp_path / "fixture-small"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("tables", "report", "*.py", "*.md"))
    for cell in ("a1gpu", "a2cpu", "a3nvme", "b1gpu", "b2cpu"):
        path = root / "cells" / cell / "cell.json"
        meta = json.loads(path.read_text())
        meta["timings"] = {"deploy": 10.0, "replay": 75.0, "total": 90.0}
        path.write_text(json.dumps(meta))
    campaign = json.loads((root / "campaign.json").read_text())
    campaign["timings"] = {"cells": 500.0, "provision": 123.0}
    (root / "campaign.json").write_text(json.dumps(campaign))
    measured = earlier_cells(CampaignPaths(root))
    # b1gpu has no DONE; a-cells sent 12 requests (4 users x 3 rounds) at concurrency 2, b2cpu 3 sessions
    # at concurrency 8: 3 in flight
    assert len(measured) == 4
    assert [(m.requests, m.in_flight) for m in measured[:3]] == [(12, 2)] * 3
    assert measured[3].in_flight == 3 and measured[0].timings["replay"] == 75.0
    # the fixture's sessions.json predate duration_s: the replay's own time is unknown
    assert all(m.replay_own_s is None for m in measured)
    # the 4 DONE cells ran on one node (the fixture names none), 90 s each: the run's start is 500 - 360
    assert earlier_starts(CampaignPaths(root)) == [140.0]
    assert earlier_starts(CampaignPaths(tmp_path / "none")) == []
    # what a run measured: a1gpu with its replay's own 12 s, a2cpu as its timings say
    counts = json.loads((root / "cells" / "a1gpu" / "sessions.json").read_text())
    (root / "cells" / "a1gpu" / "sessions.json").write_text(json.dumps({**counts, "duration_s": 12.0}))
    got = measured_phases(CampaignPaths(root), ["a1gpu", "a2cpu"], 400.0)
    # replay 12 + 75; overhead (75 - 12) + 0: deploy 10 a cell
    assert got == {
        "phases": {"install": 0.0, "engine_start": 20.0, "replay": 87.0, "overhead": 63.0},
        "total_s": 400.0,
    }
