"""The live page's JSON (kvoffload/report/live.py) on the fixture campaign with a status.json written
by the run's own StatusBoard; every expected figure is worked by hand from the fixture's README."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvoffload.orchestrate.campaign.status import StatusBoard
from kvoffload.report import live
from kvoffload.report.live import LiveView, RecordTail, histogram_quantile, live_series
from tests.support.watch import Clock, mid_run_campaign


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    return mid_run_campaign(tmp_path)


def _state(campaign: Path, findings: bool = False) -> dict[str, Any]:
    view = (
        LiveView(campaign, clock=lambda: 2045.0)
        if findings
        else LiveView(campaign, findings=lambda _root: [], clock=lambda: 2045.0)
    )
    if findings:
        assert view.refresh_findings()
        assert not view.refresh_findings()  # the same DONE cells: nothing computed again
    state = view.state()
    json.dumps(state)  # the endpoint serves it as JSON
    return state


def test_progress_and_eta_of_the_campaign_and_its_nodes(campaign: Path) -> None:
    s = _state(campaign)
    assert s["campaign"] == "fixture-small" and s["state"] == "running"
    assert s["progress"] == {"done": 3, "failed": 1, "total": 7}
    assert s["elapsed_s"] == 1045.0
    gpu1, gpu2 = s["nodes"]
    assert (gpu1["node"], gpu1["cell"], gpu1["phase"], gpu1["in_phase_s"]) == (
        "gpu1",
        "b2cpu",
        "replay",
        45.0,
    )
    # finished cells last (150 + 170 + 160) / 3 = 160 s; b2cpu has run 55 s of them, gpu2 has two queued
    assert gpu1["eta_s"] == 105.0 and gpu2["eta_s"] == 320.0 and s["eta_s"] == 320.0
    assert gpu2["queued"] == ["c1", "c2"] and gpu2["cell"] is None
    # 30 of 120 requests in 45 s: 90 more at that pace
    assert gpu1["replay"] == {"done": 30, "expected": 120, "elapsed_s": 45.0, "eta_s": 135.0}
    assert [f["cell"] for f in gpu1["failed"]] == ["b1gpu"] and gpu1["failed"][0]["why"] == "interrupted"


def test_finished_cells_carry_their_records_figures(campaign: Path) -> None:
    done = {d["cell"]: d for d in _state(campaign)["nodes"][0]["done"]}
    # a1gpu's later rounds: TTFT 0.10 + 0.02 (k-1) + 0.01 (u-1), k = 2, 3, u = 1..4:
    # .12 .13 .14 .14 .15 .15 .16 .17 -> p50 (.14 + .15) / 2, p95 at rank 6.65: .16 + .65 * .01
    a1 = done["a1gpu"]
    assert a1["requests"] == 12 and a1["failed"] == 0 and a1["later_n"] == 8
    assert a1["later_ttft_p50_s"] == pytest.approx(0.145) and a1["later_ttft_p95_s"] == pytest.approx(0.1665)
    assert done["a2cpu"]["later_ttft_p50_s"] == pytest.approx(0.8 * 0.145)  # TTFT x0.8
    # b1gpu: user 4's round 3 failed (HTTP 500)
    assert _state(campaign)["nodes"][0]["failed"][0]["failed"] == 1


def test_live_figures_of_the_running_cell(campaign: Path) -> None:
    live = _state(campaign)["nodes"][0]["live"]
    # local hit: 40/100 then 100/200, then after the reset 25/50
    assert live["series"]["local_hit"] == [[2015.0, 0.4], [2030.0, 0.5], [2045.0, 0.5]]
    assert [v for _, v in live["series"]["kv_usage"]] == [0.2, 0.5, 0.6, 0.7]
    assert live["latest"]["kv_usage"] == 0.7 and live["latest"]["external_hit"] is None
    # no records on the controller yet: the replicas' histogram, 10 under 0.1 s and 10 in (0.1, 0.2]
    assert live["ttft_source"] == "replicas' histogram, all rounds" and live["failed_requests"] is None
    assert live["ttft_p50_s"] == pytest.approx(0.1) and live["ttft_p95_s"] == pytest.approx(0.19)


def test_findings_of_the_done_cells_are_the_reports(campaign: Path) -> None:
    s = _state(campaign, findings=True)
    assert s["findings_cells"] == ["a1gpu", "a2cpu", "a3nvme"] and s["findings_error"] is None
    statements = [t for g in s["findings"] for t in g["statements"]]
    assert len(s["findings"]) == 1  # group b has no DONE cell yet
    assert any(t.startswith("cpu changes later-round p50 TTFT by -20 %") for t in statements)
    assert not (campaign / "tables").exists()  # computed on a copy: the watcher never writes there


def test_the_final_state_after_the_run(campaign: Path) -> None:
    status = json.loads((campaign / "status.json").read_text())
    status.update(state="done", finished_at=2100.0)
    (campaign / "status.json").write_text(json.dumps(status))
    s = _state(campaign)
    assert s["state"] == "done" and s["eta_s"] == 0.0 and s["elapsed_s"] == 1100.0


def test_a_record_file_is_tailed_from_where_the_last_read_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "requests.jsonl"
    lines = [
        json.dumps({"round": 1, "status": "ok", "ttft_s": 9.0}),
        json.dumps({"round": 2, "status": "ok", "ttft_s": 0.2}),
        json.dumps({"round": 3, "status": "error", "ttft_s": None}),
    ]
    path.write_text(lines[0] + "\n" + lines[1][:10])  # the second line still being written
    tail = RecordTail(path)
    tail.read()
    assert (tail.requests, tail.later_ttfts, tail.offset) == (1, [], path.stat().st_size)
    with path.open("a") as handle:
        handle.write(lines[1][10:] + "\n" + lines[2] + "\n")
    tail.read()
    assert (tail.requests, tail.failed, tail.later_ttfts) == (3, 1, [0.2])
    monkeypatch.setattr(live, "READ_CHUNK", 7)  # read in pieces: every line spans several
    fresh = RecordTail(path)
    fresh.read()
    assert (fresh.requests, fresh.failed, fresh.later_ttfts, fresh.partial) == (3, 1, [0.2], b"")
    path.write_text(lines[1] + "\n")  # replaced by a shorter file: read again from its start
    tail.read()
    assert (tail.requests, tail.failed, tail.later_ttfts) == (1, 0, [0.2])


def test_histogram_quantile_and_rates_by_hand() -> None:
    first = {"1": 0.0, "2": 0.0, "+Inf": 0.0}
    # 4 in (0, 1], 4 in (1, 2], 2 above 2
    last = {"1": 4.0, "2": 8.0, "+Inf": 10.0}
    assert histogram_quantile(0.5, first, last) == pytest.approx(1.25)  # rank 5: a quarter into (1, 2]
    assert histogram_quantile(0.95, first, last) == 2.0  # in +Inf: the last finite bound
    assert histogram_quantile(0.5, last, last) is None  # nothing observed between the two
    series = live_series([{"t": 0.0, "lmcache_requested": 100.0}, {"t": 15.0, "lmcache_requested": 100.0}])
    assert series["lmcache_l1_hit"] == [[15.0, None]]  # no lookups in that step: no rate


def test_before_any_cell_finished_the_eta_is_the_runs_estimate(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    clock = Clock(100.0)
    board = StatusBoard(root / "status.json", "c", clock=clock)
    board.start({"n1": ["x", "y"]}, [])
    board.phase("n1", "x", "deploy")
    estimate = {
        "total_s": 450.0,
        "cells": {
            "x": {"install": 60.0, "engine_start": 20.0, "replay": 15.0, "overhead": 5.0},
            "y": {"install": 0.0, "engine_start": 0.0, "replay": 45.0, "overhead": 5.0},
        },
    }
    (root / "campaign.json").write_text(json.dumps({"estimate": estimate}))
    s = LiveView(root, findings=lambda _root: [], clock=lambda: 110.0).state()
    # x (100 s) and y (50 s) left, x 10 s under way
    assert s["nodes"][0]["eta_s"] == 140.0 and s["eta_s"] == 140.0 and s["estimate_s"] == 450.0


def test_the_plans_eta_shows_from_the_start_until_the_runs_pace_replaces_it(tmp_path: Path) -> None:
    # issue 43, defect 11: the page showed "ETA ?" for minutes: campaign.json gets the estimate only at
    # the run's end. status.json now carries it from the start (no campaign.json here at all).
    root = tmp_path / "c"
    root.mkdir()
    clock = Clock(100.0)
    board = StatusBoard(root / "status.json", "c", clock=clock)
    estimate = {
        "total_s": 180.0,
        "cells": {
            "x": {"install": 60.0, "engine_start": 20.0, "replay": 15.0, "overhead": 5.0},
            "y": {"install": 0.0, "engine_start": 0.0, "replay": 45.0, "overhead": 5.0},
        },
        "priors": {"campaign_s": 30.0},
        "knee_search": {"cells": 4, "total_s": 500.0},
    }
    board.start({"n1": ["x", "y"]}, [], estimate)
    board.campaign_phase("provision")

    def state(now: float) -> dict[str, Any]:
        clock.now = now
        return LiveView(root, findings=lambda _root: [], clock=lambda: now).state()

    # 10 s into provisioning: x (100 s) and y (50 s), and 20 s of the run's planned 30 s start left
    s = state(110.0)
    assert (s["nodes"][0]["eta_s"], s["eta_s"], s["estimate_s"]) == (150.0, 170.0, 180.0)
    assert s["knee_worst_s"] == 500.0  # apart: the knee search's worst case, after the cells
    # x began at 130, its replay's first poll was at 142, and no request has finished by 145: the
    # planned 15 s less 3; x has 100 - 15 s left, then y
    clock.now = 130.0
    board.phase("n1", "x", "deploy")
    clock.now = 140.0
    board.phase("n1", "x", "replay")
    clock.now = 142.0
    board.replay("n1", 0, 40)
    s = state(145.0)
    assert s["nodes"][0]["replay"]["eta_s"] == 12.0 and s["eta_s"] == 85.0 + 50.0
    # x took 200 s, twice its plan: y is expected at that pace, 2 x 50 s
    clock.now = 330.0
    board.cell_done("n1", "x", "done", None, 200.0)
    s = state(335.0)
    assert s["nodes"][0]["eta_s"] == 100.0 and s["eta_s"] == 100.0
