"""campaign.json `prices` / `prices_source`: the prices the run resolved (the inventory's
kvoffload_prices here), which the report's decision reads before the campaign's own (issue 42)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kvoffload.config import load_lab
from kvoffload.orchestrate.campaign.runner import CampaignRunner
from kvoffload.orchestrate.results import CampaignResults
from kvoffload.report.decision_view import targets
from tests.unit.orchestrate.test_campaign_flow import Progress, _lab_files


def test_campaign_json_records_the_labs_prices_for_the_report(tmp_path: Path) -> None:
    inv, camp = _lab_files(tmp_path, nodes=1)
    inventory = yaml.safe_load(inv.read_text())
    inventory["all"]["children"]["vllm"]["vars"] = {"kvoffload_prices": {"gpu_hour": 2.5}}
    inv.write_text(yaml.safe_dump(inventory))
    lab = load_lab(inv, camp)
    runner = CampaignRunner(
        lab, inv, CampaignResults.open(tmp_path / "results", "flow"), Progress(), tmp_path / "c"
    )
    runner.write_campaign_json()
    written = json.loads(runner.results.paths.campaign_json.read_text())
    assert written["prices"]["gpu_hour"] == 2.5 and written["campaign"]["prices"] is None
    assert written["prices_source"] == lab.prices_source and "kvoffload_prices" in str(lab.prices_source)
    _, prices, source, problem = targets(written)
    assert problem is None and prices is not None and prices.gpu_hour == 2.5 and source == lab.prices_source
