"""Data notes become warnings; informational ones are grouped by kind (issue 34)."""

from __future__ import annotations

import json

import pandas as pd

from kvoffload.analysis.nulls import grouped_info, is_info, note_warnings


def _row(cell_id: str, notes: list[tuple[str, str]] | None) -> dict[str, object]:
    return {
        "cell_id": cell_id,
        "model": "m",
        "concurrency": 2,
        "num_rounds": 3,
        "isl": 8,
        "osl": 4,
        "repeat": 0,
        "node": None,
        "data_notes": None if notes is None else json.dumps([{"kind": k, "message": m} for k, m in notes]),
    }


def test_notes_and_unreadable_files_become_cell_warnings() -> None:
    summary = pd.DataFrame(
        [
            _row("c1", [("counter_unknown", "vllm-1: no start: figures from x are null")]),
            _row("c2", None),
        ]
    )
    w = note_warnings(summary, [{"cell_id": "c2", "file": "sessions.json", "reason": "not valid JSON"}])
    assert w[["cell_id", "kind"]].to_numpy().tolist() == [
        ["c2", "file_unreadable"],
        ["c1", "counter_unknown"],
    ]
    assert "sessions.json" in w.loc[0, "message"] and "m c=2" in w.loc[1, "group"]


def test_informational_warnings_are_grouped_by_kind_and_validity_ones_left_out() -> None:
    fallback = (
        "kv_usage comes from the before/after snapshots: the run was shorter than one sampling interval"
    )
    warnings = [
        {"kind": "fallback_before_after", "cell_id": c, "message": fallback} for c in ("c3", "c1", "c2")
    ]
    warnings += [
        {"kind": "counter_reset", "cell_id": "c1", "message": "vllm-0: x was reset"},
        {"kind": "counter_unknown", "cell_id": "c1", "message": "vllm-1: null"},
    ]
    assert is_info("fallback_before_after") and not is_info("counter_unknown")
    groups = grouped_info(warnings)
    assert [(g["kind"], g["count"], g["cells"], len(g["messages"])) for g in groups] == [
        ("fallback_before_after", 3, ["c1", "c2", "c3"], 1),
        ("counter_reset", 1, ["c1"], 1),
    ]
