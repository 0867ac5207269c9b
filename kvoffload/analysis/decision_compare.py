"""The decision tables of several campaigns side by side (`compare --decision`; issue 42).

Each campaign's decision (kvoffload/analysis/decision.py `csv_rows`: one row per model, ISL/OSL,
num_rounds and tier) is matched across campaigns on MATCH; a match compares only where the campaigns
asked the same question of the same data: the same model, dataset (by its digest, campaign.json
`dataset.digest`), num_rounds, ISL, OSL and latency target. Hardware, and prices, may differ: that is
what the comparison is for. A match that breaks a rule is kept, marked not comparable with its
reasons. Costs compare only in one currency and only real against real (or example against example):
`price_conflicts` says why a set of campaigns fails that, and the CLI refuses such a set whole (issue
53), since every cost of it would mislead. Pure: DataFrames and mappings in, a DataFrame or reasons
out; no IO, no printing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

MATCH = ["model", "num_rounds", "isl", "osl", "tier"]
# What a campaign's decision row shows in the side-by-side table (decision.CSV_COLUMNS)
SHOWN = (
    "sessions_bound",
    "sessions",
    "cost_per_million_tokens",
    "cost_bound",
    "currency",
    "example_prices",
    "goodput_tokens_per_s_per_gpu",
    "verdict",
)


@dataclass(frozen=True)
class CampaignDecision:
    """One campaign's decision rows and what the validity rules need of its campaign.json."""

    label: str
    rows: pd.DataFrame  # decision.csv_rows (its `target`: the slo as text)
    dataset_digest: str | None


def _price_lists(c: CampaignDecision) -> list[tuple[str, bool]]:
    """The (currency, example) pairs of `c`'s priced rows, first seen first. A row without a currency is
    of a sweep without prices (decision.py records None) and counts for nothing."""
    out: list[tuple[str, bool]] = []
    for row in c.rows.to_dict("records"):
        currency = row.get("currency")
        if currency is None or pd.isna(currency):
            continue
        pair = (str(currency), bool(row.get("example_prices", False)))
        if pair not in out:
            out.append(pair)
    return out


def price_conflicts(campaigns: Sequence[CampaignDecision]) -> list[str]:
    """Why the campaigns' costs cannot be set side by side (empty: they can): the priced ones use more
    than one currency, or some price with examples (`example_prices`) and others with real prices. A
    campaign without prices does not count. Each reason names every priced campaign with what it uses."""
    priced = [(c.label, lists) for c in campaigns if (lists := _price_lists(c))]
    out = []
    if len({currency for _, lists in priced for currency, _ in lists}) > 1:
        shown = " / ".join(
            f"{label}: {', '.join(dict.fromkeys(cur for cur, _ in lists))}" for label, lists in priced
        )
        out.append(f"their prices are in different currencies ({shown})")
    if len({example for _, lists in priced for _, example in lists}) > 1:
        kinds = {True: "example prices", False: "real prices"}
        shown = " / ".join(
            f"{label}: {', '.join(dict.fromkeys(kinds[ex] for _, ex in lists))}" for label, lists in priced
        )
        out.append(f"some campaigns' prices are examples and others' are real ({shown})")
    return out


def _reasons(present: Sequence[CampaignDecision], rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why the campaigns that have this match cannot be compared on it (empty: they can)."""
    out = []
    digests = {c.dataset_digest for c in present}
    if None in digests:
        out.append("a campaign recorded no dataset digest (campaign.json from before 2026-12-05)")
    elif len(digests) > 1:
        out.append("the campaigns replayed different datasets (digests differ)")
    targets = {str(rows[c.label].get("target")) for c in present}
    if len(targets) > 1:
        shown = " / ".join(f"{c.label}: {rows[c.label].get('target')}" for c in present)
        out.append(f"the latency targets differ ({shown})")
    return out


def side_by_side(campaigns: Sequence[CampaignDecision]) -> pd.DataFrame:
    """One row per match (MATCH) with, per campaign, its SHOWN figures as `<figure>@<label>`, then
    `campaigns` (how many have it), `comparable` and `not_comparable_reasons`. A match found in only
    some campaigns is not comparable."""
    keyed: dict[tuple[Any, ...], dict[str, Mapping[str, Any]]] = {}
    for c in campaigns:
        for raw in c.rows.to_dict("records"):
            row = {str(k): v for k, v in raw.items()}
            keyed.setdefault(tuple(row[k] for k in MATCH), {})[c.label] = row
    out = []
    for key, by_label in sorted(keyed.items(), key=lambda kv: tuple(str(v) for v in kv[0])):
        record: dict[str, Any] = dict(zip(MATCH, key, strict=True))
        present = [c for c in campaigns if c.label in by_label]
        for c in campaigns:
            shown = by_label.get(c.label, {})
            for figure in SHOWN:
                record[f"{figure}@{c.label}"] = shown.get(figure)
        reasons = _reasons(present, by_label)
        if len(present) < len(campaigns):
            missing = ", ".join(c.label for c in campaigns if c.label not in by_label)
            reasons.append(f"not in {missing}")
        record["campaigns"] = len(present)
        record["comparable"] = not reasons
        record["not_comparable_reasons"] = "; ".join(reasons)
        out.append(record)
    columns = [*MATCH, *(f"{f}@{c.label}" for c in campaigns for f in SHOWN)]
    return pd.DataFrame(out, columns=[*columns, "campaigns", "comparable", "not_comparable_reasons"])
