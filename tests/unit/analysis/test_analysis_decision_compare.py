"""`compare --decision`: decision tables of campaigns side by side, with the validity rules (issue 42)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvoffload.analysis.decision_compare import CampaignDecision, side_by_side


def _rows(*tiers: tuple[str, float, str], target: str = "p95 TTFT <= 0.5 s") -> pd.DataFrame:
    out: list[dict[str, Any]] = []
    for tier, sessions, bound in tiers:
        out.append({"model": "m", "num_rounds": 5, "isl": 12000, "osl": "32", "tier": tier, "target": target,
                    "sessions": sessions, "sessions_bound": bound, "cost_per_million_tokens": 0.02,
                    "cost_bound": "=", "goodput_tokens_per_s_per_gpu": 1e4, "verdict": "base"})  # fmt: skip
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
