"""`compare --decision`: decision tables of campaigns side by side, with the validity rules (issue 42)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvoffload.analysis.decision_compare import CampaignDecision, price_conflicts, side_by_side


def _rows(
    *tiers: tuple[str, float, str],
    target: str = "p95 TTFT <= 0.5 s",
    currency: str | None = "USD",
    example: bool = False,
) -> pd.DataFrame:
    """Decision rows (decision.csv_rows) of one sweep; `currency=None`: a campaign without prices, as
    decision.py writes it (no cost, no currency, example_prices false)."""
    cost = None if currency is None else 0.02
    out: list[dict[str, Any]] = []
    for tier, sessions, bound in tiers:
        out.append({"model": "m", "num_rounds": 5, "isl": 12000, "osl": "32", "tier": tier, "target": target,
                    "sessions": sessions, "sessions_bound": bound, "cost_per_million_tokens": cost,
                    "cost_bound": None if cost is None else "=", "currency": currency,
                    "example_prices": example, "goodput_tokens_per_s_per_gpu": 1e4,
                    "verdict": "base"})  # fmt: skip
    return pd.DataFrame(out)


def test_two_labs_side_by_side_on_the_same_data_and_target() -> None:
    h100 = CampaignDecision("h100", _rows(("gpu", 20.4, "="), ("cpu", 32.0, ">=")), "sha256:a")
    h200 = CampaignDecision("h200", _rows(("gpu", 31.0, "="), ("cpu", 64.0, ">=")), "sha256:a")
    table = side_by_side([h100, h200]).set_index("tier")
    assert table.loc["gpu", "sessions@h100"] == 20.4 and table.loc["gpu", "sessions@h200"] == 31.0
    assert table.loc["cpu", "sessions_bound@h200"] == ">="
    assert table["comparable"].tolist() == [True, True] and set(table["campaigns"]) == {2}


def test_another_dataset_target_or_a_missing_tier_is_not_comparable() -> None:
    base = CampaignDecision("a", _rows(("gpu", 20.0, "="), ("nvme", 32.0, ">=")), "sha256:a")
    other_data = CampaignDecision("b", _rows(("gpu", 20.0, "=")), "sha256:b")
    table = side_by_side([base, other_data]).set_index("tier")
    assert not table.loc["gpu", "comparable"]
    assert (
        table.loc["gpu", "not_comparable_reasons"]
        == "the campaigns replayed different datasets (digests differ)"
    )
    assert table.loc["nvme", "not_comparable_reasons"] == "not in b" and table.loc["nvme", "campaigns"] == 1
    tighter = CampaignDecision("c", _rows(("gpu", 12.0, "="), target="p95 TTFT <= 0.2 s"), "sha256:a")
    reasons = side_by_side([base, tighter]).set_index("tier").loc["gpu", "not_comparable_reasons"]
    assert reasons == "the latency targets differ (a: p95 TTFT <= 0.5 s / c: p95 TTFT <= 0.2 s)"
    old = CampaignDecision("d", _rows(("gpu", 20.0, "=")), None)
    reasons = side_by_side([base, old]).set_index("tier").loc["gpu", "not_comparable_reasons"]
    assert reasons.startswith("a campaign recorded no dataset digest")


def test_usd_beside_jpy_is_refused_naming_each_campaigns_currency() -> None:
    """Issue 53: 0.02 USD and 0.02 JPY per 1M tokens are not the same cost; a campaign without prices
    (b) is not named, as it has no currency to clash."""
    usd = CampaignDecision("a", _rows(("gpu", 20.0, "=")), "sha256:a")
    unpriced = CampaignDecision("b", _rows(("gpu", 20.0, "="), currency=None), "sha256:a")
    jpy = CampaignDecision("c", _rows(("gpu", 20.0, "="), currency="JPY"), "sha256:a")
    assert price_conflicts([usd, unpriced, jpy]) == [
        "their prices are in different currencies (a: USD / c: JPY)"
    ]


def test_example_prices_beside_real_ones_are_refused() -> None:
    real = CampaignDecision("lab", _rows(("gpu", 20.0, "=")), "sha256:a")
    example = CampaignDecision("demo", _rows(("gpu", 20.0, "="), example=True), "sha256:a")
    assert price_conflicts([real, example]) == [
        "some campaigns' prices are examples and others' are real (lab: real prices / demo: example prices)"
    ]
    yen_example = CampaignDecision("jp", _rows(("gpu", 20.0, "="), currency="JPY", example=True), "sha256:a")
    assert price_conflicts([real, yen_example]) == [
        "their prices are in different currencies (lab: USD / jp: JPY)",
        "some campaigns' prices are examples and others' are real (lab: real prices / jp: example prices)",
    ]


def test_one_currency_compares_and_each_cost_shows_its_currency() -> None:
    a = CampaignDecision("a", _rows(("gpu", 20.0, "="), ("cpu", 30.0, "=")), "sha256:a")
    b = CampaignDecision("b", _rows(("gpu", 25.0, "="), ("cpu", 31.0, "=")), "sha256:a")
    assert price_conflicts([a, b]) == []
    both_examples = CampaignDecision("e", _rows(("gpu", 20.0, "="), example=True), "sha256:a")
    assert (
        price_conflicts([both_examples, CampaignDecision("f", _rows(("gpu", 1.0, "="), example=True), None)])
        == []
    )
    table = side_by_side([a, b]).set_index("tier")
    assert table.loc["gpu", "currency@a"] == table.loc["gpu", "currency@b"] == "USD"
    assert table.loc["cpu", "cost_per_million_tokens@b"] == 0.02
    assert not table.loc["cpu", "example_prices@a"] and table["comparable"].tolist() == [True, True]


def test_a_campaign_without_prices_beside_a_priced_one_compares() -> None:
    priced = CampaignDecision("priced", _rows(("gpu", 20.0, "="), currency="JPY"), "sha256:a")
    unpriced = CampaignDecision("bare", _rows(("gpu", 22.0, "="), currency=None), "sha256:a")
    assert price_conflicts([priced, unpriced]) == []
    row = side_by_side([priced, unpriced]).set_index("tier").loc["gpu"]
    assert row["currency@priced"] == "JPY" and row["currency@bare"] is None
    assert row["cost_per_million_tokens@bare"] is None and bool(row["comparable"])
