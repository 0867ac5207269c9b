"""Virtual users: exact chunks, the 5-round floor for non-sammshen loaders, and the ceiling table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.cli.main import main
from kvoffload.datasets import Call, Session, ceiling_table, virtual_users


def _session(sid: str, n: int) -> Session:
    msgs: tuple[dict[str, str], ...] = ()
    calls = []
    for i in range(n):
        msgs = (*msgs, {"role": "user", "content": f"{sid}-{i}"})
        calls.append(Call(sid, i, msgs))
    return Session(sid, tuple(calls))


SESSIONS = [_session("a", 12), _session("b", 5), _session("c", 4)]


def test_chunks_are_consecutive_and_exact() -> None:
    users = virtual_users(SESSIONS, "generic", 5)
    assert [(u.user_id, len(u.calls)) for u in users] == [("a:0", 5), ("a:1", 5), ("b:0", 5)]
    assert [c.index for c in users[1].calls] == [5, 6, 7, 8, 9]


def test_floor_applies_to_every_loader_but_sammshen() -> None:
    assert virtual_users(SESSIONS, "generic", 4) == []
    assert virtual_users(SESSIONS, "tau2-bench-v1", 1) == []
    assert len(virtual_users(SESSIONS, "sammshen", 4)) == 3 + 1 + 1
    assert len(virtual_users(SESSIONS, "generic", 4, min_chunk_rounds=1)) == 5


def test_ceiling_table_counts_what_virtual_users_builds() -> None:
    for code in ("generic", "sammshen"):
        table = ceiling_table(SESSIONS, code, 13)
        for rounds, n in table.items():
            assert n == len(virtual_users(SESSIONS, code, rounds))
    assert ceiling_table(SESSIONS, "generic", 6)[5] == 3


def test_inspect_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.jsonl"
    with path.open("w") as fh:
        for s in SESSIONS:
            for c in s.calls:
                fh.write(json.dumps({"session_id": s.session_id, "messages": list(c.messages)}) + "\n")
    assert main(["datasets", "inspect", "--dataset-code", "generic", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sessions"] == 3 and out["calls"] == 21
    assert out["calls_per_session"] == {"min": 4, "median": 5, "max": 12}
    assert out["virtual_users"]["5"] == 3 and out["virtual_users"]["4"] == 0
    assert len(out["virtual_users"]) == 50
