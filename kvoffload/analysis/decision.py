"""Which tier, at what scale, at what cost: each tier's sessions at the campaign's latency target.

Pure: summary rows, each cell's request records, the campaign's `slo` and `prices`
(kvoffload/config/slo.py), the capacity predictions and the sizes of the offload stores in; frozen
dataclasses (kvoffload/analysis/decision_types.py) out, their words from
kvoffload/analysis/decision_words.py. No IO, no printing. Definitions, formulas and null rules:
docs/metrics.md "Decision".

Per sweep (model, num_rounds, ISL, OSL) and tier, over its valid cells only (the validity rules of the
findings, `compare.cell_invalid_reasons`, and status done), on one node's cells or on nodes shown alike
(the same host facts and software; else the node with the most levels, the others left out):
- a *level* is the sessions live at once (`capacity.live_sessions`), its cells' steady windows pooled
  (kvoffload/analysis/steady.py: a cell whose window did not hold the level is left out of it; a level
  no cell held is not judged); config/slo.py `judge` decides whether it meets the target.
- *sessions at the target*: the crossing between the largest level that meets the target below the
  smallest that misses it and that level, each missed limit's figure interpolated linearly against the
  level (the smallest such crossing); its 95 % interval from a bootstrap over runs (repeats), then
  sessions (kvoffload/analysis/bootstrap.py). Censored: never missed gives "at least" the highest held
  level and says what capped it; always missed gives "fewer than" the smallest level.
- *goodput* and *cost* at the crossing: each rate of the two levels (over their steady windows)
  interpolated like the crossing, with the interval the crossing's replicates give; a tier that never
  missed is priced at its highest level, as a bound.
- the ratio of an offload tier's sessions to gpu's, its interval from the same replicates (a censored
  side against the other side's interval end), the change of cost per million tokens with its
  interval, and one sentence per offload tier. "pick" and "lowest cost" only where intervals separate
  and the decisive levels rest on two runs or more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from kvoffload.analysis import bootstrap, costing, crossing, decision_words
from kvoffload.analysis.capacity import (
    SWEEP_KEYS,
    Stated,
    TierCapacity,
    load_ceiling,
    replayable_users,
)
from kvoffload.analysis.compare import cell_invalid_reasons
from kvoffload.analysis.costing import Goodput, Resources
from kvoffload.analysis.crossing import Bound, Level, Sample
from kvoffload.analysis.decision_types import SweepDecision, TierDecision
from kvoffload.analysis.nodes import node_differences
from kvoffload.analysis.software import version_splits
from kvoffload.analysis.steady import Held
from kvoffload.config.slo import Limit, Prices, Slo
from kvoffload.tiers import TIERS

__all__ = ["CSV_COLUMNS", "SweepDecision", "TierDecision", "csv_rows", "decide"]

# The summary column flagging the cells whose L2 loads failed for lack of L1 room (analysis/lmcache.py).
SHORT_OF_ROOM = "lmcache_l2_prefetch_l1_oom"


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
    min_window_requests: int


@dataclass(frozen=True)
class _Draws:
    """A tier's crossing replicates and its cost per million tokens at each (None: no interval)."""

    sessions: np.ndarray | None
    cost: np.ndarray | None


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


def _capped_by(top: Level, levels: Sequence[Level], rows: pd.DataFrame) -> str:
    """What capped an "at least" bound at level `top`: a higher level whose load was not held (the users
    ran out), the users a closed loop can hold (half those replayed, after max_sessions), or the levels
    the campaign asked for."""
    above = [lv for lv in levels if lv.sessions_at_once > top.sessions_at_once and lv.not_held]
    if above:
        lv = above[0]
        return f"level {lv.sessions_at_once} was not held: {lv.not_held[0]}"
    users = (
        pd.to_numeric(rows["achieved_sessions"], errors="coerce").dropna()
        if "achieved_sessions" in rows
        else pd.Series(dtype=float)
    )
    replayable = replayable_users(rows).dropna()
    if len(users):
        n = int(users.max())
        if top.sessions_at_once >= n // 2:
            pool = int(replayable.min()) if len(replayable) else n
            cut = (
                f", max_sessions of the {pool} the dataset offers" if pool > n else ", all the dataset offers"
            )
            return (
                f"the users cap it: {n} replayed{cut}; holding a level for a session takes about twice its "
                "users"
            )
    return "the highest level the campaign asked for"


def _percentiles(draws: np.ndarray) -> list[float] | None:
    """The 95 % interval of finite replicates; None when more than the tails' share is not finite."""
    finite = draws[np.isfinite(draws)]
    tail = (100.0 - bootstrap.CONFIDENCE) / 2
    if not len(finite) or len(finite) < len(draws) * (1 - 2 * tail / 100):
        return None
    return [float(np.percentile(finite, tail)), float(np.percentile(finite, 100 - tail))]


def _tier(
    key: tuple[Any, ...],
    tier: str,
    rows: pd.DataFrame,
    excluded: list[str],
    requests: Mapping[str, pd.DataFrame],
    inp: _Inputs,
    rng: np.random.Generator,
) -> tuple[TierDecision, _Draws]:
    """One tier's decision and its replicates."""
    model, num_rounds, isl, osl = key
    levels: list[Level] = []
    samples: dict[int, Sample] = {}
    held: dict[str, Held] = {}
    if not rows.empty:
        levels, samples, held = crossing.levels(rows, requests, inp.limits, inp.min_window_requests)
    # each level's p95 with its interval, over its steady windows, for the plot and the JSON
    levels = [
        replace(
            lv,
            ttft_p95_ci_s=bootstrap.later_percentile(
                [held[c].records for c in lv.cells], 95, inp.replicates, min_sessions=inp.min_sessions
            ).as_list()
            if lv.cells
            else None,
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
    first_miss = r.high.sessions_at_once if r.high is not None else None
    unjudged = [
        lv.sessions_at_once
        for lv in levels
        if lv.meets is None and (first_miss is None or lv.sessions_at_once < first_miss)
    ]
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
            draws = crossing.few_runs_widened(draws, sessions, min(len(s0.cell_sizes), len(s1.cell_sizes)))
            got = crossing.interval(draws, x0, x1, sessions)
            if got is None:
                note, draws = "no interval: a limit's figure is unknown in too many replicates", None
            else:
                ci, censored = got
    elif r.status == "fewer_than" and r.high is not None:
        binding = next(
            (lim.words for lim in inp.limits if any(m.startswith(lim.words) for m in r.high.missed)), None
        )
    res = (
        costing.resources(rows, tier, inp.profile_l1, inp.l2)
        if not rows.empty
        else Resources(None, None, None)
    )
    goodput: Goodput | None = None
    energy: float | None = None
    power: float | None = None
    tok_draws: np.ndarray | None = None
    if r.status == "crossing" and sessions is not None:
        assert r.low is not None and r.high is not None
        x0, x1 = float(r.low.sessions_at_once), float(r.high.sessions_at_once)
        g0, e0, p0 = costing.goodput(r.low, rows, held, inp.slo, "=")
        g1, e1, p1 = costing.goodput(r.high, rows, held, inp.slo, "=")
        goodput = costing.at_crossing(g0, g1, x0, x1, sessions)
        share = (sessions - x0) / (x1 - x0)
        energy = None if e0 is None or e1 is None else e0 + share * (e1 - e0)
        power = None if p0 is None or p1 is None else p0 + share * (p1 - p0)
        if draws is not None:
            tok_draws = costing.rate_draws(g0.tokens_per_s, g1.tokens_per_s, x0, x1, draws)
    elif r.status == "at_least" and r.low is not None:
        goodput, energy, power = costing.goodput(r.low, rows, held, inp.slo, ">=")
    price = costing.cost(tier, res, inp.prices, goodput, energy, power)
    cost_draws: np.ndarray | None = None
    if tok_draws is not None and price.per_hour is not None and price.per_million_tokens is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            cost_draws = np.where(tok_draws > 0, price.per_hour / (tok_draws * 3600.0) * 1e6, np.nan)
        price = replace(price, per_million_tokens_ci=_percentiles(cost_draws))
    runs = 0
    if r.status == "crossing" and r.low is not None and r.high is not None:
        runs = min(r.low.runs, r.high.runs)
    elif r.status == "at_least" and r.low is not None:
        runs = r.low.runs
    elif r.status == "fewer_than" and r.high is not None:
        runs = r.high.runs
    short = (
        sorted(rows.loc[rows[SHORT_OF_ROOM].eq(True), "cell_id"].astype(str)) if SHORT_OF_ROOM in rows else []
    )
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
        runs=runs,
        capped_by=_capped_by(r.low, levels, rows) if r.status == "at_least" and r.low is not None else None,
        unjudged=unjudged,
        offload_short_of_room=short,
        excluded=excluded,
    )
    return d, _Draws(draws, cost_draws)


def _ends(d: TierDecision) -> tuple[float | None, float | None]:
    """What the data say a tier's crossing surely exceeds and surely stays under (None: no such end):
    an "at least" bound is a low end, a "fewer than" bound a high end, a crossing its interval's ends
    where they are not censored."""
    if d.sessions is None:
        return None, None
    if d.status == "at_least":
        return d.sessions, None
    if d.status == "fewer_than":
        return None, d.sessions
    if d.status == "crossing" and d.sessions_ci is not None and d.sessions_ci_censored is not None:
        lo = None if d.sessions_ci_censored[0] else d.sessions_ci[0]
        hi = None if d.sessions_ci_censored[1] else d.sessions_ci[1]
        return lo, hi
    return None, None


def _vs_gpu(
    t: TierDecision, g: TierDecision
) -> tuple[float | None, Bound | None, float | None, Bound | None]:
    """(sessions ratio, its bound, extra sessions, their bound) of tier t against gpu g. Two crossings
    give estimates; a censored side is compared with the other side's interval end: t >= a against
    g's upper end gives "at least a / g_hi", t < b against g's lower end "at most b / g_lo"."""
    if t.sessions is None or g.sessions is None or "no_data" in (t.status, g.status):
        return None, None, None, None
    pair = (t.status, g.status)
    if pair == ("crossing", "crossing"):
        return t.sessions / g.sessions, "=", t.sessions - g.sessions, "="
    if pair in (("at_least", "at_least"), ("fewer_than", "fewer_than")):
        return None, None, None, None
    t_lo, t_hi = _ends(t)
    g_lo, g_hi = _ends(g)
    if t.status == "at_least" or g.status == "fewer_than":
        if t_lo is None or g_hi is None or g_hi <= 0:
            return None, None, None, None
        return t_lo / g_hi, ">=", t_lo - g_hi, ">="
    if t_hi is None or g_lo is None or g_lo <= 0:
        return None, None, None, None
    return t_hi / g_lo, "<=", None, None


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


def _cost_change(
    t: TierDecision, g: TierDecision, t_cost: np.ndarray | None, g_cost: np.ndarray | None
) -> tuple[float | None, list[float] | None, Bound | None]:
    """The change of t's cost per million tokens against gpu's (%), its 95 % interval from the paired
    replicates, and its bound. A side priced at its highest level (it never missed) costs at most that:
    against the other side's interval end it bounds the change, or, where no end is known, nothing."""
    a, b = t.cost.per_million_tokens, g.cost.per_million_tokens
    if a is None or b is None or b <= 0:
        return None, None, None
    if t.cost.bound == "=" and g.cost.bound == "=":
        ci = None
        if t_cost is not None and g_cost is not None and len(t_cost) == len(g_cost):
            with np.errstate(divide="ignore", invalid="ignore"):
                ci = _percentiles(100.0 * (t_cost / g_cost - 1.0))
        return 100.0 * (a / b - 1.0), ci, "="
    if t.cost.bound == "<=" and g.cost.bound == "<=":
        return None, None, None
    if t.cost.bound == "<=":  # t costs at most a; g at least its interval's low end
        g_lo = g.cost.per_million_tokens_ci[0] if g.cost.per_million_tokens_ci else None
        return (None, None, None) if g_lo is None else (100.0 * (a / g_lo - 1.0), None, "<=")
    t_lo = t.cost.per_million_tokens_ci[0] if t.cost.per_million_tokens_ci else None
    return (None, None, None) if t_lo is None else (100.0 * (t_lo / b - 1.0), None, ">=")


def _with_gpu(t: TierDecision, g: TierDecision | None, t_draws: _Draws, g_draws: _Draws) -> TierDecision:
    if g is None or t.tier == "gpu":
        return t
    ratio, rbound, extra, ebound = _vs_gpu(t, g)
    ci = None
    if rbound == "=" and t_draws.sessions is not None and g_draws.sessions is not None:
        ci = crossing.ratio_interval(crossing.ratio_draws(t_draws.sessions, g_draws.sessions))
    change, change_ci, change_bound = _cost_change(t, g, t_draws.cost, g_draws.cost)
    done = replace(
        t,
        ratio_vs_gpu=ratio,
        ratio_bound=rbound,
        ratio_ci=ci,
        cost_change_pct=change,
        cost_change_ci_pct=change_ci,
        cost_change_bound=change_bound,
    )
    more = _more_than_gpu(done, g)
    dram = nvme = None
    # GB per extra session only where the extra sessions are told apart from zero
    if more is True and extra is not None and extra > 0:
        tr, gr = t.resources, g.resources
        if tr.dram_gb is not None and gr.dram_gb is not None and tr.dram_gb > gr.dram_gb:
            dram = (tr.dram_gb - gr.dram_gb) / extra
        if tr.nvme_tb is not None and gr.nvme_tb is not None and tr.nvme_tb > gr.nvme_tb:
            nvme = 1000.0 * (tr.nvme_tb - gr.nvme_tb) / extra
    else:
        extra, ebound = None, None
    # more extra sessions (a ">=" bound) means fewer GB per extra session
    per: Bound | None = None if ebound is None else "<=" if ebound == ">=" else "="
    return replace(
        done,
        more_than_gpu=more,
        extra_sessions_vs_gpu=extra,
        dram_gb_per_extra_session=dram,
        nvme_gb_per_extra_session=nvme,
        extra_bound=per,
    )


def _pick(tiers: Sequence[TierDecision]) -> tuple[str | None, str | None]:
    """(pick, why there is none). The simplest tier that surely sustains more sessions than gpu (cpu
    before nvme), unless a more complex one's interval lies wholly above the simpler one's; else gpu
    when every offload tier is surely not better. No pick from decisive levels of one run, nor where
    an offload tier cannot be told apart from gpu."""
    gpu = next((d for d in tiers if d.tier == "gpu" and d.status != "no_data"), None)
    if gpu is None:
        return None, "gpu has no level judged against the target: nothing to compare with"
    judged = [d for d in tiers if d.status != "no_data"]
    thin = [d.tier for d in judged if d.runs < 2]
    if thin:
        return None, (
            f"{', '.join(thin)} rest{'s' if len(thin) == 1 else ''} on one run: the run-to-run noise is not "
            "measured, so no pick (set `repeats: 2` or more)"
        )
    better = [d for d in tiers if d.tier != "gpu" and d.more_than_gpu]
    if better:
        pick = better[0]
        for other in better[1:]:
            a, b = pick.ratio_ci, other.ratio_ci
            if a is not None and b is not None and a[1] is not None and b[0] is not None and b[0] > a[1]:
                pick = other
        return pick.tier, None
    unclear = [d.tier for d in tiers if d.tier != "gpu" and d.status != "no_data" and d.more_than_gpu is None]
    if unclear:
        return None, (
            f"{', '.join(unclear)} cannot be told apart from gpu at the target: more repeats or levels "
            "closer to the crossing would tell"
        )
    return "gpu", None


def _cheapest(tiers: Sequence[TierDecision]) -> str | None:
    """The tier whose cost per million tokens surely lies under every other's: its interval's upper end
    (a "<=" bound's value) below each other tier's interval's lower end. None when no tier separates."""
    spans: dict[str, tuple[float | None, float | None]] = {}
    for d in tiers:
        c = d.cost
        if c.per_million_tokens is None:
            return None
        if c.bound == "<=":
            spans[d.tier] = (None, c.per_million_tokens)
        elif c.per_million_tokens_ci is not None:
            spans[d.tier] = (c.per_million_tokens_ci[0], c.per_million_tokens_ci[1])
        else:
            spans[d.tier] = (None, None)
    if len(spans) < 2:
        return None
    for tier, (_, hi) in spans.items():
        others = [lo for other, (lo, _) in spans.items() if other != tier]
        if hi is not None and all(lo is not None and hi < lo for lo in others):
            return tier
    return None


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


def one_curve(
    mine: pd.DataFrame, cells: pd.DataFrame | None, software: pd.DataFrame | None
) -> tuple[pd.DataFrame, list[str], list[str]]:
    """A tier's rows on one curve, the cells left out, and the nodes the curve pools (empty: one): all rows
    when they ran on one node, or on nodes shown alike (the same host facts, analysis/nodes.py, from
    `cells`, and software); else the node with the most levels (ties: the most cells, then the name),
    the others' cells left out with the difference named (without `cells` the nodes are not shown
    alike)."""
    if "node" not in mine or mine["node"].nunique(dropna=True) < 2:
        return mine, [], []
    ids = mine["cell_id"].astype(str)
    nodes = sorted({str(n) for n in mine["node"].dropna()})
    if cells is None:
        facts: list[dict[str, Any]] = [{"fact": "host facts", "values": dict.fromkeys(nodes, "unknown")}]
    else:
        facts = node_differences(cells[cells["cell_id"].astype(str).isin(ids)])
    splits = pd.DataFrame() if software is None else version_splits(software, ids)
    if not facts and splits.empty:
        return mine, [], nodes
    by_node = {str(n): g for n, g in mine.groupby(mine["node"].astype(str), sort=True)}
    keep = max(
        by_node,
        key=lambda n: (by_node[n]["concurrency"].nunique(), len(by_node[n]), -sorted(by_node).index(n)),
    )
    differ = "; ".join(
        f"{f['fact']}: " + ", ".join(f"{h} {v}" for h, v in f["values"].items()) for f in facts
    )
    if not splits.empty:
        differ = "; ".join(filter(None, [differ, "software versions differ"]))
    left = [
        f"{row['tier']} {row['cell_id']} (concurrency {row['concurrency']}) ran on node {row['node']}, not "
        f"{keep}, and the nodes differ ({differ}): one curve does not mix machines"
        for _, row in mine[mine["node"].astype(str) != keep].iterrows()
    ]
    return by_node[keep], left, []


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
    cells: pd.DataFrame | None = None,
    min_window_requests: int | None = None,
) -> list[SweepDecision]:
    """One decision table per sweep (model, num_rounds, ISL, OSL) of `summary`, tiers gpu, cpu, nvme.
    `requests`: each cell's request records by cell id; `profile_l1` (per tier, GiB) and `l2` (per
    cell, bytes): the capacity inputs of the L1 pool and the L2 store (report/build.py
    `capacity_inputs`); `software` (analysis/software.py `software_frame`) and `cells` (the ingest
    cells table, with each cell.json's host facts): whether a tier's nodes are alike enough to pool
    into one curve, and a sweep whose cells ran other versions says so among its conditions;
    `min_window_requests`: the later-round requests a steady window needs (default: the slo's)."""
    out: list[SweepDecision] = []
    if summary.empty:
        return out
    inp = _Inputs(
        slo,
        slo.limits(),
        prices,
        predictions,
        profile_l1 or {},
        l2 or {},
        replicates,
        min_sessions,
        slo.min_window_requests if min_window_requests is None else min_window_requests,
    )
    target = slo.limits_text()
    for key, rows in summary.groupby(SWEEP_KEYS, sort=False, dropna=False):
        rng = np.random.default_rng(bootstrap.SEED)
        decisions: list[TierDecision] = []
        draws: dict[str, _Draws] = {}
        pooled: dict[str, list[str]] = {}
        for tier in [t for t in TIERS if (rows["tier"] == t).any()]:
            mine, elsewhere, pool = one_curve(rows[rows["tier"] == tier], cells, software)
            if pool:
                pooled.setdefault(", ".join(pool), []).append(tier)
            keep, excluded = [], list(elsewhere)
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
        none = _Draws(None, None)
        decisions = [_with_gpu(d, gpu, draws.get(d.tier, none), draws.get("gpu", none)) for d in decisions]
        pick, no_pick = _pick(decisions)
        cheapest = _cheapest(decisions) if no_pick is None or "one run" not in no_pick else None
        decisions = [
            replace(
                d,
                verdict=decision_words.verdict(d, pick, cheapest),
                sessions_text=decision_words.sessions_text(d),
            )
            for d in decisions
        ]
        gpu = next((d for d in decisions if d.tier == "gpu"), None)
        statements = (
            []
            if gpu is None
            else [decision_words.sentence(d, gpu, target, prices) for d in decisions if d.tier != "gpu"]
        )
        missing = sorted({m for d in decisions for m in d.cost.missing_prices})
        judged = [d.runs for d in decisions if d.status != "no_data"]
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
                conditions=decision_words.conditions(slo, prices, decisions)
                + [
                    f"levels pool nodes {nodes} ({', '.join(tiers)}): the same host facts and software"
                    for nodes, tiers in pooled.items()
                ]
                + _software(software, rows),
                pick=pick,
                missing_prices=missing,
                currency=None if prices is None else prices.currency,
                example_prices=bool(prices is not None and prices.example),
                no_pick=no_pick,
                runs=min(judged) if judged else 0,
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
    "verdict", "missing_prices", "runs", "capped_by", "cost_per_million_tokens_ci_low",
    "cost_per_million_tokens_ci_high", "cost_change_pct", "cost_change_ci_low", "cost_change_ci_high",
    "cost_change_bound", "no_pick",
]  # fmt: skip


def csv_rows(sweeps: Sequence[SweepDecision]) -> pd.DataFrame:
    """The decision as one flat row per sweep and tier (CSV_COLUMNS)."""
    rows = []
    for s in sweeps:
        for d in s.tiers:
            ci: list[Any] = [None, None] if d.sessions_ci is None else list(d.sessions_ci)
            cens: list[Any] = [None, None] if d.sessions_ci_censored is None else list(d.sessions_ci_censored)
            rci: list[Any] = list(d.ratio_ci or [None, None])
            none: list[Any] = [None, None]
            cost_ci: list[Any] = (
                none if d.cost.per_million_tokens_ci is None else list(d.cost.per_million_tokens_ci)
            )
            change_ci: list[Any] = none if d.cost_change_ci_pct is None else list(d.cost_change_ci_pct)
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
                    "runs": d.runs, "capped_by": d.capped_by,
                    "cost_per_million_tokens_ci_low": cost_ci[0],
                    "cost_per_million_tokens_ci_high": cost_ci[1],
                    "cost_change_pct": d.cost_change_pct, "cost_change_ci_low": change_ci[0],
                    "cost_change_ci_high": change_ci[1], "cost_change_bound": d.cost_change_bound,
                    "no_pick": s.no_pick,
                }
            )  # fmt: skip
    return pd.DataFrame(rows, columns=CSV_COLUMNS)
