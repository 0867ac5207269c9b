"""The campaign option `knee_search`: after the campaign's own cells, ramp concurrency per tier.

For each tier (and num_rounds, isl, osl of the campaign; first repeat), the cells measured so far are
read back through the report's own analysis (later-round p95 TTFT, later-round hit rate), and
`kvoffload.analysis.ramp.next_step` says which concurrency to run next: geometric growth until a point
crosses a limit, then bisection, until the knee is bracketed, or the maximum is reached without a
breach. The maximum is the smaller of `knee_search.max_concurrency` and the load the campaign can
produce: concurrency beyond the virtual users a cell replays (`max_sessions`, the dataset's users at
this num_rounds less those the isl filter drops: sessions.json `virtual_users_available` less
`dropped_by_isl`) adds no load, so those steps would measure noise. The cap binds growth and bisection
alike: a campaign cell beyond it that breaches makes the ramp try the ceiling itself, and a ceiling
that keeps the limits ends the ramp "not_reached", censored at the ceiling ("no knee within what the
dataset can produce: at least N concurrent sessions"), never a bracket above it. A step that failed,
had failed requests or was marked invalid (faults) stops the ramp with its reason: its figures are no
point of the curve.

A ramp stays on one node: the node that ran its seed's campaign cells (the largest concurrency of
them when a sweep was spread over nodes). It judges only the points measured there, so a bracket
never compares two machines, unless the nodes are alike (the same host facts, analysis/nodes.py, as
the decision table pools them): then a level another node measured counts and is not measured again.
The steps are ordinary cells (their own folders, DONE, resume), run one after the other on that node,
with the engines reset between them; a step runs as many repeats as the campaign's cells. What each
ramp decided goes to campaign.json `knee_search` and to the report.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from kvoffload.analysis import steady
from kvoffload.analysis.capacity import replayable_users
from kvoffload.analysis.nodes import node_differences
from kvoffload.analysis.ramp import RampDecision, RampPoint, RampPolicy, next_step
from kvoffload.config import Cell
from kvoffload.config.campaign import Campaign, KneeSearch
from kvoffload.config.cells import make_cell
from kvoffload.config.slo import MIN_WINDOW_REQUESTS

# Summary columns the ramp judges: each cell's figures over its steady window (kvoffload/analysis/
# steady.py), the requests the decision table judges too.
P95 = "steady_ttft_later_p95_s"
P50 = "steady_ttft_later_p50_s"
TPOT = "steady_tpot_later_p95_s"
HIT = "steady_later_cached_share"
NOT_HELD = "steady_not_held"


def policy(spec: KneeSearch, campaign: Campaign) -> RampPolicy:
    """The ramp's rule: the knee search's steps, judged by the campaign's slo (its p95 TTFT, hit-rate
    floor, p50 TTFT and p95 TPOT limits), else by knee_search's own older limits (`knee_limits`)."""
    p95, hit_rate = campaign.knee_limits()
    slo = campaign.slo
    return RampPolicy(
        start=min(campaign.concurrency),
        max_concurrency=spec.max_concurrency,
        factor=spec.factor,
        slo_p95_s=p95,
        min_hit_rate=hit_rate,
        resolution=spec.resolution,
        slo_p50_s=slo.ttft_p50_s if slo is not None else None,
        tpot_p95_s=slo.tpot_p95_s if slo is not None else None,
    )


def ramps(cells: tuple[Cell, ...]) -> list[Cell]:
    """One seed cell per ramp: the first repeat of each (tier, num_rounds, isl, osl)."""
    seen: dict[tuple[Any, ...], Cell] = {}
    for cell in cells:
        key = (cell.tier, cell.num_rounds, cell.isl, str(cell.osl))
        if cell.repeat == 1 and key not in seen:
            seen[key] = cell
    return list(seen.values())


def _sweep(summary: pd.DataFrame, seed: Cell, node: str | None = None) -> pd.DataFrame:
    """Rows of the seed's ramp (any status), on `node` when one is given."""
    if summary.empty:
        return summary
    keep = (
        (summary["tier"] == seed.tier)
        & (summary["num_rounds"] == seed.num_rounds)
        & (summary["isl"] == seed.isl)
        & (summary["osl"].astype(str) == str(seed.osl))
        & (summary["repeat"] == 1)
    )
    if node is not None and "node" in summary:
        keep &= summary["node"].astype(str) == node
    return summary[keep]


def ramp_node(summary: pd.DataFrame, seed: Cell, default: str) -> str:
    """The node a ramp runs on: the one that ran the seed's largest done concurrency, else `default`."""
    rows = _sweep(summary, seed)
    if rows.empty or "node" not in rows:
        return default
    rows = rows[(rows["status"] == "done") & rows["node"].notna()]
    if rows.empty:
        return default
    return str(rows.sort_values("concurrency").iloc[-1]["node"])


def _number(row: pd.Series, column: str) -> float | None:
    value: Any = row.get(column)
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if pd.isna(f) else f


def trouble(
    summary: pd.DataFrame, seed: Cell, concurrencies: set[int], node: str | None = None
) -> str | None:
    """Why a measured step of the ramp cannot be judged: a cell that did not end done, had failed
    requests, or was marked invalid (faults). None when every step at `concurrencies` is sound."""
    rows = _sweep(summary, seed, node)
    if rows.empty:
        return None
    for _, row in rows.sort_values("concurrency").iterrows():
        c = int(row["concurrency"])
        if c not in concurrencies:
            continue
        where = f"concurrency {c} (cell {row.get('cell_id', '?')})"
        if row.get("status") != "done":
            return f"{where} ended {row.get('status')}: the ramp stops, its figures are no point of the curve"
        failed = _number(row, "failed_requests")
        if failed:
            return (
                f"{where} had {failed:.0f} failed request(s): the ramp stops, its figures are no clean load"
            )
        if row.get("valid") is False or str(row.get("valid")).lower() == "false":
            why = row.get("invalid_reasons")
            why = f" ({why})" if isinstance(why, str) and why else ""
            return f"{where} is invalid{why}: the ramp stops, its figures are not a clean load"
    return None


def load_ceiling(summary: pd.DataFrame, seed: Cell, campaign: Campaign) -> tuple[int | None, str]:
    """The most concurrent sessions the campaign can hold on this ramp, and where that comes from: half
    the users a cell replays (`max_sessions`, and the virtual users the ramp's cells could replay:
    sessions.json `virtual_users_available`, the dataset's users at this num_rounds, less
    `dropped_by_isl`), since a closed loop holds a level for a session only while a user waits to
    replace each one that finishes (analysis/steady.py; `held_level`). None when neither is known."""
    bounds: list[tuple[int, str]] = []
    if campaign.max_sessions is not None:
        bounds.append((campaign.max_sessions, f"max_sessions {campaign.max_sessions}"))
    rows = _sweep(summary, seed)
    if not rows.empty and "virtual_users_available" in rows:
        users = replayable_users(rows).dropna()
        if len(users):
            n = int(users.min())
            bounds.append(
                (
                    n,
                    f"the {n} virtual users a cell replays at num_rounds={seed.num_rounds} after the isl "
                    "filter",
                )
            )
    if not bounds:
        return None, ""
    n = min(b for b, _ in bounds)
    held = held_level(n)
    return held, (
        f"{'; '.join(why for _, why in bounds)}: a closed loop holds at most {held} of {n} users at once for "
        "a session"
    )


def held_level(users: int) -> int:
    """The highest level `users` virtual users hold in a closed loop for at least one session: each slot
    needs a waiting user to replace the one that finishes (docs/metrics.md "Steady window")."""
    return max(1, users // 2)


def points(
    summary: pd.DataFrame, seed: Cell, node: str | None = None, min_requests: int = MIN_WINDOW_REQUESTS
) -> list[RampPoint]:
    """The measured concurrencies of the seed's ramp (done cells only; on `node` when given), each with
    why its steady window did not hold its level (`min_requests`: the later-round requests a window
    needs, the campaign slo's `min_window_requests`)."""
    rows = _sweep(summary, seed, node)
    if rows.empty:
        return []
    rows = rows[rows["status"] == "done"]

    def figure(row: pd.Series, column: str) -> float | None:
        value = row.get(column)
        return None if value is None or pd.isna(value) else float(value)

    def not_held(row: pd.Series) -> str | None:
        figures = [
            figure(row, k) for k in ("steady_level", "steady_s", "steady_held_sessions", "steady_session_s")
        ]
        later = figure(row, "steady_later_requests")
        if all(f is not None for f in figures) and later is not None:
            level, seconds, held, session = (float(f) for f in figures if f is not None)
            return steady.not_held(int(level), seconds, held, session, int(later), min_requests)
        why = row.get(NOT_HELD)
        if isinstance(why, str) and why:
            return why
        return None if row.get("steady_held") is True else "no steady window was measured"

    return [
        RampPoint(
            int(row["concurrency"]),
            figure(row, P95),
            figure(row, HIT),
            figure(row, P50),
            figure(row, TPOT),
            not_held(row),
        )
        for _, row in rows.iterrows()
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
    node: str | None = None
    at_least: int | None = None  # "not_reached": the knee, if any, lies above this concurrency

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
            self.at_least = decision.at_least

    def to_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "num_rounds": self.num_rounds,
            "isl": self.isl,
            "osl": self.osl,
            "node": self.node,
            "outcome": self.outcome,
            "bracket": list(self.bracket) if self.bracket else None,
            "at_least": self.at_least,
            "steps": self.steps,
        }


def nodes_alike(facts: Mapping[str, Mapping[str, Any]], nodes: Sequence[str]) -> bool:
    """Whether the nodes' host facts (runner.host_facts) agree on every compared fact (analysis/nodes.py
    COMPARED_FACTS), so one curve may pool their levels. Nodes without facts are not shown alike."""
    if len(nodes) < 2:
        return True
    if any(n not in facts for n in nodes):
        return False
    cells = pd.DataFrame({"node": list(nodes), "hosts": [json.dumps(dict(facts), default=str)] * len(nodes)})
    return not node_differences(cells)


def walk(
    campaign: Campaign,
    seed: Cell,
    summary: Callable[[], pd.DataFrame],
    log: RampLog,
    max_steps: int = 64,
    node: str | None = None,
    pooled: bool = False,
) -> Iterator[Cell]:
    """The ramp's cells, one at a time: each is yielded to be run (or found DONE), then the measured
    points are read again for the next decision. Stops at a decision other than "try", at a step that
    failed or is invalid, and at the load the campaign can produce. With `node`, only the points
    measured on that node count, unless `pooled` (the nodes are alike: `nodes_alike`), when every
    node's points count and the ramp runs its new steps on `node`."""
    judged_on = None if pooled else node
    spec = campaign.knee_spec()
    assert spec is not None
    rule = policy(spec, campaign)
    tried: set[int] = set()
    known = set(campaign.concurrency)
    for _ in range(max_steps):
        table = summary()
        # Only the campaign's own points and this walk's: a resumed run then takes the same steps
        # (finding their cells DONE) and logs the whole ramp again.
        why_not = trouble(table, seed, known | tried, judged_on)
        if why_not is not None:
            log.add(RampDecision("blocked", None, None, why_not), None)
            return
        decision = _decide(table, seed, campaign, rule, known | tried, judged_on)
        if decision.action != "try" or decision.next_concurrency is None:
            log.add(decision, None)
            return
        if decision.next_concurrency in tried:
            # the cell ran but left no figure the ramp can judge (failed, or its figures are missing)
            log.add(RampDecision("blocked", None, None, f"concurrency {decision.next_concurrency} "
                                 "was run but gave no figures to judge"), None)  # fmt: skip
            return
        why = _measured_elsewhere(table, seed, decision.next_concurrency, judged_on)
        if why is not None:
            log.add(RampDecision("blocked", None, None, why), None)
            return
        tried.add(decision.next_concurrency)
        cell = make_cell(campaign, seed.tier, decision.next_concurrency, seed.num_rounds, seed.isl,
                         seed.osl, 1)  # fmt: skip
        log.add(decision, cell)
        yield cell
        # the decision pools a level's repeats: a step runs as many as the campaign's cells (the walk
        # judges the first, as it judges the campaign's own)
        for repeat in range(2, campaign.repeats + 1):
            yield make_cell(campaign, seed.tier, decision.next_concurrency, seed.num_rounds, seed.isl,
                            seed.osl, repeat)  # fmt: skip
    log.add(RampDecision("blocked", None, None, f"stopped after {max_steps} steps"), None)


def _decide(
    table: pd.DataFrame, seed: Cell, campaign: Campaign, rule: RampPolicy, allowed: set[int], node: str | None
) -> RampDecision:
    """The ramp's next decision on the points measured so far (`allowed` concurrencies), its top
    lowered to the load the campaign can produce."""
    spec = campaign.knee_spec()
    assert spec is not None
    ceiling, source = load_ceiling(table, seed, campaign)
    capped = ceiling is not None and ceiling < rule.max_concurrency
    step_rule = rule
    if ceiling is not None and capped:
        top = max(1, ceiling)
        step_rule = replace(rule, max_concurrency=top, start=min(rule.start, top))
    need = campaign.slo.min_window_requests if campaign.slo is not None else MIN_WINDOW_REQUESTS
    seen = [p for p in points(table, seed, node, need) if p.concurrency in allowed]
    decision = next_step(seen, step_rule)
    if not capped:
        return decision
    load = f"the campaign produces no more load than {ceiling} concurrent sessions ({source})"
    if decision.action == "not_reached":
        decision = replace(
            decision,
            reason=f"{decision.reason}; {load}, so knee_search.max_concurrency {spec.max_concurrency} is "
            f"out of reach: no knee within what the dataset can produce, the knee is at least {ceiling} "
            "concurrent sessions",
        )
    elif decision.action == "try" and decision.next_concurrency == ceiling:
        decision = replace(decision, reason=f"{decision.reason}; {load}")
    return decision


def _measured_elsewhere(table: pd.DataFrame, seed: Cell, concurrency: int, node: str | None) -> str | None:
    """Why the ramp on `node` cannot take `concurrency`: another node measured it (None: it can)."""
    elsewhere = _sweep(table, seed)
    if node is None or "node" not in elsewhere or elsewhere.empty:
        return None
    other = elsewhere[(elsewhere["concurrency"] == concurrency) & (elsewhere["node"].astype(str) != node)]
    if other.empty:
        return None
    return (
        f"concurrency {concurrency} was measured on node {other['node'].iloc[0]}, "
        f"not on {node}, where this ramp runs: a bracket across two nodes does not compare"
    )


def campaign_summary(root: Path) -> pd.DataFrame:
    """The per-cell summary of the campaign folder so far (ingest, then the report's summary)."""
    from kvoffload.analysis.summary import summarize
    from kvoffload.ingest import ensure_tables

    t = ensure_tables(root)
    return summarize(t.cells, t.requests, t.sessions, t.samples)
