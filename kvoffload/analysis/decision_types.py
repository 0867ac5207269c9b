"""The decision's frozen results: one tier of a sweep, and a sweep's table.

Types only (no arithmetic, no IO): kvoffload/analysis/decision.py builds them,
kvoffload/analysis/decision_words.py writes their sentences, kvoffload/report/decision_view.py renders
them. docs/metrics.md "Decision" defines every field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kvoffload.analysis.costing import Cost, Goodput, Resources
from kvoffload.analysis.crossing import Bound, Level, Status


@dataclass(frozen=True)
class TierDecision:
    """One tier of one sweep: sessions at the target, goodput and cost at the crossing, the verdict."""

    model: str
    num_rounds: int
    isl: int
    osl: str
    tier: str
    status: Status
    # crossing: the interpolated estimate; at_least / fewer_than: the bound (see `sessions_bound`)
    sessions: float | None
    sessions_bound: Literal["=", ">=", "<"] | None
    sessions_ci: list[float] | None
    # per end of the interval: True when it is a bound (the replicates reach beyond the bracket there)
    sessions_ci_censored: list[bool] | None
    interval_note: str | None
    last_meeting: int | None
    first_missing: int | None
    binding_limit: str | None
    ceiling: int | None
    non_monotone: list[int]
    levels: list[Level]
    goodput: Goodput | None
    resources: Resources
    cost: Cost
    history_tokens: float | None
    history_sessions: float | None
    # the runs (repeats) behind the decisive levels: the fewer of the two bracket levels' held cells
    runs: int = 0
    # at_least: what capped the bound (the users, max_sessions, the levels asked)
    capped_by: str | None = None
    # levels below the first miss that could not be judged (a figure unknown, or the load not held)
    unjudged: list[int] = field(default_factory=list)
    ratio_vs_gpu: float | None = None
    ratio_bound: Bound | None = None
    ratio_ci: list[float | None] | None = None
    # True: surely more sessions than gpu at the target (the ratio's interval or bound lies above 1);
    # False: surely fewer; None: the data cannot tell
    more_than_gpu: bool | None = None
    extra_sessions_vs_gpu: float | None = None
    dram_gb_per_extra_session: float | None = None
    nvme_gb_per_extra_session: float | None = None
    extra_bound: Bound | None = None
    # the change of cost per million tokens against gpu (%), its 95 % interval and its bound
    cost_change_pct: float | None = None
    cost_change_ci_pct: list[float] | None = None
    cost_change_bound: Bound | None = None
    # cells whose offload failed for lack of room (L2 loads refused for want of L1 space)
    offload_short_of_room: list[str] = field(default_factory=list)
    verdict: str = ""
    sessions_text: str = ""
    excluded: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SweepDecision:
    """The decision table of one sweep (model, num_rounds, ISL, OSL) and its sentences."""

    model: str
    num_rounds: int
    isl: int
    osl: str
    target: str
    tiers: list[TierDecision]
    statements: list[str]
    conditions: list[str]
    pick: str | None
    missing_prices: list[str]
    currency: str | None
    example_prices: bool
    # why there is no pick (None: there is one); the headline says it
    no_pick: str | None = None
    # the fewest runs behind any tier's decisive levels (1: the decision rests on one run)
    runs: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
