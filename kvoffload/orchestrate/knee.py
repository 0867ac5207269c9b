"""The campaign option `knee_search`: after the campaign's own cells, ramp concurrency per tier.

For each tier (and num_rounds, isl, osl of the campaign; first repeat), the cells measured so far are
read back through the report's own analysis (later-round p95 TTFT, later-round hit rate), and
`kvoffload.analysis.ramp.next_step` says which concurrency to run next: geometric growth until a point
crosses a limit, then bisection, until the knee is bracketed, or the maximum is reached without a
breach. The steps are ordinary cells (their own folders, DONE, resume), run on the first node one
after the other, with the engines reset between them. What each ramp decided goes to campaign.json
`knee_search` and to the report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvoffload.analysis.ramp import RampDecision, RampPoint, RampPolicy, next_step
from kvoffload.config import Cell
from kvoffload.config.campaign import Campaign, KneeSearch
from kvoffload.config.cells import make_cell

# Summary columns the ramp judges (kvoffload/analysis: client.py and engine.py).
P95 = "ttft_later_p95_s"
HIT = "later_round_cached_share"


def policy(spec: KneeSearch, campaign: Campaign) -> RampPolicy:
    return RampPolicy(
        start=min(campaign.concurrency),
        max_concurrency=spec.max_concurrency,
        factor=spec.factor,
        slo_p95_s=spec.slo_p95_ttft_s,
        min_hit_rate=spec.min_later_hit_rate,
        resolution=spec.resolution,
    )


def ramps(cells: tuple[Cell, ...]) -> list[Cell]:
    """One seed cell per ramp: the first repeat of each (tier, num_rounds, isl, osl)."""
    seen: dict[tuple[Any, ...], Cell] = {}
    for cell in cells:
        key = (cell.tier, cell.num_rounds, cell.isl, str(cell.osl))
        if cell.repeat == 1 and key not in seen:
            seen[key] = cell
    return list(seen.values())


def points(summary: pd.DataFrame, seed: Cell) -> list[RampPoint]:
    """The measured concurrencies of the seed's ramp (done cells only)."""
    if summary.empty:
        return []
    rows = summary[
        (summary["tier"] == seed.tier)
        & (summary["num_rounds"] == seed.num_rounds)
        & (summary["isl"] == seed.isl)
        & (summary["osl"].astype(str) == str(seed.osl))
        & (summary["repeat"] == 1)
        & (summary["status"] == "done")
    ]

    def figure(row: pd.Series, column: str) -> float | None:
        value = row.get(column)
        return None if value is None or pd.isna(value) else float(value)

    return [
        RampPoint(int(row["concurrency"]), figure(row, P95), figure(row, HIT)) for _, row in rows.iterrows()
    ]


@dataclass
class RampLog:
    """What one ramp decided, step by step, for campaign.json and the report."""

    tier: str
    num_rounds: int
    isl: int
    osl: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = "running"
    bracket: tuple[int, int] | None = None

    def add(self, decision: RampDecision, cell: Cell | None) -> None:
        self.steps.append(
            {
                "action": decision.action,
                "concurrency": decision.next_concurrency,
                "cell_id": cell.id if cell is not None else None,
                "reason": decision.reason,
            }
        )
        if decision.action != "try":
            self.outcome = decision.action
            self.bracket = decision.bracket

    def to_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "num_rounds": self.num_rounds,
            "isl": self.isl,
            "osl": self.osl,
            "outcome": self.outcome,
            "bracket": list(self.bracket) if self.bracket else None,
            "steps": self.steps,
        }


def walk(
    campaign: Campaign, seed: Cell, summary: Callable[[], pd.DataFrame], log: RampLog, max_steps: int = 64
) -> Iterator[Cell]:
    """The ramp's cells, one at a time: each is yielded to be run (or found DONE), then the measured
    points are read again for the next decision. Stops at a decision other than "try"."""
    spec = campaign.knee_search
    assert spec is not None
    rule = policy(spec, campaign)
    tried: set[int] = set()
    known = set(campaign.concurrency)
    for _ in range(max_steps):
        # Only the campaign's own points and this walk's: a resumed run then takes the same steps
        # (finding their cells DONE) and logs the whole ramp again.
        seen = [p for p in points(summary(), seed) if p.concurrency in known | tried]
        decision = next_step(seen, rule)
        if decision.action != "try" or decision.next_concurrency is None:
            log.add(decision, None)
            return
        if decision.next_concurrency in tried:
            # the cell ran but left no figure the ramp can judge (failed, or its figures are missing)
            log.add(RampDecision("blocked", None, None, f"concurrency {decision.next_concurrency} "
                                 "was run but gave no figures to judge"), None)  # fmt: skip
            return
        tried.add(decision.next_concurrency)
        cell = make_cell(campaign, seed.tier, decision.next_concurrency, seed.num_rounds, seed.isl,
                         seed.osl, 1)  # fmt: skip
        log.add(decision, cell)
        yield cell
    log.add(RampDecision("blocked", None, None, f"stopped after {max_steps} steps"), None)


def campaign_summary(root: Path) -> pd.DataFrame:
    """The per-cell summary of the campaign folder so far (ingest, then the report's summary)."""
    from kvoffload.analysis.summary import summarize
    from kvoffload.ingest import ensure_tables

    t = ensure_tables(root)
    return summarize(t.cells, t.requests, t.sessions, t.samples)
