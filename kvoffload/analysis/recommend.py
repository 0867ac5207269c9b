"""Which tier to use at how much live history: computed from measured cells and stated predictions.

Pure: summary rows (with tier_comparison's `comparable`), capacity predictions and knees in; one
`Recommendation` per sweep (model, num_rounds, ISL, OSL) out. At every measured concurrency whose
group is comparable, the tier with the lowest later-round p50 TTFT (repeats averaged) wins; runs of
the same winner become ranges of live history whose bounds are those measured cells (the crossover
lies between the last cell one tier won and the first the next won). When no tier's knee was found in
the sweep, the recommendation says so and names the concurrency at which live history would reach the
smallest predicted capacity above the measured range (capped by the dataset's virtual users). No
bound is ever extrapolated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from kvoffload.analysis.capacity import SWEEP_KEYS, Knee, TierCapacity, as_int, mean_live_context, tokens_text
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
    knee_crossed: bool = False
    extend_to_concurrency: int | None = None
    statement: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _history(concurrency: float, users: float | None, context: float | None) -> float | None:
    if context is None:
        return None
    return (min(concurrency, users) if users is not None else concurrency) * context


def _levels(rows: pd.DataFrame) -> tuple[list[tuple[int, str, list[str], float | None]], list[str]]:
    """Per concurrency: (concurrency, winning tier, its cells, virtual users), and excluded levels."""
    levels, excluded = [], []
    for c, g in rows.groupby("concurrency", sort=True):
        if "comparable" in g and not g["comparable"].fillna(True).astype(bool).all():
            excluded.append(f"concurrency {as_int(c)}: not comparable")
            continue
        per_tier = g.groupby("tier")["ttft_later_p50_s"].mean().dropna()
        if len(per_tier) < 2:
            excluded.append(f"concurrency {as_int(c)}: fewer than two tiers measured")
            continue
        best = min(per_tier.index, key=lambda t: (float(per_tier[t]), TIER_ORDER.get(str(t), 9)))
        users = pd.to_numeric(g["virtual_users_available"], errors="coerce").dropna()
        cells = sorted(g.loc[g["tier"] == best, "cell_id"].astype(str))
        levels.append((as_int(c), str(best), cells, float(users.min()) if len(users) else None))
    return levels, excluded


def _segments(
    levels: Sequence[tuple[int, str, list[str], float | None]], context: float | None
) -> list[Segment]:
    segs: list[Segment] = []
    for c, tier, cells, users in levels:
        h = _history(c, users, context)
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
            f"{text}, and the dataset yields only {users:.0f} virtual users at this num_rounds, which the "
            "sweep already reached: raise num_rounds or replay a larger dataset"
        )
    above = sorted(
        (p for p in preds if p.sessions is not None and (measured_max is None or p.sessions > measured_max)),
        key=lambda p: float(p.sessions or 0.0),
    )
    if not above:
        known = any(p.sessions is not None for p in preds)
        why = "no predicted capacity lies above it" if known else "no capacity could be predicted"
        return None, f"{text} and {why}: extend concurrency beyond {measured_max or 0:.0f}"
    first = above[0]
    target = math.ceil(float(first.sessions or 0.0))
    text += (
        f": extend concurrency to {target} (where live history reaches {first.tier}'s predicted "
        f"{tokens_text(first.tokens)} tokens)"
    )
    if users is not None and target > users:
        text += (
            f"; the dataset yields only {users:.0f} virtual users at this num_rounds, so raise num_rounds or "
            "replay a larger dataset"
        )
    return target, text


def recommend(
    comparison: pd.DataFrame, predictions: Sequence[TierCapacity], knees: Sequence[Knee]
) -> list[Recommendation]:
    """One recommendation per sweep of `comparison` (tier_comparison output)."""
    out: list[Recommendation] = []
    if comparison.empty:
        return out
    contexts = mean_live_context(comparison)
    for key, rows in comparison.groupby(SWEEP_KEYS, sort=False, dropna=False):
        model, num_rounds, isl, osl = key
        ctx = contexts.get((model, num_rounds, isl, osl))
        context = ctx[0] if ctx else None
        levels, excluded = _levels(rows)
        segs = _segments(levels, context)
        preds = [
            p
            for p in predictions
            if (p.model, p.num_rounds, p.isl, p.osl) == (str(model), num_rounds, isl, str(osl))
        ]
        mine = [
            k for k in knees if k.model == str(model) and k.fixed.get("num_rounds", num_rounds) == num_rounds
        ]
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
            users = pd.to_numeric(rows["virtual_users_available"], errors="coerce").dropna()
            measured = pd.to_numeric(rows["concurrency"], errors="coerce").max()
            eff = min(float(measured), float(users.min())) if len(users) else float(measured)
            extend, more = _extend_to(preds, eff, float(users.min()) if len(users) else None)
            text += f"; {more}"
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
                knee_crossed=crossed,
                extend_to_concurrency=extend,
                statement=text + ".",
            )
        )
    return out
