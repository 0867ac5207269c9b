"""status.json (kvoffload/orchestrate/campaign/status.py): what the board writes for each move of a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvoffload.orchestrate.campaign.status import MAX_POINTS, StatusBoard


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.fixture
def board(tmp_path: Path) -> tuple[StatusBoard, Clock, Path]:
    clock = Clock()
    path = tmp_path / "status.json"
    return StatusBoard(path, "demo", sample_interval_s=15, min_interval_s=2, clock=clock), clock, path


def test_a_run_moves_cells_from_the_queue_through_phases_to_done_or_failed(
    board: tuple[StatusBoard, Clock, Path],
) -> None:
    status, clock, path = board
    status.campaign_phase("provision")
    assert _read(path)["phase"] == "provision" and _read(path)["state"] == "starting"
    status.start({"n1": ["a", "b"], "n2": ["c"]}, skipped=["z"])
    data = _read(path)
    assert data["state"] == "running" and data["total"] == 3 and data["skipped"] == ["z"]
    assert data["nodes"]["n1"]["queued"] == ["a", "b"] and data["nodes"]["n1"]["cell"] is None
    clock.now = 1010.0
    status.phase("n1", "a", "deploy")
    clock.now = 1070.0
    status.phase("n1", "a", "replay")
    n1 = _read(path)["nodes"]["n1"]
    assert (n1["cell"], n1["phase"], n1["since"], n1["cell_since"]) == ("a", "replay", 1070.0, 1010.0)
    assert n1["queued"] == ["b"] and _read(path)["phase"] is None  # the cells run now
    clock.now = 1100.0
    status.cell_done("n1", "a", "done", None, 90.0)
    status.phase("n2", "c", "deploy")
    status.cell_done("n2", "c", "failed", "cell did not start cold: vllm-0: 3 hits", 5.0)
    data = _read(path)
    assert data["nodes"]["n1"]["done"] == [{"cell": "a", "seconds": 90.0, "at": 1100.0}]
    assert data["nodes"]["n1"]["cell"] is None and data["nodes"]["n1"]["phase"] is None
    failed = data["nodes"]["n2"]["failed"]
    assert [(f["cell"], f["status"], f["why"]) for f in failed] == [
        ("c", "failed", "cell did not start cold: vllm-0: 3 hits")
    ]
    status.node_phase("n2", "finished")
    clock.now = 1200.0
    status.finish("failed")
    data = _read(path)
    assert data["state"] == "failed" and data["finished_at"] == 1200.0 and data["updated_at"] == 1200.0
    assert data["nodes"]["n2"]["phase"] == "finished"


def test_a_cell_no_plan_listed_counts_into_the_total(board: tuple[StatusBoard, Clock, Path]) -> None:
    status, _clock, path = board
    status.start({"n1": ["a"]}, skipped=[])
    status.phase("n1", "knee-1", "deploy")  # a knee-search step
    assert _read(path)["total"] == 2 and _read(path)["nodes"]["n1"]["queued"] == ["a"]


def test_replay_progress_and_live_points_are_written_at_most_every_min_interval(
    board: tuple[StatusBoard, Clock, Path],
) -> None:
    status, clock, path = board
    status.start({"n1": ["a"]}, skipped=[])
    status.phase("n1", "a", "replay")  # written at 1000
    clock.now = 1001.0
    status.replay("n1", 0, 40)  # 1 s after the last write, nothing done yet: kept, not written
    assert _read(path)["nodes"]["n1"]["replay"] is None
    status.replay("n1", 5, 40)  # the first requests done: written at once
    assert _read(path)["nodes"]["n1"]["replay"]["done"] == 5
    clock.now = 1002.0
    status.replay("n1", 7, 40)  # 1 s after that write: kept
    assert _read(path)["nodes"]["n1"]["replay"]["done"] == 5
    clock.now = 1003.0
    status.replay("n1", 8, 40)  # 2 s after it: written
    assert _read(path)["nodes"]["n1"]["replay"] == {"since": 1001.0, "done": 8, "expected": 40}
    status.replay("n1", 40, 40)  # the last request, at once
    assert _read(path)["nodes"]["n1"]["replay"]["done"] == 40
    # live counters: a point every 15 s, the TTFT histogram as first and latest
    for t, queries in ((1004.0, 100.0), (1010.0, 150.0), (1019.0, 300.0)):
        clock.now = t
        status.live("n1", {"local_queries": queries}, {"0.1": queries / 10, "+Inf": queries / 10})
        if t == 1010.0:  # 6 s after the first point: kept as the latest only, for a rate already
            points = status.snapshot()["nodes"]["n1"]["live"]["points"]
            assert [(p["t"], p["local_queries"]) for p in points] == [(1004.0, 100.0), (1010.0, 150.0)]
    live = _read(path)["nodes"]["n1"]["live"]
    assert live["cell"] == "a"
    assert [(p["t"], p["local_queries"]) for p in live["points"]] == [(1004.0, 100.0), (1019.0, 300.0)]
    assert live["ttft_first"] == {"0.1": 10.0, "+Inf": 10.0} and live["ttft_last"]["+Inf"] == 30.0


def test_live_points_are_bounded(board: tuple[StatusBoard, Clock, Path]) -> None:
    status, clock, _path = board
    status.phase("n1", "a", "replay")
    for i in range(MAX_POINTS + 5):
        clock.now = 1000.0 + 15 * i
        status.live("n1", {"local_queries": float(i)}, {})
    points = status.snapshot()["nodes"]["n1"]["live"]["points"]
    assert len(points) == MAX_POINTS and points[0]["local_queries"] == 5.0


def test_a_write_that_fails_never_fails_the_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    status = StatusBoard(tmp_path / "missing" / "status.json", "demo")
    status.start({"n1": ["a"]}, skipped=[])
    status.phase("n1", "a", "deploy")
    assert not (tmp_path / "missing").exists()
    assert sum("cannot write" in r.message for r in caplog.records) == 1  # said once
    assert status.snapshot()["nodes"]["n1"]["phase"] == "deploy"


def test_the_runs_estimate_goes_into_the_file_with_the_queues(board: tuple[StatusBoard, Clock, Path]) -> None:
    # issue 43, defect 11: the live page's ETA needs the plan's estimate from the start; campaign.json
    # has it only once the run ends
    status, _, path = board
    estimate = {
        "total_s": 400.0,
        "priors": {"campaign_s": 40.0},
        "cells": {"a": {"install": 35.0, "engine_start": 10.0, "replay": 20.5, "overhead": 15.0}},
        "knee_search": {"cells": 3, "total_s": 90.0},
    }
    status.start({"n1": ["a"]}, [], estimate)
    assert _read(path)["estimate"] == {
        "total_s": 400.0,
        "start_s": 40.0,
        "cells": {"a": 80.5},
        "replay": {"a": 20.5},
        "knee_s": 90.0,
    }
    status.start({"n1": ["a"]}, [])  # a run with no estimate (the dataset is not on this machine)
    assert _read(path)["estimate"] is None
