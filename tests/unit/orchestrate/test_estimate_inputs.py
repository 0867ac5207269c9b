"""What the estimate learns from a results folder: the fixture campaign's cells (tests/fixtures/
campaign-small) given timings by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.config import LabConfig, load_lab
from kvoffload.contracts.layout import CampaignPaths
from kvoffload.orchestrate.campaign.estimate_inputs import (
    campaign_estimate,
    earlier_cells,
    earlier_starts,
    measured_phases,
)
from kvoffload.orchestrate.campaign.pools import CellPools
from tests.support.small_campaign import copy_small

EXAMPLE = Path(__file__).parents[3] / "inventories" / "example" / "hosts.yml"


def test_done_cells_give_their_timings_requests_and_concurrency(tmp_path: Path) -> None:
    root = copy_small(tmp_path / "fixture-small")
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
        "wall_s": 400.0,
        "knee_search": None,
    }


def test_the_knee_search_is_timed_apart_from_the_cells_it_followed(tmp_path: Path) -> None:
    # issue 43, defect 11: the run's wall time held the knee search, its estimate did not
    root = copy_small(tmp_path / "fixture-small")
    for cell in ("a1gpu", "a2cpu", "a3nvme", "b2cpu"):
        path = root / "cells" / cell / "cell.json"
        meta = json.loads(path.read_text())
        path.write_text(json.dumps({**meta, "timings": {"deploy": 10.0, "replay": 75.0, "total": 90.0}}))
    got = measured_phases(CampaignPaths(root), ["a1gpu", "a2cpu", "a3nvme"], 500.0, 120.0, ["b2cpu"])
    # what the estimate's total covers: 500 - 120; the knee search's one step and 120 s apart
    assert got["total_s"] == 380.0 and got["wall_s"] == 500.0
    assert got["knee_search"] == {"cells": 1, "total_s": 120.0}
    # the run's start: 500 s of wall time, less the knee search's 120 and the campaign cells' 270 (b2cpu
    # was a knee step: not a campaign cell of the node)
    campaign = json.loads((root / "campaign.json").read_text())
    campaign["timings"] = {"cells": 500.0, "knee-search": 120.0}
    campaign["knee_search"] = [{"steps": [{"action": "try", "concurrency": 8, "cell_id": "b2cpu"}]}]
    (root / "campaign.json").write_text(json.dumps(campaign))
    assert earlier_starts(CampaignPaths(root)) == [110.0]


def _lab(tmp_path: Path, users: int = 8, gap_s: float = 0.0, **campaign: Any) -> LabConfig:
    """The example lab with one replica a node, `users` conversations of 5 calls (one virtual user
    each at num_rounds 5, every call `gap_s` after the last) and a real-vLLM campaign (no cost profile:
    a request is the flat default, 1 s alone, 0.75 s of it engine time)."""
    inventory = yaml.safe_load(EXAMPLE.read_text())
    inventory["all"]["vars"].pop("kvoffload_campaign")
    for host in ("gpu01.lab.example", "gpu02.lab.example"):
        inventory["all"]["hosts"][host]["vllm_replicas"] = [{"index": 0, "gpus": "0"}]
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    lines = []
    for s in range(users):
        messages: list[dict[str, Any]] = [{"role": "system", "content": f"session {s}"}]
        for c in range(5):
            messages = [*messages, {"role": "user", "content": f"question {c}"}]
            lines.append(json.dumps({"session_id": f"s{s}", "messages": messages, "output_length": 8,
                                     "pre_gap": gap_s}))  # fmt: skip
            messages = [*messages, {"role": "assistant", "content": f"answer {c}"}]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "calls.jsonl").write_text("\n".join(lines) + "\n")
    doc = {"name": "est", "model": "m", "gpu_vendor": "nvidia", "engine": "vllm", "tiers": ["gpu"],
           "dataset": {"code": "generic", "path": "data"}, "concurrency": [1], "num_rounds": [5],
           "isl": 4096, **campaign}  # fmt: skip
    (tmp_path / "campaign.yml").write_text(yaml.safe_dump(doc))
    return load_lab(tmp_path / "hosts.yml", tmp_path / "campaign.yml")


def _replay(lab: LabConfig, tmp_path: Path) -> tuple[float, dict[str, Any]]:
    pools = CellPools(lab)
    e = campaign_estimate(lab, lab.cells, tmp_path / "results", pools.expected, pools.users)
    (cell,) = e.cells.values()
    return cell["replay"], e.to_json()


def test_requests_in_flight_share_the_engine(tmp_path: Path) -> None:
    # issue 43, defect 11: a request under load was taken to last as long as alone (40 x 1 s / 8 = 5 s).
    # 8 users at once on one replica: each round 8 x 0.75 s of shared engine time, then 0.25 s: 6.25 s
    replay, doc = _replay(_lab(tmp_path, concurrency=[8]), tmp_path)
    assert replay == pytest.approx(5 * 6.25)
    assert "shared by the requests in flight" in doc["replay_model"]


def test_the_recorded_gaps_are_waited_when_the_campaign_honors_them(tmp_path: Path) -> None:
    # issue 43, defect 11: 8 users one after the other, 5 requests of 1 s and 4 gaps of 5 s each
    replay, _ = _replay(_lab(tmp_path, gap_s=5.0, honor_gaps=True), tmp_path)
    assert replay == pytest.approx(8 * (5 * 1.0 + 4 * 5.0))


def test_duration_s_caps_the_replay(tmp_path: Path) -> None:
    # issue 43, defect 11: 40 requests of 1 s one after the other, no new one after 12 s
    replay, _ = _replay(_lab(tmp_path, duration_s=12), tmp_path)
    assert replay == pytest.approx(12.0)


def test_the_knee_search_worst_case_is_estimated_apart(tmp_path: Path) -> None:
    # issue 43, defect 11: the knee search's cells were in no estimate. 4 users, the campaign at 2, the
    # ramp capped at the 4 users: knee at 1 or 2 -> (1); at 3 or 4 -> (4, 3); beyond -> (4)
    lab = _lab(tmp_path, users=4, concurrency=[2], knee_search={"slo_p95_ttft_s": 1.0, "max_concurrency": 64})
    _, doc = _replay(lab, tmp_path)
    knee = doc["knee_search"]
    # (4, 3): at 4, 5 rounds of 4 x 0.75 + 0.25 = 16.25 s; at 3, 5 rounds of 3 x 0.75 + 0.25 = 12.5 s and
    # then the fourth user alone, 5 s; two cells' overhead (15 s) and one engine start (180 s)
    assert knee["cells"] == 2 and knee["ramps"][0]["concurrency"] == [4, 3]
    assert knee["total_s"] == pytest.approx(16.25 + 17.5 + 2 * 15 + 180)
    # and not in the run's total: its start (40 s) and the one cell (engine start, 5 rounds of
    # 2 x 0.75 + 0.25 = 1.75 s for two users, then the next two: 17.5 s, overhead, install)
    assert doc["total_s"] == pytest.approx(40 + 35 + 180 + 17.5 + 15)


def test_a_long_ramp_plays_24_concurrencies_and_interpolates_the_rest() -> None:
    from kvoffload.orchestrate.campaign.estimate_inputs import KNEE_ANCHORS, _step_seconds

    played: list[int] = []

    def replay(c: int) -> float:
        played.append(c)
        return 10.0 * math.log(c)  # a straight line on the log scale: interpolation is exact

    got = _step_seconds(list(range(1, 101)), replay)
    assert len(played) == KNEE_ANCHORS == 24 and played[0] == 1 and played[-1] == 100
    assert all(got[c] == pytest.approx(10.0 * math.log(c)) for c in range(1, 101))
    assert _step_seconds([2, 4], replay) == {2: 10.0 * math.log(2), 4: 10.0 * math.log(4)}
