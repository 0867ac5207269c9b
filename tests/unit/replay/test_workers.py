"""Splitting a replay over worker processes: shares, the default count, merged counts and records."""

from __future__ import annotations

import json
from pathlib import Path

from kvoffload.datasets import VirtualUser
from kvoffload.replay.records import SessionCounts
from kvoffload.replay.workers import default_workers, merge_counts, merge_records, split


def _users(n: int) -> tuple[VirtualUser, ...]:
    return tuple(VirtualUser(user_id=f"u{i}", session_id=f"s{i}", chunk=0, calls=()) for i in range(n))


def test_users_are_dealt_round_robin_and_slots_spread_evenly() -> None:
    shares = split(_users(7), concurrency=5, workers=2)
    assert [[u.user_id for u in users] for users, _ in shares] == [
        ["u0", "u2", "u4", "u6"],
        ["u1", "u3", "u5"],
    ]
    assert [slots for _, slots in shares] == [3, 2]
    # Never more workers than slots or users: an empty worker would only cost a process.
    assert len(split(_users(2), concurrency=8, workers=4)) == 2
    assert len(split(_users(9), concurrency=3, workers=4)) == 3


def test_default_is_one_worker_per_128_slots_leaving_a_core() -> None:
    assert default_workers(512, cores=2) == 1  # a 2-core host stays in one process
    assert default_workers(64, cores=32) == 1
    assert default_workers(512, cores=32) == 4
    assert default_workers(1024, cores=4) == 3
    assert default_workers(1, cores=1) == 1


def _counts(**over: object) -> SessionCounts:
    c = SessionCounts(requested_concurrency=4, num_rounds=5, virtual_users_available=10)
    for key, value in over.items():
        setattr(c, key, value)
    return c


def test_counts_are_summed_and_the_most_telling_stop_wins() -> None:
    parent = _counts()
    parts = [
        _counts(achieved_sessions=3, complete=2, error=1, requests=12, failed_requests=1, stopped_by="pool"),
        _counts(achieved_sessions=2, incomplete=2, requests=7, stopped_by="stall", stop_reason="quiet",
                first_error="HTTP 500: boom"),
    ]  # fmt: skip
    merge_counts(parent, parts)
    assert (parent.achieved_sessions, parent.complete, parent.incomplete, parent.error) == (5, 2, 2, 1)
    assert (parent.requests, parent.failed_requests) == (19, 1)
    assert (parent.stopped_by, parent.stop_reason, parent.first_error) == ("stall", "quiet", "HTTP 500: boom")
    assert parent.requested_concurrency == 4  # what was asked stays the parent's

    one_warmup = _counts()
    merge_counts(one_warmup, [_counts(stopped_by="warmup"), _counts(stopped_by="pool")])
    assert one_warmup.stopped_by == "pool"  # the other worker replayed
    all_warmup = _counts()
    merge_counts(all_warmup, [_counts(stopped_by="warmup"), _counts(stopped_by="warmup")])
    assert all_warmup.stopped_by == "warmup"


def test_records_merge_in_a_stable_order(tmp_path: Path) -> None:
    folders = [tmp_path / "0", tmp_path / "1", tmp_path / "2"]  # the last wrote nothing
    for folder in folders[:2]:
        folder.mkdir()
    (folders[0] / "requests.jsonl").write_text(
        "".join(json.dumps({"t_start": t, "w": 0, "i": i}) + "\n" for i, t in enumerate([2.0, 1.0, 5.0]))
    )
    (folders[1] / "requests.jsonl").write_text(
        "".join(json.dumps({"t_start": t, "w": 1, "i": i}) + "\n" for i, t in enumerate([1.0, 3.0]))
    )
    out = tmp_path / "requests.jsonl"
    assert merge_records(folders, out) == 5
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["t_start"], r["w"], r["i"]) for r in rows] == [
        (1.0, 0, 1),
        (1.0, 1, 0),  # a tie: by worker, then by line
        (2.0, 0, 0),
        (3.0, 1, 1),
        (5.0, 0, 2),
    ]
