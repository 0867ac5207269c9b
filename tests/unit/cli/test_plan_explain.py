"""`kvoffload-lab plan --explain KEY`: one key's doc block without an inventory; an unknown key exits 2
with the closest keys and the doc files."""

from __future__ import annotations

import pytest

from kvoffload.cli.main import main


def test_explain_a_campaign_key_needs_no_inventory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--explain", "knee_search.resolution"]) == 0
    out = capsys.readouterr().out
    assert "### `knee_search.resolution`" in out
    assert "- type: positive integer" in out
    assert "- default: `1`" in out
    assert "- example: `resolution: " in out
    assert "(in docs/campaign.md, section `knee_search`)" in out


@pytest.mark.parametrize("typed", ["vllm_replicas[0].gpus", "vllm_replicas.gpus", "vllm_replicas[].gpus"])
def test_explain_an_inventory_key_of_list_items(typed: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--explain", typed]) == 0
    out = capsys.readouterr().out
    assert "### `vllm_replicas[].gpus`" in out
    assert "(in docs/inventory.md" in out


def test_explain_through_the_inventory_variable_that_holds_the_campaign(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--explain", "kvoffload_campaign.dataset.code"]) == 0
    assert "### `dataset.code`" in capsys.readouterr().out
    assert main(["plan", "--explain", "kvoffload_prices.kwh"]) == 0
    assert "### `prices.kwh`" in capsys.readouterr().out


def test_an_unknown_key_exits_2_with_the_closest_and_the_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--explain", "knee_search.resolutoin"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no key 'knee_search.resolutoin'; closest: knee_search.resolution" in captured.err
    assert "docs/campaign.md and docs/inventory.md" in captured.err


def test_plan_without_explain_still_needs_an_inventory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 2
    assert "give an inventory" in capsys.readouterr().err
