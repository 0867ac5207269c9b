"""The decision's words: each tier's sessions text and verdict, the sentence per offload tier, and the
conditions under the table.

Pure text from kvoffload/analysis/decision_types.py results (no arithmetic beyond formatting, no IO);
kvoffload/analysis/decision.py calls it once the numbers are settled. docs/metrics.md "Decision" is
the reference for every phrase's meaning.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.analysis.costing import BASE_PRICES
from kvoffload.analysis.decision_types import TierDecision
from kvoffload.analysis.steady import HELD_SHARE
from kvoffload.config.slo import PRICE_KEYS, Prices, Slo

ONE_RUN = "one run"


def sessions_text(d: TierDecision) -> str:
    """ "18.6 [17.9-19.8]", ">= 32 (the most 64 users hold)", "< 2 (missed at every level)"."""
    runs = f"; {ONE_RUN}" if d.runs == 1 else ""
    if d.status == "no_data":
        return "–"
    if d.status == "fewer_than":
        return f"< {d.sessions:g} (missed at every level{runs})"
    if d.status == "at_least":
        return f">= {d.sessions:g} ({d.capped_by or 'the highest level measured'}{runs})"
    assert d.sessions is not None
    if d.sessions_ci is None or d.sessions_ci_censored is None:
        return f"{d.sessions:.3g} (no interval{runs})"
    lo, hi = d.sessions_ci
    lo_t = f"<{lo:.3g}" if d.sessions_ci_censored[0] else f"{lo:.3g}"
    hi_t = f">{hi:.3g}" if d.sessions_ci_censored[1] else f"{hi:.3g}"
    return f"{d.sessions:.3g} [{lo_t}-{hi_t}]" + (f" ({ONE_RUN})" if runs else "")


def verdict(d: TierDecision, pick: str | None, cheapest: str | None) -> str:
    """The table's verdict: pick, baseline, more/fewer/not distinguishable, and its tags."""
    if d.status == "no_data":
        why = "; ".join(sorted({u for lv in d.levels for u in lv.unknown}))
        base = "not judged: " + (f"missing {why}" if why else "no valid cell")
    elif d.tier == "gpu":
        base = "baseline"
    else:
        more = d.more_than_gpu
        if d.ratio_vs_gpu is None and d.ratio_bound is None and more is None:
            base = "not distinguishable from gpu"
        else:
            base = (
                "more sessions than gpu"
                if more is True
                else "fewer sessions than gpu"
                if more is False
                else "not distinguishable from gpu"
            )
    if d.status == "fewer_than":
        base += "; missed the target at every level"
    parts = [("pick: " if d.tier == pick else "") + base]
    if d.tier == cheapest:
        parts.append("lowest cost per 1M tokens")
    if d.runs == 1:
        parts.append(f"{ONE_RUN}: no pick from it")
    if d.offload_short_of_room:
        parts.append(f"offload short of L1 room in {len(d.offload_short_of_room)} cell(s)")
    return "; ".join(parts)


def _x(v: float | None, digits: str = ".2g") -> str:
    return "?" if v is None else f"{v:{digits}}x"


def sentence(d: TierDecision, g: TierDecision, target: str, prices: Prices | None) -> str:
    """ "cpu sustains 2.1x gpu's sessions at p95 TTFT <= 0.5 s (95 % CI 1.7-2.6x) for 1.06x the node
    cost: 49 % less per million tokens (95 % CI 41-55 %)", or what the data allow instead."""
    r, b = d.ratio_vs_gpu, d.ratio_bound
    if d.status == "no_data":
        return f"{d.tier}: no level could be judged against {target}"
    if g.status == "no_data":
        return f"{d.tier}: gpu has no level judged against {target}, so no ratio"
    if d.status == "fewer_than" and g.status == "fewer_than":
        return (
            f"{d.tier} and gpu both missed {target} at every level measured (from {d.sessions:g} and "
            f"{g.sessions:g} sessions)"
        )
    if d.status == "at_least" and g.status == "at_least":
        return (
            f"{d.tier} and gpu both met {target} at every level measured (up to {d.sessions:g} and "
            f"{g.sessions:g} sessions): the dataset cannot tell them apart at this target; raise the load "
            "(max_sessions, a larger dataset) or tighten the target"
        )
    if r is None:
        return (
            f"{d.tier} ({d.sessions_text}) and gpu ({g.sessions_text}) are not distinguishable at {target}: "
            "a bound on one side meets the other side's open interval"
        )
    if b == "=":
        ci = d.ratio_ci
        if ci is None:
            interval = d.interval_note or g.interval_note or "no interval"
        elif ci[0] is None and ci[1] is None:
            interval = "95 % CI unbounded"
        elif ci[0] is None:
            interval = f"95 % CI at most {_x(ci[1])}"
        elif ci[1] is None:
            interval = f"95 % CI {_x(ci[0])} or more"
        else:
            interval = f"95 % CI {ci[0]:.2g}-{_x(ci[1])}"
        text = f"{d.tier} sustains {_x(r)} gpu's sessions at {target} ({interval})"
    else:
        word = "at least" if b == ">=" else "at most"
        why = []
        for side in (d, g):
            if side.status == "at_least":
                why.append(f"{side.tier} never missed it up to {side.sessions:g} sessions")
            elif side.status == "fewer_than":
                why.append(f"{side.tier} missed it at every level from {side.sessions:g} sessions")
            elif side.sessions_ci is not None:
                end = "upper" if (b == ">=") == (side is g) else "lower"
                why.append(f"{side.tier}'s crossing at its interval's {end} end")
        text = f"{d.tier} sustains {word} {_x(r)} gpu's sessions at {target} ({'; '.join(why)})"
    if d.runs == 1 or g.runs == 1:
        text += f" [{ONE_RUN}: run-to-run noise not measured]"
    return text + cost_words(d, g, prices)


def _no_cost(side: TierDecision) -> str | None:
    """Why a side has no cost per million tokens (None: it has one)."""
    c = side.cost
    if c.per_million_tokens is not None:
        return None
    if side.goodput is None:
        return f"{side.tier} met the target at no level, so it has no operating point to price"
    if c.missing_prices:
        return f"set {', '.join(c.missing_prices)}"
    return "; ".join(c.notes) or f"{side.tier}'s goodput tokens are unknown"


def cost_words(d: TierDecision, g: TierDecision, prices: Prices | None) -> str:
    """ " for 1.06x the node cost: 49 % less per million tokens (95 % CI 41-55 %)", or why there is no
    cost, or that the two costs cannot be told apart."""
    if prices is None:
        return f"; not priced: set {BASE_PRICES} (campaign prices, or the inventory's kvoffload_prices)"
    dc, gc = d.cost, g.cost
    text = ""
    if dc.per_hour is not None and gc.per_hour:
        text = f" for {dc.per_hour / gc.per_hour:.3g}x the node cost"
    why = [w for w in (_no_cost(d), _no_cost(g)) if w]
    if why:
        return text + f" (no cost per million tokens: {'; '.join(dict.fromkeys(why))})"
    change, ci, bound = d.cost_change_pct, d.cost_change_ci_pct, d.cost_change_bound
    if change is None:
        return text + " (the costs per million tokens cannot be told apart: a bound meets an interval)"
    direction = "less" if change < 0 else "more"
    if bound == "=":
        if ci is None:
            return text + f": {abs(change):.0f} % {direction} per million tokens (no interval)"
        if ci[0] <= 0 <= ci[1]:
            return text + (
                f": cost per million tokens not distinguishable ({change:+.0f} %, 95 % CI {ci[0]:+.0f} to "
                f"{ci[1]:+.0f} %)"
            )
        return (
            text
            + f": {abs(change):.0f} % {direction} per million tokens (95 % CI {ci[0]:+.0f} to {ci[1]:+.0f} %)"
        )
    # a bound: "<=" the true change is at most this, ">=" at least this
    if (bound == "<=" and change < 0) or (bound == ">=" and change > 0):
        return text + f": at least {abs(change):.0f} % {direction} per million tokens"
    return text + ": cost per million tokens not distinguishable (a bound on one side)"


def conditions(slo: Slo, prices: Prices | None, tiers: Sequence[TierDecision]) -> list[str]:
    """The lines under the table: what a level, the crossing, goodput and cost are, and each tier's
    caveats."""
    out = [
        f"target: later rounds (>= 2), {slo.limits_text()}; a level is the sessions live at once (the "
        "requested concurrency, never more than the users a cell could replay), judged on its cells' "
        f"steady windows: from the live sessions first reaching the level to their last fall below it, "
        f"at least one median session long, {HELD_SHARE:.0%} of the level held on average and "
        f"{slo.min_window_requests} later-round requests; a level whose load was not held is not judged",
        "sessions at the target: the crossing interpolated linearly between the two measured levels "
        "around it (the missed limit's figure against the level); [a-b] is its 95 % bootstrap interval "
        "over runs (repeats), then sessions; < or > where the interval reaches beyond the bracket",
        "goodput and cost at the crossing: requests whose own TTFT (and TPOT) met the limits, per second "
        "of the steady window, interpolated between the two levels like the crossing (>=: the tier never "
        "missed, so at its highest level); energy: the GPUs' measured power only",
    ]
    if prices is None:
        out.append(f"not priced: set {BASE_PRICES} (campaign `prices:`, or the inventory's kvoffload_prices)")
    else:
        given = [f"{k} {getattr(prices, k):g}" for k in PRICE_KEYS if getattr(prices, k) is not None]
        out.append(
            f"prices ({prices.currency}{', EXAMPLE prices' if prices.example else ''}): {', '.join(given)}"
        )
    for d in tiers:
        if d.non_monotone:
            out.append(
                f"{d.tier} met the target again above its first miss (at "
                f"{', '.join(map(str, d.non_monotone))} sessions): a noisy curve; its crossing is the "
                "first one"
            )
        if d.unjudged:
            out.append(
                f"{d.tier}: level(s) {', '.join(map(str, d.unjudged))} could not be judged (see the levels: "
                "a figure unknown or the load not held) and are left out of its curve"
            )
        if d.interval_note:
            out.append(f"{d.tier}: {d.interval_note}")
        out += [f"left out: {e}" for e in d.excluded]
    return out
