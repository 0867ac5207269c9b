"""`compare --decision` and the campaigns' prices (issue 53): each cost shown with its currency, and a
set of campaigns priced in different currencies, or with example beside real prices, refused.

Two copies of the hand-made fixture campaign (tests/fixtures/campaign-small) with the same slo and
dataset digest, so that every match compares and only the prices differ; each test writes the prices it
needs into their campaign.json, which the report reads afresh on every call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvoffload.cli.main import main
from tests.support.small_campaign import copy_small


@pytest.fixture(scope="module")
def labs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """lab-a and lab-b: the fixture twice (ingested once for the module's tests)."""
    root = tmp_path_factory.mktemp("labs")
    return copy_small(root / "lab-a"), copy_small(root / "lab-b")


def _price(lab: Path, prices: dict[str, Any] | None) -> str:
    """Give `lab` the slo `ttft_p95_s: 0.15`, a dataset digest and `prices` (None: no prices)."""
    path = lab / "campaign.json"
    doc = json.loads(path.read_text())
    doc["campaign"] = {"slo": {"ttft_p95_s": 0.15, "min_window_requests": 8}, "prices": prices}
    doc["dataset"] = {"code": "generic", "digest": "sha256:0"}
    path.write_text(json.dumps(doc))
    return str(lab)


def test_usd_beside_jpy_is_refused_before_any_table(
    labs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a = _price(labs[0], {"node_hour": 10.0})
    b = _price(labs[1], {"node_hour": 1500.0, "currency": "JPY"})
    for fmt in ("table", "json"):
        assert main(["compare", "--decision", "--format", fmt, a, b]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith(
            "kvoffload-lab: error: compare --decision: the campaigns' costs cannot be compared: their "
            "prices are in different currencies (lab-a: USD / lab-b: JPY). Fix: give every campaign one "
            "price list in one currency"
        )
        assert "`kvoffload_prices`" in err and f"{labs[1] / 'campaign.json'}" in err
        assert err.count("\n") == 1  # one line, as every UserError


def test_example_prices_beside_real_ones_are_refused(
    labs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a = _price(labs[0], {"node_hour": 10.0})
    b = _price(labs[1], {"node_hour": 10.0, "example": True})
    assert main(["compare", "--decision", a, b]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        "cannot be compared: some campaigns' prices are examples and others' are real "
        "(lab-a: real prices / lab-b: example prices). Fix:"
    ) in err


def test_one_currency_compares_with_each_cost_in_its_currency(
    labs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """node_hour 10 and 12 USD: the same goodput, so lab-b's cost per 1M tokens is 1.2 x lab-a's (the
    fixture's cpu tier at its highest held level, 2 sessions: at most 10 / (18.56 tokens/s x 3600) x
    10^6 = 149.7, and 179.6)."""
    a = _price(labs[0], {"node_hour": 10.0})
    b = _price(labs[1], {"node_hour": 12.0})
    assert main(["compare", "--decision", "--format", "json", a, b]) == 0
    cpu = next(r for r in json.loads(capsys.readouterr().out) if r["tier"] == "cpu")
    assert cpu["currency@lab-a"] == cpu["currency@lab-b"] == "USD"
    assert cpu["example_prices@lab-a"] is False and cpu["comparable"] is True
    assert cpu["cost_per_million_tokens@lab-b"] == pytest.approx(1.2 * cpu["cost_per_million_tokens@lab-a"])
    assert cpu["cost_per_million_tokens@lab-a"] == pytest.approx(149.7, abs=0.05)
    assert main(["compare", "--decision", a, b]) == 0
    table = capsys.readouterr().out
    assert ">= 2 sessions, <= 150 USD/1M" in table and ">= 2 sessions, <= 180 USD/1M" in table


def test_a_campaign_without_prices_beside_a_priced_one_compares(
    labs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a = _price(labs[0], {"node_hour": 15.0, "currency": "JPY", "example": True})
    b = _price(labs[1], None)
    assert main(["compare", "--decision", "--format", "json", a, b]) == 0
    cpu = next(r for r in json.loads(capsys.readouterr().out) if r["tier"] == "cpu")
    assert cpu["currency@lab-a"] == "JPY" and cpu["example_prices@lab-a"] is True
    assert cpu["currency@lab-b"] is None and cpu["cost_per_million_tokens@lab-b"] is None
    assert main(["compare", "--decision", a, b]) == 0
    table = capsys.readouterr().out
    assert ">= 2 sessions, <= 224 JPY/1M (example prices); more sessions" in table  # 15 / 10 x 149.7
    assert ">= 2 sessions; more sessions than gpu" in table  # lab-b: no cost, so no currency
