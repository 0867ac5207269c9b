"""A results folder caught mid-run, for the tests of `watch`: the fixture campaign (tests/fixtures/
campaign-small) with a status.json written by the run's own StatusBoard."""

from __future__ import annotations

import shutil
from pathlib import Path

from kvoffload.orchestrate.campaign.status import StatusBoard

FIXTURE = Path(__file__).parents[1] / "fixtures" / "campaign-small"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def mid_run_campaign(tmp_path: Path, offset: float = 0.0) -> Path:
    """`offset` shifts every time the board writes (a page in a browser compares them with its clock).
    The fixture mid-run: a1gpu, a2cpu, a3nvme done, b1gpu interrupted, b2cpu in its replay (no DONE,
    its records still on the client host), and a second node with two cells queued."""
    dest = tmp_path / "fixture-small"
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("tables", "report", "*.py", "*.md"))
    (dest / "cells" / "b2cpu" / "DONE").unlink()
    (dest / "cells" / "b2cpu" / "requests.jsonl").unlink()
    clock = Clock(offset + 1000.0)
    board = StatusBoard(
        dest / "status.json", "fixture-small", sample_interval_s=15, min_interval_s=0, clock=clock
    )
    board.start({"gpu1": ["a1gpu", "a2cpu", "a3nvme", "b1gpu", "b2cpu"], "gpu2": ["c1", "c2"]}, [])
    for cell, seconds, status in (
        ("a1gpu", 150.0, "done"),
        ("a2cpu", 170.0, "done"),
        ("a3nvme", 160.0, "done"),
        ("b1gpu", 40.0, "interrupted"),
    ):
        board.phase("gpu1", cell, "replay")
        board.cell_done("gpu1", cell, status, None, seconds)
    clock.now = offset + 1990.0
    board.phase("gpu1", "b2cpu", "deploy")
    clock.now = offset + 2000.0
    board.phase("gpu1", "b2cpu", "replay")
    board.replay("gpu1", 0, 120)
    zero = {"0.1": 0.0, "0.2": 0.0, "+Inf": 0.0}
    for t, queries, hits, usage in ((2000.0, 0, 0, 0.2), (2015.0, 100, 40, 0.5), (2030.0, 300, 140, 0.6)):
        clock.now = offset + t
        board.live("gpu1", {"local_queries": queries, "local_hits": hits, "kv_usage": usage}, zero)
    clock.now = offset + 2045.0  # a replica restarted: its counters start again from 0
    board.live(
        "gpu1",
        {"local_queries": 50, "local_hits": 25, "kv_usage": 0.7},
        {"0.1": 10.0, "0.2": 20.0, "+Inf": 20.0},
    )
    board.replay("gpu1", 30, 120)
    return dest
