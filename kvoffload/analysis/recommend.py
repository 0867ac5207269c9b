"""Which tier to use at how much live history: computed from measured cells and stated predictions.

Pure: summary rows (with tier_comparison's `comparable`), capacity predictions and knees in; one
`Recommendation` per sweep (model, num_rounds, ISL, OSL) out. At every measured concurrency whose
group is comparable, the tier with the lowest later-round p50 TTFT (repeats averaged) wins; runs of
the same winner become ranges of live history whose bounds are those measured cells (the crossover
lies between the last cell one tier won and the first the next won). When no tier's knee was found in
the sweep, the recommendation says so and names the concurrency at which live history would reach the
smallest predicted capacity above the measured range, but never a load the dataset cannot produce
(the virtual users the cells replayed, after the isl filter and max_sessions). No bound is ever
extrapolated. Live history is that of the sessions live at once (capacity.live_sessions), not the
requested concurrency.

A faster offload tier wins a level only when the findings show it measurably faster than gpu (the 95 %
CI of its later-round p50 change lies below 0) and offload was not shown to be idle; otherwise the
simpler tier (gpu, then cpu) is recommended there, and the statement says why. A knee found in one
sweep (model, num_rounds, ISL, OSL) says nothing of another's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from kvoffload.analysis.capacity import (
    SWEEP_KEYS,
    Knee,
    TierCapacity,
    as_int,
    live_sessions,
    load_ceiling,
    mean_live_context,
    tokens_text,
)
from kvoffload.analysis.findings import Finding
from kvoffload.analysis.summary import TIER_ORDER


@dataclass(frozen=True)
class Segment:
    """A range of measured concurrency (and live history) over which one tier had the lowest TTFT."""

    tier: str
    from_concurrency: int
    to_concurrency: int
    from_history_tokens: float | None
    to_history_tokens: float | None
    cells: list[str]


@dataclass(frozen=True)
class Recommendation:
    """The tier recommendation of one sweep."""

    model: str
    num_rounds: int
    isl: int
    osl: str
    segments: list[Segment]
    excluded: list[str] = field(default_factory=list)
    # Levels where a faster offload tier was not measurably faster (or offload idle): why the simpler won.
    simpler: list[str] = field(default_factory=list)
    knee_crossed: bool = False
    extend_to_concurrency: int | None = None
    statement: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _history(live: float | None, context: float | None) -> float | None:
    return None if live is None or context is None else live * context


def _pct_text(f: Finding) -> str:
    ci = f.p50_change_ci_pct
    est = "–" if f.p50_change_vs_gpu_pct is None else f"{f.p50_change_vs_gpu_pct:+.0f} %"
    return est + ("" if ci is None else f", 95 % CI {ci[0]:+.0f} to {ci[1]:+.0f} %")


def _simpler(best: str, tiers: Sequence[str], finding: Finding | None) -> tuple[str, str | None]:
    """The tier to recommend where `best` had the lowest p50: `best` when it is gpu, or measurably
    faster than gpu with offload not shown idle; else the simplest tier measured (gpu, then cpu), and
    why."""
    if best == "gpu":
        return best, None
    simplest = min(tiers, key=lambda t: TIER_ORDER.get(t, 9))
    if simplest == best:
        return best, None
    why: str | None = None
    if finding is None or finding.p50_change_ci_pct is None:
        why = f"{best}'s lower p50 has no interval against gpu (too few sessions or no gpu cell)"
    elif finding.p50_change_ci_pct[1] >= 0:
        why = f"{best} was not measurably faster than gpu ({_pct_text(finding)})"
    elif finding.offload_exercised is False:
        why = f"{best}'s offload was never exercised, so its lead ({_pct_text(finding)}) is no offload effect"
    return (simplest, why) if why else (best, None)


def _levels(
    rows: pd.DataFrame, found: Mapping[tuple[int, str], Finding]
) -> tuple[list[tuple[int, str, list[str], float | None]], list[str], list[str]]:
    """Per concurrency: (concurrency, recommended tier, its cells, sessions live at once), the excluded
    levels, and why a simpler tier was recommended where one was."""
    levels, excluded, simpler = [], [], []
    for c, g in rows.groupby("concurrency", sort=True):
        if "comparable" in g and not g["comparable"].fillna(True).astype(bool).all():
            excluded.append(f"concurrency {as_int(c)}: not comparable")
            continue
        per_tier = g.groupby("tier")["ttft_later_p50_s"].mean().dropna()
        if len(per_tier) < 2:
            excluded.append(f"concurrency {as_int(c)}: fewer than two tiers measured")
            continue
        best = min(per_tier.index, key=lambda t: (float(per_tier[t]), TIER_ORDER.get(str(t), 9)))
        pick, why = str(best), None
        if found:
            pick, why = _simpler(pick, [str(t) for t in per_tier.index], found.get((as_int(c), pick)))
        if why:
            simpler.append(f"{pick} at concurrency {as_int(c)}: {why}")
        live = live_sessions(g).dropna()
        cells = sorted(g.loc[g["tier"] == pick, "cell_id"].astype(str))
        levels.append((as_int(c), pick, cells, float(live.mean()) if len(live) else None))
    return levels, excluded, simpler


def _segments(
    levels: Sequence[tuple[int, str, list[str], float | None]], context: float | None
) -> list[Segment]:
    segs: list[Segment] = []
    for c, tier, cells, live in levels:
        h = _history(live, context)
        if segs and segs[-1].tier == tier:
            last = segs[-1]
            segs[-1] = Segment(
                tier, last.from_concurrency, c, last.from_history_tokens, h, last.cells + cells
            )
        else:
            segs.append(Segment(tier, c, c, h, h, cells))
    return segs


def _range_text(s: Segment, first: bool, last: bool) -> str:
    lo = f"{tokens_text(s.from_history_tokens)} (concurrency {s.from_concurrency})"
    hi = f"{tokens_text(s.to_history_tokens)} (concurrency {s.to_concurrency})"
    if first and last and s.from_concurrency == s.to_concurrency:
        return f"{s.tier} at the only comparable level, {lo.replace(' (', ' tokens of live history (')}"
    if first and last:
        return f"{s.tier} at every comparable level, from {lo} to {hi} tokens of live history"
    if first:
        return f"{s.tier} up to {hi} tokens of live history"
    if last:
        return f"{s.tier} from {lo} to {hi}, the largest measured"
    return f"{s.tier} from {lo} to {hi}"


def _extend_to(
    preds: Sequence[TierCapacity], measured_max: float | None, users: float | None
) -> tuple[int | None, str]:
    """The concurrency at which live history would reach the smallest predicted capacity above the
    measured range, and the sentence saying so."""
    text = "the sweep did not cross a capacity"
    if users is not None and measured_max is not None and measured_max >= users:
        return None, (
            f"{text}, and the cells replayed at most {users:.0f} virtual users at this num_rounds (after the "
            "isl filter and max_sessions), which the sweep already reached: raise num_rounds or "
            "max_sessions, or replay a larger dataset"
        )
    above = sorted(
        (p for p in preds if p.sessions is not None and (measured_max is None or p.sessions > measured_max)),
        key=lambda p: float(p.sessions or 0.0),
    )
    if not above:
        known = any(p.sessions is not None for p in preds)
        why = "no predicted capacity lies above it" if known else "no capacity could be predicted"
        if users is not None:
            return None, (
                f"{text} and {why}; the cells replayed at most {users:.0f} virtual users, so raise "
                "num_rounds or max_sessions, or replay a larger dataset"
            )
        return None, f"{text} and {why}: extend concurrency beyond {measured_max or 0:.0f}"
    first = above[0]
    target = math.ceil(float(first.sessions or 0.0))
    reach = f"live history reaches {first.tier}'s predicted {tokens_text(first.tokens)} tokens"
    if users is not None and target > users:
        # never advise a load the dataset cannot produce
        return None, (
            f"{text}: {reach} only at {target} concurrent sessions, but the cells replayed at most "
            f"{users:.0f} virtual users at this num_rounds (after the isl filter and max_sessions): raise "
            "num_rounds or max_sessions, or replay a larger dataset"
        )
    return target, f"{text}: extend concurrency to {target} (where {reach})"


def _same_sweep(k: Knee, num_rounds: Any, isl: Any, osl: Any) -> bool:
    """Whether a knee belongs to this sweep: every fixed value it has matches."""
    mine = {"num_rounds": as_int(num_rounds), "isl": as_int(isl), "osl": str(osl)}
    for name, value in mine.items():
        if name in k.fixed and (str(k.fixed[name]) if name == "osl" else as_int(k.fixed[name])) != value:
            return False
    return True


def recommend(
    comparison: pd.DataFrame,
    predictions: Sequence[TierCapacity],
    knees: Sequence[Knee],
    findings: Sequence[Finding] = (),
) -> list[Recommendation]:
    """One recommendation per sweep of `comparison` (tier_comparison output); `findings` give the
    confidence intervals and whether offload was exercised (a sweep without any finding is judged on
    its p50 alone, as a plain comparison table)."""
    out: list[Recommendation] = []
    if comparison.empty:
        return out
    contexts = mean_live_context(comparison)
    for key, rows in comparison.groupby(SWEEP_KEYS, sort=False, dropna=False):
        model, num_rounds, isl, osl = key
        ctx = contexts.get((model, num_rounds, isl, osl))
        context = ctx[0] if ctx else None
        found = {
            (f.concurrency, f.tier): f
            for f in findings
            if (f.model, f.num_rounds, f.isl, f.osl)
            == (str(model), as_int(num_rounds), as_int(isl), str(osl))
        }
        levels, excluded, simpler = _levels(rows, found)
        segs = _segments(levels, context)
        preds = [
            p
            for p in predictions
            if (p.model, p.num_rounds, p.isl, p.osl) == (str(model), num_rounds, isl, str(osl))
        ]
        mine = [k for k in knees if k.model == str(model) and _same_sweep(k, num_rounds, isl, osl)]
        crossed = any(k.status == "found" for k in mine)
        if segs:
            parts = [_range_text(s, i == 0, i == len(segs) - 1) for i, s in enumerate(segs)]
            text = ", ".join(parts)
            for a, b in itertools.pairwise(segs):
                text += (
                    f"; the {a.tier}-to-{b.tier} crossover lies between {tokens_text(a.to_history_tokens)} "
                    f"and {tokens_text(b.from_history_tokens)} tokens"
                )
        else:
            text = "no measured level has two comparable tiers: no recommendation"
        extend: int | None = None
        top = max((s.to_history_tokens or 0.0 for s in segs), default=0.0)
        for p in preds:
            if not crossed and p.tokens is not None and top > p.tokens:
                text += (
                    f"; live history passed {p.tier}'s predicted {tokens_text(p.tokens)} tokens "
                    "without a measured knee"
                )
        if not crossed:
            users = load_ceiling(rows)
            measured = float(pd.to_numeric(rows["concurrency"], errors="coerce").max())
            eff = min(measured, users) if users is not None else measured
            extend, more = _extend_to(preds, eff, users)
            text += f"; {more}"
        if simpler:
            text += f"; the simpler tier where the faster one's lead is not shown: {'; '.join(simpler)}"
        if excluded:
            text += f" (left out: {'; '.join(excluded)})"
        out.append(
            Recommendation(
                model=str(model),
                num_rounds=as_int(num_rounds),
                isl=as_int(isl),
                osl=str(osl),
                segments=segs,
                excluded=excluded,
                simpler=simpler,
                knee_crossed=crossed,
                extend_to_concurrency=extend,
                statement=text + ".",
            )
        )
    return out
