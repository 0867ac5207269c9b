"""What plan says about the client pool, with the vCPUs earlier cells found."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from kvoffload.config import load_lab
from kvoffload.contracts.layout import CampaignPaths
from kvoffload.orchestrate.installs.client_plan import client_plan, known_vcpus
from tests.unit.config.conftest import BASE_CAMPAIGN, BASE_INVENTORY


def _lab(tmp_path: Path, concurrency: list[int]) -> Any:
    inventory: dict[str, Any] = copy.deepcopy(BASE_INVENTORY)
    campaign = {**copy.deepcopy(BASE_CAMPAIGN), "concurrency": concurrency, "tiers": ["gpu"]}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "campaign.yml").write_text(yaml.safe_dump(campaign))
    return load_lab(tmp_path / "hosts.yml", tmp_path / "campaign.yml")


def _cell_json(results: CampaignPaths, cell_id: str, finished: str, vcpus: int) -> None:
    folder = results.cell(cell_id).root
    folder.mkdir(parents=True)
    hosts = {"h1": {"vcpus": vcpus}, "h2": {"vcpus": 64}}
    (folder / "cell.json").write_text(json.dumps({"finished_at": finished, "hosts": hosts}))


def test_the_latest_cell_says_a_hosts_vcpus(tmp_path: Path) -> None:
    results = CampaignPaths(tmp_path / "results" / "t1")
    _cell_json(results, "b", "2026-12-05T01:00:00", 2)
    _cell_json(results, "a", "2026-12-05T02:00:00", 4)
    (results.cells_dir / "c").mkdir()
    (results.cells_dir / "c" / "cell.json").write_text("{broken")
    assert known_vcpus(results) == {"h1": 4, "h2": 64}
    assert known_vcpus(CampaignPaths(tmp_path / "none")) == {}


def test_a_client_host_short_of_cores_is_warned_about(tmp_path: Path) -> None:
    lab = _lab(tmp_path, [64, 512])
    results = CampaignPaths(tmp_path / "results" / "t1")
    where = {c.id: "h2" for c in lab.cells}
    before = client_plan(lab, where, lab.cells, results)
    assert before.warnings == []  # no run yet: the cores are not known
    assert "up to 512 streams at once, needs 5 cores" in before.lines()[0]
    assert "vCPUs not known yet" in before.lines()[0]
    _cell_json(results, "x", "2026-12-05T01:00:00", 4)
    after = client_plan(lab, where, lab.cells, results)
    assert "4 vCPUs" in after.lines()[0]
    assert len(after.warnings) == 1
    assert after.warnings[0].startswith("client host h1: 512 streams at once on 4 vCPUs (171 a core")
    assert "the run needs about 2 client hosts of 4 vCPUs" in after.warnings[0]
