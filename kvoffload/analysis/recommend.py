"""Which tier to use at how much live history: computed from measured cells and stated predictions.

Pure: summary rows (with tier_comparison's `comparable`), capacity predictions and knees in; one
`Recommendation` per sweep (model, num_rounds, ISL, OSL) out. At every measured concurrency whose
group is comparable, the tier with the lowest later-round p50 TTFT (repeats averaged) wins unless the
findings say otherwise (below); runs of the same winner become ranges of live history whose bounds are
those measured cells (the crossover lies between the last cell one tier won and the first the next
won). When no tier's knee was found in the sweep, the recommendation says so and names the concurrency
at which live history would reach the smallest predicted capacity above the measured range, but never
a load the dataset cannot produce (the virtual users the cells replayed, after the isl filter and
max_sessions). No bound is ever extrapolated. Live history is that of the sessions live at once
(capacity.live_sessions), not the requested concurrency.

With findings, each offload tier is judged by its own interval against gpu: faster only when the 95 %
CI of its later-round p50 change lies below 0 and offload was not shown to be idle; a CI that includes
0 is indistinguishable, never faster. Of the tiers faster than gpu the simplest wins unless a more
complex one's interval lies wholly below it; with none, the simpler tier (gpu, then cpu). Where that is
not the lowest p50 the statement says why, and it names each verdict within noise with the repeats that
would separate it (analysis/noise.py). A knee found in one sweep (model, num_rounds, ISL, OSL) says
nothing of another's.
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
from kvoffload.analysis.findings import Finding, p50_verdict
from kvoffload.analysis.noise import repeats_to_separate, within_noise
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
    # Offload tiers whose p50 change against gpu is within noise, with the repeats that would separate
    # it; and whether any verdict of the sweep rests on one repeat per cell (analysis/noise.py).
    within_noise: list[str] = field(default_factory=list)
    one_repeat: bool = False
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


def _judged(tier: str, f: Finding | None) -> str | None:
    """None when `tier` is measurably faster than gpu with offload not shown idle (its own interval of
    the p50 change lies below 0), else why not, in words."""
    if f is None or f.p50_change_ci_pct is None:
        return f"{tier}'s p50 has no interval against gpu (too few sessions or no gpu cell)"
    verdict = f.p50_verdict or p50_verdict(f.p50_change_ci_pct)
    if verdict == "indistinguishable":
        return f"{tier} is indistinguishable from gpu ({_pct_text(f)}: the interval includes 0)"
    if verdict == "slower":
        return f"{tier} was measurably slower than gpu ({_pct_text(f)})"
    if f.offload_exercised is False:
        return f"{tier}'s offload was never exercised, so its lead ({_pct_text(f)}) is no offload effect"
    return None


def _separated(faster: Finding, than: Finding) -> bool:
    """Whether `faster`'s interval of the p50 change against gpu lies wholly below `than`'s: the only
    case in which one offload tier is taken to beat another (both intervals are against the same gpu
    cells; overlapping intervals leave the two indistinguishable from each other)."""
    a, b = faster.p50_change_ci_pct, than.p50_change_ci_pct
    return a is not None and b is not None and a[1] < b[0]


def _pick(best: str, tiers: Sequence[str], found: Mapping[str, Finding]) -> tuple[str, str | None]:
    """The tier to recommend at one level where `best` had the lowest p50, from each offload tier's own
    interval against gpu: of the tiers measurably faster than gpu (offload not idle), the simplest,
    unless a more complex one's interval lies wholly below it; none of them: the simplest tier measured
    (gpu, then cpu). A tier whose interval includes 0 is indistinguishable from gpu, never faster.
    Returns the tier and, where it is not `best`, why."""
    ordered = sorted(tiers, key=lambda t: TIER_ORDER.get(t, 9))
    offload = [t for t in ordered if t != "gpu"]
    why_not = {t: _judged(t, found.get(t)) for t in offload}
    faster = [t for t in offload if why_not[t] is None]
    pick = ordered[0] if not faster else faster[0]
    for t in faster[1:]:
        if _separated(found[t], found[pick]):
            pick = t
    if pick == best:
        return pick, None
    reasons = []
    if best in faster:
        reasons.append(
            f"{best}'s lead ({_pct_text(found[best])}) is not separated from {pick}'s "
            f"({_pct_text(found[pick])}): their intervals overlap, so the two are indistinguishable"
        )
    elif best != "gpu":
        reasons.append(str(why_not[best]))
    if pick != "gpu":
        reasons.append(f"{pick} is measurably faster than gpu ({_pct_text(found[pick])})")
    return pick, "; ".join(reasons) or None


def _noise(c: int, tiers: Sequence[str], found: Mapping[str, Finding]) -> list[str]:
    """Per offload tier at level `c` whose p50 change against gpu is within noise: the change and the
    repeats per cell that would separate it (analysis/noise.py)."""
    out = []
    for t in sorted(tiers, key=lambda t: TIER_ORDER.get(t, 9)):
        f = found.get(t)
        if t == "gpu" or f is None or not within_noise(f.p50_change_ci_pct):
            continue
        n0 = min(f.repeats, f.gpu_repeats or f.repeats)
        n = f.repeats_to_separate
        if n is None:
            n = repeats_to_separate(f.p50_change_vs_gpu_pct, f.p50_change_ci_pct, n0)
        more = (
            f"about {n} repeats per cell would separate it"
            if n is not None
            else "no repeat count separates a change of 0"
        )
        out.append(f"{t} at concurrency {c} ({_pct_text(f)}): within noise, {more}")
    return out


def _levels(
    rows: pd.DataFrame, found: Mapping[tuple[int, str], Finding]
) -> tuple[list[tuple[int, str, list[str], float | None]], list[str], list[str], list[str]]:
    """Per concurrency: (concurrency, recommended tier, its cells, sessions live at once), the excluded
    levels, why a simpler tier was recommended where one was, and the verdicts within noise."""
    levels, excluded, simpler, noisy = [], [], [], []
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
            tiers = [str(t) for t in per_tier.index]
            mine = {t: found[(as_int(c), t)] for t in tiers if (as_int(c), t) in found}
            pick, why = _pick(pick, tiers, mine)
            noisy += _noise(as_int(c), tiers, mine)
        if why:
            simpler.append(f"{pick} at concurrency {as_int(c)}: {why}")
        live = live_sessions(g).dropna()
        cells = sorted(g.loc[g["tier"] == pick, "cell_id"].astype(str))
        levels.append((as_int(c), pick, cells, float(live.mean()) if len(live) else None))
    return levels, excluded, simpler, noisy


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
        levels, excluded, simpler, noisy = _levels(rows, found)
        single = any(f.one_repeat and f.p50_change_vs_gpu_pct is not None for f in found.values())
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
        if noisy:
            text += f"; verdicts within noise: {'; '.join(noisy)}"
        if single:
            text += (
                "; these verdicts rest on one repeat per cell, whose run-to-run noise the campaign cannot "
                "judge (set `repeats` to 2 or more)"
            )
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
                within_noise=noisy,
                one_repeat=single,
                knee_crossed=crossed,
                extend_to_concurrency=extend,
                statement=text + ".",
            )
        )
    return out
