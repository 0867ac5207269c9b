"""Shared-prefix reuse per cell from the cell's dataset (report/prompts.py, analysis/reuse.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvoffload.analysis.reuse import prefix_reuse, records_prefix_reuse
from kvoffload.report.prompts import shared_prefix_reuse

SYSTEM = {"role": "system", "content": "You are a careful agent. " * 40}


def _dataset(path: Path) -> Path:
    """Two sessions of two calls (sammshen's re-shaped sample) sharing one long system prompt."""
    rows = []
    for sid in ("s1", "s2"):
        history = [SYSTEM, {"role": "user", "content": f"task of {sid} " * 30}]
        for i in range(2):
            rows.append(
                {
                    "model": "m",
                    "messages": list(history),
                    "metadata": {"session_id": sid, "request_index": i, "output_length": 8},
                }
            )
            history += [
                {"role": "assistant", "content": f"answer {i} of {sid} " * 10},
                {"role": "user", "content": f"more {i} {sid} " * 10},
            ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cells(path: str) -> pd.DataFrame:
    return pd.DataFrame(
        [{"cell_id": "c1", "dataset_code": "sammshen", "dataset_path": path, "num_rounds": 2, "model": "m"}]
    )


def _requests() -> pd.DataFrame:
    rows = [
        {"cell_id": "c1", "session_id": s, "chunk": 0, "round": r, "t_start": t, "request_id": f"{s}-{r}"}
        for s, r, t in (("s1", 1, 0.0), ("s2", 1, 1.0), ("s1", 2, 2.0), ("s2", 2, 3.0))
    ]
    return pd.DataFrame(rows)


def test_shared_prefix_reuse_counts_the_prefix_other_users_share(tmp_path: Path) -> None:
    data = _dataset(tmp_path / "session.jsonl")
    value, why = shared_prefix_reuse(_cells(str(data)), _requests())["c1"]
    assert why is None and value is not None
    # Same-user history alone: each round-2 prompt reuses its round-1 prompt. Shared prefix on top: s2's
    # round-1 prompt reuses the system prompt s1 sent first.
    per_user = shared_prefix_reuse(_cells(str(data)), _requests().iloc[[0, 2]])["c1"][0]
    assert per_user is not None
    solo = shared_prefix_reuse(_cells(str(data)), _requests().iloc[[1, 3]])["c1"][0]
    assert solo is not None and value > max(per_user, solo)  # the two users together reuse more
    # an unknown conversation or a dataset not on this machine: null, with the reason
    other = _requests().assign(session_id="nope")
    assert shared_prefix_reuse(_cells(str(data)), other)["c1"][0] is None
    value, why = shared_prefix_reuse(_cells(str(tmp_path / "absent.jsonl")), _requests())["c1"]
    assert value is None and why is not None and "not on this machine" in why


def test_records_prefix_reuse_orders_by_send_time() -> None:
    ids = {("a", 0, 1): [1, 2, 3, 4], ("b", 0, 1): [1, 2, 9, 9], ("a", 0, 2): [1, 2, 3, 4, 5, 6]}
    req = pd.DataFrame(
        [
            {"session_id": s, "chunk": c, "round": r, "t_start": t, "request_id": str(t)}
            for (s, c, r), t in zip(ids, (2.0, 0.0, 1.0), strict=True)
        ]
    )
    got = records_prefix_reuse(req, lambda s, c, r: ids.get((s, c, r)), block_size=2)
    # send order b (0 reusable), a2 ([1, 2] from b), a1 (all 4 from a2): 6 of 14
    assert got == pytest.approx(prefix_reuse([ids[("b", 0, 1)], ids[("a", 0, 2)], ids[("a", 0, 1)]], 2))
    assert got == pytest.approx(6 / 14)
