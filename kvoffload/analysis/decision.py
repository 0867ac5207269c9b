"""Which tier, at what scale, at what cost: each tier's sessions at the campaign's latency target.

Pure: summary rows, each cell's request records, the campaign's `slo` and `prices`
(kvoffload/config/slo.py), the capacity predictions and the sizes of the offload stores in; frozen
dataclasses out. No IO, no printing. Definitions, formulas and null rules: docs/metrics.md "Decision".

Per sweep (model, num_rounds, ISL, OSL) and tier, over its valid cells only (the validity rules of the
findings, `compare.cell_invalid_reasons`, and status done):
- a *level* is the sessions live at once (`capacity.live_sessions`: the requested concurrency, never
  more than the users the cell could replay), its cells pooled (repeats, or two concurrencies that ran
  the same load); its later-round (rounds >= 2) figures meet the target when every limit the `slo`
  sets holds; a level missing a set limit's figure is not judged.
- *sessions at the target*: between the largest level that meets the target below the smallest that
  misses it and that smallest missing level, the crossing by linear interpolation of each missed
  limit's figure against the level (the smallest such crossing); its 95 % interval from a bootstrap
  over sessions (kvoffload/analysis/bootstrap.py: both levels' cells resampled independently, the
  crossing recomputed per replicate; a replicate whose lower level misses too lies below the bracket,
  one whose upper level meets lies above it, and an interval end that falls there is a bound).
  Censored: never missed gives "at least" the highest level (the most the dataset can replay when it is
  the sweep's load ceiling); always missed gives "fewer than" the smallest level.
- *goodput* at the operating level (the largest measured level that meets the target, so a measured
  cell, not the interpolated crossing): GuideLLM's definition, only requests whose own TTFT is within
  the p95 limit (and TPOT within the TPOT limit, when set) count; requests/s and tokens/s over the
  replay's wall time, mean over the level's cells, and per GPU.
- *cost* per million tokens of goodput from the price list, each price counted only where the tier
  uses that resource, and *energy* per million tokens from the measured GPU power.
- the ratio of an offload tier's sessions to gpu's, its interval from the same replicates (tiers are
  separate runs: replicate b of each is an independent draw, so their ratio is a draw of the joint
  distribution), and one sentence per offload tier.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from kvoffload.analysis import bootstrap, costing, crossing
from kvoffload.analysis.capacity import SWEEP_KEYS, Stated, TierCapacity, load_ceiling
from kvoffload.analysis.compare import cell_invalid_reasons
from kvoffload.analysis.costing import BASE_PRICES, Cost, Goodput, Resources
from kvoffload.analysis.crossing import Bound, Level, Limit, Status
from kvoffload.analysis.software import version_splits
from kvoffload.config.slo import Prices, Slo
from kvoffload.tiers import TIERS


@dataclass(frozen=True)
class TierDecision:
    """One tier of one sweep: sessions at the target, goodput, cost and the verdict."""

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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sessions_text(d: TierDecision) -> str:
    if d.status == "no_data":
        return "–"
    if d.status == "fewer_than":
        return f"< {d.sessions:g} (missed at every level)"
    if d.status == "at_least":
        where = (
            "the most this dataset can replay"
            if d.ceiling is not None and d.sessions is not None and d.sessions >= d.ceiling
            else "the highest level measured"
        )
        return f">= {d.sessions:g} ({where})"
    assert d.sessions is not None
    if d.sessions_ci is None or d.sessions_ci_censored is None:
        return f"{d.sessions:.3g} (no interval)"
    lo, hi = d.sessions_ci
    lo_t = f"<{lo:.3g}" if d.sessions_ci_censored[0] else f"{lo:.3g}"
    hi_t = f">{hi:.3g}" if d.sessions_ci_censored[1] else f"{hi:.3g}"
    return f"{d.sessions:.3g} [{lo_t}-{hi_t}]"


@dataclass(frozen=True)
class _Inputs:
    slo: Slo
    limits: list[Limit]
    prices: Prices | None
    predictions: Sequence[TierCapacity]
    profile_l1: Mapping[str, Stated]
    l2: Mapping[str, Stated]
    replicates: int
    min_sessions: int


# The records of a cell without any (bootstrap reads these columns).
_NO_REQUESTS = pd.DataFrame(columns=["user_id", "round", "status", "ttft_s"])


def _key(key: Any) -> tuple[Any, ...]:
    """A groupby key of SWEEP_KEYS as a plain tuple."""
    return tuple(key)


def _prediction(key: tuple[Any, ...], tier: str, predictions: Sequence[TierCapacity]) -> TierCapacity | None:
    model, num_rounds, isl, osl = key
    for p in predictions:
        if (p.model, str(p.num_rounds), str(p.isl), p.osl, p.tier) == (
            str(model),
            str(num_rounds),
            str(isl),
            str(osl),
            tier,
        ):
            return p
    return None


def _tier(
    key: tuple[Any, ...],
    tier: str,
    rows: pd.DataFrame,
    excluded: list[str],
    requests: Mapping[str, pd.DataFrame],
    inp: _Inputs,
    rng: np.random.Generator,
) -> tuple[TierDecision, np.ndarray | None]:
    """One tier's decision and its crossing replicates (None without an interval)."""
    model, num_rounds, isl, osl = key
    levels, samples = crossing.levels(rows, requests, inp.limits) if not rows.empty else ([], {})
    # each level's p95 with its interval, for the plot and the JSON
    levels = [
        replace(
            lv,
            ttft_p95_ci_s=bootstrap.later_percentile(
                [requests.get(c, _NO_REQUESTS) for c in lv.cells],
                95,
                inp.replicates,
                min_sessions=inp.min_sessions,
            ).as_list(),
        )
        for lv in levels
    ]
    r = crossing.ramp(levels)
    top = load_ceiling(rows) if not rows.empty else None
    ceiling = None if top is None else int(top)
    sessions: float | None = None if r.bound is None else float(r.bound)
    sessions_bound: Literal["=", ">=", "<"] | None = {"at_least": ">=", "fewer_than": "<"}.get(r.status)  # type: ignore[assignment]
    ci: list[float] | None = None
    censored: list[bool] | None = None
    note: str | None = None
    binding: str | None = None
    draws: np.ndarray | None = None
    if r.status == "crossing":
        assert r.low is not None and r.high is not None
        x0, x1 = float(r.low.sessions_at_once), float(r.high.sessions_at_once)
        x, which = crossing.cross(
            inp.limits, crossing.at_level(r.low, inp.limits), crossing.at_level(r.high, inp.limits), x0, x1
        )
        sessions, sessions_bound = float(x[0]), "="
        binding = inp.limits[int(which[0])].words if int(which[0]) >= 0 else None
        s0, s1 = samples[r.low.sessions_at_once], samples[r.high.sessions_at_once]
        if min(s0.sessions, s1.sessions) < inp.min_sessions:
            note = (
                f"too few sessions for an interval: {s0.sessions} and {s1.sessions} at the two levels, at "
                f"least {inp.min_sessions} each"
            )
        else:
            keys = [lim.key for lim in inp.limits]
            d0 = crossing.draws(s0, keys, inp.replicates, rng)
            d1 = crossing.draws(s1, keys, inp.replicates, rng)
            draws, _ = crossing.cross(inp.limits, d0, d1, x0, x1)
            got = crossing.interval(draws, x0, x1)
            if got is None:
                note, draws = "no interval: a limit's figure is unknown in too many replicates", None
            else:
                ci, censored = got
    elif r.status == "fewer_than" and r.high is not None:
        binding = next(
            (lim.words for lim in inp.limits if any(m.startswith(lim.words) for m in r.high.missed)), None
        )
    operating = r.low if r.status in ("crossing", "at_least") else None
    res = (
        costing.resources(rows, tier, inp.profile_l1, inp.l2)
        if not rows.empty
        else Resources(None, None, None)
    )
    goodput: Goodput | None = None
    energy: float | None = None
    power: float | None = None
    if operating is not None:
        goodput, energy, power = costing.goodput(
            operating, rows, requests, inp.slo, ">=" if r.status == "at_least" else "="
        )
    price = costing.cost(tier, res, inp.prices, goodput, energy, power)
    pred = _prediction(key, tier, inp.predictions)
    d = TierDecision(
        model=str(model),
        num_rounds=int(num_rounds),
        isl=int(isl),
        osl=str(osl),
        tier=tier,
        status=r.status,
        sessions=sessions,
        sessions_bound=sessions_bound,
        sessions_ci=ci,
        sessions_ci_censored=censored,
        interval_note=note,
        last_meeting=None if r.low is None else r.low.sessions_at_once,
        first_missing=None if r.high is None else r.high.sessions_at_once,
        binding_limit=binding,
        ceiling=ceiling,
        non_monotone=r.non_monotone,
        levels=levels,
        goodput=goodput,
        resources=res,
        cost=price,
        history_tokens=None if pred is None else pred.tokens,
        history_sessions=None if pred is None else pred.sessions,
        excluded=excluded,
    )
    return d, draws


def _vs_gpu(
    t: TierDecision, g: TierDecision
) -> tuple[float | None, Bound | None, float | None, Bound | None]:
    """(sessions ratio, its bound, extra sessions, their bound) of tier t against gpu g."""
    ts, gs = t.sessions, g.sessions
    if ts is None or gs is None or t.status == "no_data" or g.status == "no_data":
        return None, None, None, None
    pair = (t.status, g.status)
    if pair == ("crossing", "crossing"):
        return ts / gs, "=", ts - gs, "="
    if pair in (("at_least", "crossing"), ("at_least", "fewer_than"), ("crossing", "fewer_than")):
        return (ts / gs if gs > 0 else None), ">=", ts - gs, ">="
    if pair in (("fewer_than", "crossing"), ("fewer_than", "at_least"), ("crossing", "at_least")):
        return ts / gs if gs > 0 else None, "<=", None, None
    return None, None, None, None


def _with_gpu(
    t: TierDecision, g: TierDecision | None, t_draws: np.ndarray | None, g_draws: np.ndarray | None
) -> TierDecision:
    if g is None or t.tier == "gpu":
        return t
    ratio, rbound, extra, ebound = _vs_gpu(t, g)
    ci = None
    if rbound == "=" and t_draws is not None and g_draws is not None:
        ci = crossing.ratio_interval(crossing.ratio_draws(t_draws, g_draws))
    dram = nvme = None
    if extra is not None and extra > 0:
        tr, gr = t.resources, g.resources
        if tr.dram_gb is not None and gr.dram_gb is not None and tr.dram_gb > gr.dram_gb:
            dram = (tr.dram_gb - gr.dram_gb) / extra
        if tr.nvme_tb is not None and gr.nvme_tb is not None and tr.nvme_tb > gr.nvme_tb:
            nvme = 1000.0 * (tr.nvme_tb - gr.nvme_tb) / extra
    else:
        extra, ebound = None, None
    # more extra sessions (a ">=" bound) means fewer GB per extra session
    per: Bound | None = None if ebound is None else "<=" if ebound == ">=" else "="
    done = _replace(
        t,
        ratio_vs_gpu=ratio,
        ratio_bound=rbound,
        ratio_ci=ci,
        extra_sessions_vs_gpu=extra,
        dram_gb_per_extra_session=dram,
        nvme_gb_per_extra_session=nvme,
        extra_bound=per,
    )
    return _replace(done, more_than_gpu=_more_than_gpu(done, g))


def _replace(d: TierDecision, **changes: Any) -> TierDecision:
    return replace(d, **changes)


def _more_than_gpu(d: TierDecision, g: TierDecision) -> bool | None:
    """True when the tier surely sustains more sessions than gpu, False when surely fewer, None when
    the data cannot tell (an interval including 1, a bound on the wrong side, no comparison). A side
    that missed at every level is below its bound strictly, so a ratio bound of exactly 1 decides."""
    r = d.ratio_vs_gpu
    if r is None or d.ratio_bound is None:
        return None
    if d.ratio_bound == ">=":
        return True if r > 1 or (r == 1 and g.status == "fewer_than") else None
    if d.ratio_bound == "<=":
        return False if r < 1 or (r == 1 and d.status == "fewer_than") else None
    if d.ratio_ci is None:
        return None
    lo, hi = d.ratio_ci
    if lo is not None and lo > 1:
        return True
    if hi is not None and hi < 1:
        return False
    return None


def _pick(tiers: Sequence[TierDecision]) -> str | None:
    """The simplest tier that surely sustains more sessions than gpu (cpu before nvme), unless a more
    complex one's interval lies wholly above the simpler one's; else gpu (when it was measured)."""
    better = [d for d in tiers if d.tier != "gpu" and d.more_than_gpu]
    if better:
        pick = better[0]
        for other in better[1:]:
            a, b = pick.ratio_ci, other.ratio_ci
            if a is not None and b is not None and a[1] is not None and b[0] is not None and b[0] > a[1]:
                pick = other
        return pick.tier
    gpu = next((d for d in tiers if d.tier == "gpu" and d.status != "no_data"), None)
    return None if gpu is None else "gpu"


def _verdict(d: TierDecision, pick: str | None, cheapest: str | None) -> str:
    if d.status == "no_data":
        why = "; ".join(sorted({u for lv in d.levels for u in lv.unknown}))
        base = "not judged: " + (f"no {why} measured" if why else "no valid cell")
    elif d.tier == "gpu":
        base = "baseline"
    else:
        more = d.more_than_gpu
        if d.ratio_vs_gpu is None and d.ratio_bound is None:
            base = "no comparison with gpu"
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
    return "; ".join(parts)


def _x(v: float | None, digits: str = ".2g") -> str:
    return "?" if v is None else f"{v:{digits}}x"


def _sentence(d: TierDecision, g: TierDecision, target: str, prices: Prices | None) -> str:
    """ "cpu sustains 2.1x gpu's sessions at p95 TTFT <= 0.5 s (95 % CI 1.7-2.6x) for 1.06x the node
    cost: 49 % less per million tokens", or what the data allow instead."""
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
        return f"{d.tier}: no ratio to gpu"
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
        text = f"{d.tier} sustains {word} {_x(r)} gpu's sessions at {target} ({'; '.join(why)})"
    return text + _cost_words(d, g, prices)


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


def _cost_words(d: TierDecision, g: TierDecision, prices: Prices | None) -> str:
    """ " for 1.06x the node cost: 49 % less per million tokens", or why there is no cost. A cost of a
    tier that never missed is an upper bound (it could carry more), which turns the change into a
    bound on the side it can tell."""
    if prices is None:
        return f"; not priced: set {BASE_PRICES} (campaign prices, or the inventory's kvoffload_prices)"
    dc, gc = d.cost, g.cost
    text = ""
    if dc.per_hour is not None and gc.per_hour:
        text = f" for {dc.per_hour / gc.per_hour:.3g}x the node cost"
    why = [w for w in (_no_cost(d), _no_cost(g)) if w]
    if why:
        return text + f" (no cost per million tokens: {'; '.join(dict.fromkeys(why))})"
    a, b = dc.per_million_tokens, gc.per_million_tokens
    assert a is not None and b is not None
    if dc.bound == "<=" and gc.bound == "<=":
        return text + " (both costs per million tokens are upper bounds: neither tier missed the target)"
    change = 100.0 * (a / b - 1.0)
    if dc.bound == "<=":  # the true change is at most this
        bound = "at least " if change < 0 else "at most "
    elif gc.bound == "<=":  # the true change is at least this
        bound = "at least " if change > 0 else "at most "
    else:
        bound = ""
    direction = "less" if change < 0 else "more"
    return text + f": {bound}{abs(change):.0f} % {direction} per million tokens"


def _conditions(slo: Slo, prices: Prices | None, tiers: Sequence[TierDecision]) -> list[str]:
    out = [
        f"target: later rounds (>= 2), {slo.limits_text()}; a level is the sessions live at once (the "
        "requested concurrency, never more than the users a cell could replay), its cells pooled",
        "sessions at the target: the crossing interpolated linearly between the two measured levels "
        "around it (the missed limit's figure against the level); [a-b] is its 95 % bootstrap interval "
        "over sessions, < or > where the interval reaches beyond the bracket",
        "goodput: requests whose own TTFT (and TPOT) met the limits, at the largest level that meets the "
        "target (>=: the tier never missed it); energy: the GPUs' measured power only",
    ]
    if prices is None:
        out.append(f"not priced: set {BASE_PRICES} (campaign `prices:`, or the inventory's kvoffload_prices)")
    else:
        given = [
            f"{k} {getattr(prices, k):g}"
            for k in ("node_hour", "gpu_hour", "dram_gb_month", "nvme_tb_month", "kwh")
            if getattr(prices, k) is not None
        ]
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
        if d.interval_note:
            out.append(f"{d.tier}: {d.interval_note}")
        out += [f"left out: {e}" for e in d.excluded]
    return out


def _software(software: pd.DataFrame | None, rows: pd.DataFrame) -> list[str]:
    """A caveat when the sweep's cells ran different versions of a compared item (the findings make
    such a group not comparable; a sweep's levels then compare two software versions too)."""
    if software is None:
        return []
    splits = version_splits(software, rows["cell_id"].astype(str))
    if splits.empty:
        return []
    detail = "; ".join(
        f"{i} {v} in {c}" for i, v, c in zip(splits["item"], splits["version"], splits["cells"], strict=True)
    )
    return [f"caveat: the sweep's cells ran different software ({detail}): its levels compare versions too"]


def decide(
    summary: pd.DataFrame,
    requests: Mapping[str, pd.DataFrame],
    slo: Slo,
    prices: Prices | None = None,
    predictions: Sequence[TierCapacity] = (),
    profile_l1: Mapping[str, Stated] | None = None,
    l2: Mapping[str, Stated] | None = None,
    replicates: int = bootstrap.REPLICATES,
    min_sessions: int = bootstrap.MIN_SESSIONS,
    software: pd.DataFrame | None = None,
) -> list[SweepDecision]:
    """One decision table per sweep (model, num_rounds, ISL, OSL) of `summary`, tiers gpu, cpu, nvme.
    `requests`: each cell's request records by cell id; `profile_l1` (per tier, GiB) and `l2` (per
    cell, bytes): the capacity inputs of the L1 pool and the L2 store (report/build.py
    `capacity_inputs`); `software` (analysis/software.py `software_frame`): a sweep whose cells ran
    other versions says so among its conditions."""
    out: list[SweepDecision] = []
    if summary.empty:
        return out
    inp = _Inputs(
        slo, crossing.limits(slo), prices, predictions, profile_l1 or {}, l2 or {}, replicates, min_sessions
    )
    target = slo.limits_text()
    for key, rows in summary.groupby(SWEEP_KEYS, sort=False, dropna=False):
        rng = np.random.default_rng(bootstrap.SEED)
        decisions: list[TierDecision] = []
        draws: dict[str, np.ndarray | None] = {}
        for tier in [t for t in TIERS if (rows["tier"] == t).any()]:
            mine = rows[rows["tier"] == tier]
            keep, excluded = [], []
            for i, row in mine.iterrows():
                why = cell_invalid_reasons(row)
                if row.get("status") != "done":
                    why = [f"{tier} {row['cell_id']} ended {row.get('status')}", *why]
                if why:
                    excluded.append("; ".join(why))
                else:
                    keep.append(i)
            d, dr = _tier(_key(key), tier, mine.loc[keep], excluded, requests, inp, rng)
            decisions.append(d)
            draws[tier] = dr
        gpu = next((d for d in decisions if d.tier == "gpu"), None)
        decisions = [_with_gpu(d, gpu, draws.get(d.tier), draws.get("gpu")) for d in decisions]
        pick = _pick(decisions)
        costs = [(d.cost.per_million_tokens, d.tier) for d in decisions]
        cheapest = (
            min(costs)[1]
            if len(costs) > 1
            and all(c is not None for c, _ in costs)
            and all(d.cost.bound == "=" for d in decisions)
            else None
        )
        decisions = [
            _replace(d, verdict=_verdict(d, pick, cheapest), sessions_text=_sessions_text(d))
            for d in decisions
        ]
        statements = (
            [] if gpu is None else [_sentence(d, gpu, target, prices) for d in decisions if d.tier != "gpu"]
        )
        missing = sorted({m for d in decisions for m in d.cost.missing_prices})
        model, num_rounds, isl, osl = _key(key)
        out.append(
            SweepDecision(
                model=str(model),
                num_rounds=int(num_rounds),
                isl=int(isl),
                osl=str(osl),
                target=target,
                tiers=decisions,
                statements=statements,
                conditions=_conditions(slo, prices, decisions) + _software(software, rows),
                pick=pick,
                missing_prices=missing,
                currency=None if prices is None else prices.currency,
                example_prices=bool(prices is not None and prices.example),
            )
        )
    return out


CSV_COLUMNS = [
    "model", "num_rounds", "isl", "osl", "tier", "target", "status", "sessions", "sessions_bound",
    "sessions_ci_low", "sessions_ci_high", "sessions_ci_low_censored", "sessions_ci_high_censored",
    "last_meeting", "first_missing", "binding_limit", "ceiling", "ratio_vs_gpu", "ratio_bound",
    "ratio_ci_low", "ratio_ci_high", "goodput_requests_per_s", "goodput_tokens_per_s",
    "goodput_completion_tokens_per_s", "goodput_tokens_per_s_per_gpu", "goodput_bound", "gpus", "dram_gb",
    "nvme_tb", "cost_per_hour", "cost_per_million_tokens", "cost_per_million_completion_tokens",
    "cost_bound", "currency", "example_prices", "energy_kwh_per_million_tokens", "extra_sessions_vs_gpu",
    "dram_gb_per_extra_session", "nvme_gb_per_extra_session", "history_tokens", "history_sessions",
    "verdict", "missing_prices",
]  # fmt: skip


def csv_rows(sweeps: Sequence[SweepDecision]) -> pd.DataFrame:
    """The decision as one flat row per sweep and tier (CSV_COLUMNS)."""
    rows = []
    for s in sweeps:
        for d in s.tiers:
            ci: list[Any] = [None, None] if d.sessions_ci is None else list(d.sessions_ci)
            cens: list[Any] = [None, None] if d.sessions_ci_censored is None else list(d.sessions_ci_censored)
            rci: list[Any] = list(d.ratio_ci or [None, None])
            g = d.goodput
            rows.append(
                {
                    "model": d.model, "num_rounds": d.num_rounds, "isl": d.isl, "osl": d.osl, "tier": d.tier,
                    "target": s.target, "status": d.status, "sessions": d.sessions,
                    "sessions_bound": d.sessions_bound, "sessions_ci_low": ci[0], "sessions_ci_high": ci[1],
                    "sessions_ci_low_censored": cens[0], "sessions_ci_high_censored": cens[1],
                    "last_meeting": d.last_meeting, "first_missing": d.first_missing,
                    "binding_limit": d.binding_limit, "ceiling": d.ceiling, "ratio_vs_gpu": d.ratio_vs_gpu,
                    "ratio_bound": d.ratio_bound, "ratio_ci_low": rci[0], "ratio_ci_high": rci[1],
                    "goodput_requests_per_s": None if g is None else g.requests_per_s,
                    "goodput_tokens_per_s": None if g is None else g.tokens_per_s,
                    "goodput_completion_tokens_per_s": None if g is None else g.completion_tokens_per_s,
                    "goodput_tokens_per_s_per_gpu": None if g is None else g.tokens_per_s_per_gpu,
                    "goodput_bound": None if g is None else g.bound, "gpus": d.resources.gpus,
                    "dram_gb": d.resources.dram_gb, "nvme_tb": d.resources.nvme_tb,
                    "cost_per_hour": d.cost.per_hour, "cost_per_million_tokens": d.cost.per_million_tokens,
                    "cost_per_million_completion_tokens": d.cost.per_million_completion_tokens,
                    "cost_bound": d.cost.bound, "currency": s.currency, "example_prices": s.example_prices,
                    "energy_kwh_per_million_tokens": d.cost.energy_kwh_per_million_tokens,
                    "extra_sessions_vs_gpu": d.extra_sessions_vs_gpu,
                    "dram_gb_per_extra_session": d.dram_gb_per_extra_session,
                    "nvme_gb_per_extra_session": d.nvme_gb_per_extra_session,
                    "history_tokens": d.history_tokens, "history_sessions": d.history_sessions,
                    "verdict": d.verdict, "missing_prices": "; ".join(d.cost.missing_prices),
                }
            )  # fmt: skip
    return pd.DataFrame(rows, columns=CSV_COLUMNS)
