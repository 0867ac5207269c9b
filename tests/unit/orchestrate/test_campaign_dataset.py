"""campaign.json `dataset`: where the run found its dataset (absolute) and the dataset's digest, so that
a report built from any working directory finds it again (issue 43, defect 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.config import load_lab
from kvoffload.datasets.digest import dataset_digest
from kvoffload.orchestrate.campaign.runner import CampaignRunner
from kvoffload.orchestrate.results import CampaignResults
from tests.unit.orchestrate.test_campaign_flow import Progress, _lab_files


def test_campaign_json_records_the_datasets_absolute_path_and_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lab_files(tmp_path, nodes=1)  # campaign.yml names its dataset "data", relative to itself
    monkeypatch.chdir(tmp_path)
    lab = load_lab("hosts.yml", "campaign.yml")  # relative, as `run` is usually given them
    assert not lab.dataset_path.is_absolute()
    runner = CampaignRunner(
        lab, Path("hosts.yml"), CampaignResults.open(tmp_path / "results", "flow"), Progress(), tmp_path / "c"
    )
    runner.write_campaign_json()
    written = json.loads(runner.results.paths.campaign_json.read_text())
    digest = dataset_digest(tmp_path / "data")
    assert digest is not None and digest.startswith("sha256:")
    assert written["dataset"] == {"code": "generic", "path": str(tmp_path / "data"), "digest": digest}
    assert written["campaign"]["dataset"]["path"] == "data"  # the campaign as written stays as it was
