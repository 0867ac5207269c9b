"""Shared-prefix reuse per cell from the cell's dataset (report/prompts.py, analysis/reuse.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from kvoffload.analysis.reuse import prefix_reuse, records_prefix_reuse
from kvoffload.datasets.digest import dataset_digest
from kvoffload.ingest import Tables
from kvoffload.report.build import with_prefix_reuse
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


def _demo_like(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """A repository whose campaign file (inventories/local/campaign.yml) names its dataset relative to
    itself, "../../data/ds", as the demo does; campaign.json as `run` writes it from the repository."""
    data = tmp_path / "repo" / "data" / "ds"
    data.mkdir(parents=True)
    _dataset(data / "session.jsonl")
    campaign = {
        "campaign": {"dataset": {"code": "sammshen", "path": "../../data/ds"}},
        "campaign_file": "inventories/local/campaign.yml",
        "dataset": {"code": "sammshen", "path": str(data), "digest": dataset_digest(data)},
    }
    return data, campaign


def _with_reuse(campaign: dict[str, object]) -> pd.DataFrame:
    summary = pd.DataFrame({"cell_id": ["c1"], "reuse_share": [0.5], "data_notes": [None]})
    empty = pd.DataFrame()
    t = Tables(cells=_cells("../../data/ds"), requests=_requests(), sessions=empty, samples=empty,
               campaign=campaign)  # fmt: skip
    return with_prefix_reuse(summary, t)


def test_a_dataset_relative_to_the_campaign_file_is_found_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 43, defect 7: the cells keep "../../data/ds" (relative to the campaign file); the report,
    built from another working directory, finds the dataset where the run recorded it."""
    data, campaign = _demo_like(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    out = _with_reuse(campaign)
    expected, _ = shared_prefix_reuse(_cells(str(data)), _requests())["c1"]
    assert expected is not None and expected > 0
    assert out.loc[0, "shared_prefix_reuse_share"] == pytest.approx(expected)
    assert out.loc[0, "data_notes"] is None


def test_the_dataset_is_taken_by_its_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, campaign = _demo_like(tmp_path)
    expected, _ = shared_prefix_reuse(_cells(str(data)), _requests())["c1"]
    # moved: no longer at the recorded path, but "../../data/ds" from the report's working directory
    moved = tmp_path / "data" / "ds"
    moved.parent.mkdir()
    data.rename(moved)
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    assert _with_reuse(campaign).loc[0, "shared_prefix_reuse_share"] == pytest.approx(expected)
    # only another dataset, at the recorded path: not taken, and the note says why
    shutil.move(moved, data)
    (data / "session.jsonl").write_text((data / "session.jsonl").read_text().replace("careful", "careless"))
    out = _with_reuse(campaign)
    assert pd.isna(out.loc[0, "shared_prefix_reuse_share"])
    (note,) = json.loads(str(out.loc[0, "data_notes"]))
    assert note["kind"] == "prefix_reuse_unknown"
    assert f"with digest {campaign['dataset']['digest']} is not on this machine" in note["message"]  # type: ignore[index]
    assert f"{data} (another digest, sha256:" in note["message"]
