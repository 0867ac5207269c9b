"""Where a tier's sweep crosses a latency target: its levels, the crossing and its bootstrap.

Pure (numpy and pandas, no IO), the arithmetic of kvoffload/analysis/decision.py; docs/metrics.md
"Decision" defines every figure. A *level* is the sessions live at once (`capacity.live_sessions`: the
requested concurrency, never more than the users the cell could replay), its cells pooled; its
later-round (rounds >= 2) figures meet the target when every limit of the campaign's `slo` holds. The
crossing lies between the largest level that meets the target below the smallest that misses it and
that smallest missing level: the linear interpolation of each missed limit's figure against the level,
the smallest of them. Its interval resamples sessions (bootstrap.session_counts: cells first with
repeats, then sessions) at both levels independently and recomputes the crossing per replicate; a
replicate whose lower level misses too lies below the bracket (-inf), one whose upper level meets
above it (+inf), and an interval end that falls among those is only a bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Literal

import numpy as np
import pandas as pd

from kvoffload.analysis import bootstrap, steady
from kvoffload.analysis.capacity import live_sessions
from kvoffload.config.slo import Limit, judge

# crossing: bracketed by two measured levels; at_least: never missed; fewer_than: always missed.
Status = Literal["crossing", "at_least", "fewer_than", "no_data"]
# How a figure relates to the truth: "=" an estimate, ">=" / "<=" a bound the data give.
Bound = Literal["=", ">=", "<="]
# Percent of the replicates in each tail of a 95 % interval.
_TAIL = (100.0 - bootstrap.CONFIDENCE) / 2
# Replicates evaluated at once (bounds the replicates x requests weight matrix).
_BATCH = 200


def margin(lim: Limit, figure: np.ndarray) -> np.ndarray:
    """Above 0: the figure missed the limit; the distance to the threshold in the figure's own unit."""
    out: np.ndarray = figure - lim.threshold if lim.upper else lim.threshold - figure
    return out


@dataclass(frozen=True)
class Sample:
    """Later-round ok requests of a level's cells: per request its session (numbered cell after cell)
    and its figures (NaN where the record has none)."""

    session_of: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    cached: np.ndarray
    prompt: np.ndarray
    cell_sizes: list[int]

    @property
    def sessions(self) -> int:
        return sum(self.cell_sizes)


def column(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A column as floats, NaN where missing (all NaN when the frame lacks it)."""
    if name not in frame:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)


def sample(cells: Sequence[pd.DataFrame]) -> Sample:
    """The later-round (round >= 2) ok requests of some cells' records, sessions numbered per cell."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("session", "ttft", "tpot", "cached", "prompt")}
    sizes: list[int] = []
    offset = 0
    for requests in cells:
        if requests.empty:
            continue
        later = requests[(requests["status"] == "ok") & (requests["round"] >= 2)]
        if later.empty:
            continue
        codes, users = pd.factorize(later["user_id"], sort=True)
        parts["session"].append(codes + offset)
        for key, name in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("cached", "cached_tokens")):
            parts[key].append(column(later, name))
        parts["prompt"].append(column(later, "prompt_tokens"))
        sizes.append(len(users))
        offset += len(users)
    if not sizes:
        empty = np.array([])
        return Sample(np.array([], dtype=int), empty, empty, empty, empty, [])
    joined = {k: np.concatenate(v) for k, v in parts.items()}
    return Sample(
        joined["session"].astype(int),
        joined["ttft"],
        joined["tpot"],
        joined["cached"],
        joined["prompt"],
        sizes,
    )


def percentile(values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of `weights` (over all requests): percentile q of the known `values`; NaN for a row that
    weighs none of them."""
    known = ~np.isnan(values)
    out = np.full(weights.shape[0], np.nan)
    if not known.any():
        return out
    order = np.argsort(values[known], kind="stable")
    v = values[known][order]
    w = weights[:, known][:, order]
    rows = w.sum(axis=1) > 0
    if rows.any():
        out[rows] = bootstrap.weighted_percentile(v, w[rows], q)
    return out


def figures(s: Sample, weights: np.ndarray, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """The limits' figures per row of `weights` (copies of each request)."""
    out: dict[str, np.ndarray] = {}
    for key in keys:
        if key == "ttft_p95":
            out[key] = percentile(s.ttft, weights, 95)
        elif key == "ttft_p50":
            out[key] = percentile(s.ttft, weights, 50)
        elif key == "tpot_p95":
            out[key] = percentile(s.tpot, weights, 95)
        else:  # hit rate: cached / prompt tokens of the requests that report both
            both = ~np.isnan(s.cached) & ~np.isnan(s.prompt)
            cached = (weights[:, both] * s.cached[both]).sum(axis=1)
            prompt = (weights[:, both] * s.prompt[both]).sum(axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                out[key] = np.where(prompt > 0, cached / np.where(prompt > 0, prompt, 1.0), np.nan)
    return out


def estimates(s: Sample, keys: Sequence[str]) -> dict[str, float | None]:
    """The figures of the level itself (every request once); None where unknown."""
    if not s.sessions:
        return dict.fromkeys(keys)
    got = figures(s, np.ones((1, len(s.ttft))), keys)
    return {k: None if np.isnan(v[0]) else float(v[0]) for k, v in got.items()}


def draws(s: Sample, keys: Sequence[str], replicates: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The figures of `replicates` session resamples of a level (bootstrap.session_counts)."""
    chunks: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    for start in range(0, replicates, _BATCH):
        n = min(_BATCH, replicates - start)
        counts = bootstrap.session_counts(s.cell_sizes, n, rng)
        for k, v in figures(s, counts[:, s.session_of], keys).items():
            chunks[k].append(v)
    return {k: np.concatenate(v) for k, v in chunks.items()}


@dataclass(frozen=True)
class Level:
    """One measured level of a tier's sweep: its later-round figures over the steady windows of its
    cells that held it, and whether they meet the target (config/slo.py `judge`)."""

    sessions_at_once: int
    concurrencies: list[int]
    cells: list[str]  # the cells whose window held the level (its figures' cells)
    sessions: int
    ttft_p95_s: float | None
    ttft_p50_s: float | None
    tpot_p95_s: float | None
    hit_rate: float | None
    meets: bool | None
    missed: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    # the 95 % bootstrap interval of ttft_p95_s (bootstrap.later_percentile; None below its sessions)
    ttft_p95_ci_s: list[float] | None = None
    # runs (repeats) pooled: the held cells
    runs: int = 0
    # the load actually held: the time-weighted mean of live sessions over the windows, and the mean
    # window length (s), over the held cells
    held_sessions: float | None = None
    window_s: float | None = None
    # per cell that did not hold the level: "cell <id>: <why>" (analysis/steady.py)
    not_held: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Ramp:
    """Where a tier's levels cross the target, before the interval."""

    status: Status
    low: Level | None
    high: Level | None
    bound: int | None
    non_monotone: list[int]


def levels(
    rows: pd.DataFrame,
    requests: Mapping[str, pd.DataFrame],
    lims: Sequence[Limit],
    min_window_requests: int = steady.MIN_WINDOW_REQUESTS,
) -> tuple[list[Level], dict[int, Sample], dict[str, steady.Held]]:
    """A tier's levels (its valid cells grouped by the sessions live at once), each judged against
    `lims` on the requests of its cells' steady windows (analysis/steady.py); their later-round samples
    by level; and each held cell's window and in-window records by cell id (what goodput and the
    level's interval use)."""
    live = live_sessions(rows)
    out: list[Level] = []
    samples: dict[int, Sample] = {}
    inside: dict[str, steady.Held] = {}
    for x, g in rows.groupby(live.round().astype("Int64"), sort=True):
        level = int(x)
        held, not_held, loads, seconds = [], [], [], []
        for cell in sorted(g["cell_id"].astype(str)):
            records = requests.get(cell, pd.DataFrame())
            w = steady.window(records, level, min_window_requests) if not records.empty else None
            if w is None or not w.held:
                not_held.append(f"cell {cell}: {'no requests' if w is None else w.why}")
                continue
            held.append(cell)
            inside[cell] = steady.Held(w, steady.in_window(records, w))
            loads.append(w.held_sessions)
            seconds.append(w.seconds)
        s = sample([inside[c].records for c in held])
        est = estimates(s, ["ttft_p95", "ttft_p50", "tpot_p95", "hit_rate"])
        why = None if held else "; ".join(not_held)
        verdict = judge(lims, est, not_held=why)
        samples[level] = s
        out.append(
            Level(
                sessions_at_once=level,
                concurrencies=sorted({int(c) for c in g["concurrency"]}),
                cells=held,
                sessions=s.sessions,
                ttft_p95_s=est["ttft_p95"],
                ttft_p50_s=est["ttft_p50"],
                tpot_p95_s=est["tpot_p95"],
                hit_rate=est["hit_rate"],
                meets=verdict.meets,
                missed=verdict.missed,
                unknown=verdict.unknown,
                runs=len(held),
                held_sessions=float(np.mean([v for v in loads if v is not None])) if loads else None,
                window_s=float(np.mean(seconds)) if seconds else None,
                not_held=not_held,
                nodes=sorted({str(n) for n in g["node"].dropna()}) if "node" in g else [],
            )
        )
    return out, samples, inside


def ramp(levels: Sequence[Level]) -> Ramp:
    """Where the judged levels cross the target: the first miss from below and the level under it."""
    judged = [lv for lv in levels if lv.meets is not None]
    if not judged:
        return Ramp("no_data", None, None, None, [])
    missing = [lv for lv in judged if not lv.meets]
    if not missing:
        top = max(judged, key=lambda lv: lv.sessions_at_once)
        return Ramp("at_least", top, None, top.sessions_at_once, [])
    high = min(missing, key=lambda lv: lv.sessions_at_once)
    below = [lv for lv in judged if lv.meets and lv.sessions_at_once < high.sessions_at_once]
    again = sorted(
        lv.sessions_at_once for lv in judged if lv.meets and lv.sessions_at_once > high.sessions_at_once
    )
    if not below:
        return Ramp("fewer_than", None, high, high.sessions_at_once, again)
    low = max(below, key=lambda lv: lv.sessions_at_once)
    return Ramp("crossing", low, high, None, again)


def cross(
    lims: Sequence[Limit], low: Mapping[str, np.ndarray], high: Mapping[str, np.ndarray], x0: float, x1: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per replicate: the crossing between levels x0 (low) and x1 (high), -inf where the low level
    misses too (the crossing lies below the bracket), +inf where the high level meets (above it), NaN
    where a figure is unknown; and the index of the limit that binds (-1 where none)."""
    n = len(next(iter(low.values())))
    best = np.full(n, np.inf)
    which = np.full(n, -1)
    below = np.zeros(n, dtype=bool)
    unknown = np.zeros(n, dtype=bool)
    for i, lim in enumerate(lims):
        g0, g1 = margin(lim, low[lim.key]), margin(lim, high[lim.key])
        unknown |= np.isnan(g0) | np.isnan(g1)
        below |= g0 > 0
        crosses = (g0 <= 0) & (g1 > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = x0 + (-g0) / (g1 - g0) * (x1 - x0)
        take = crosses & (x < best)
        best = np.where(take, x, best)
        which = np.where(take, i, which)
    best = np.where(below, -np.inf, best)
    best = np.where(unknown, np.nan, best)
    return best, which


def few_runs_widened(draws: np.ndarray, estimate: float, runs: int) -> np.ndarray:
    """Crossing replicates spread about the estimate by sqrt(R / (R - 1)) for R runs (R >= 2): drawing R
    runs with replacement gives their mean a variance of (R - 1) / R of what a new set of R runs would
    (half of it with two runs), so the run-to-run part of the interval is too narrow by that much; the
    factor restores it (and widens the session part with it, erring wide). Infinite and unknown
    replicates, and R < 2 (no run-to-run noise to restore), are left as they are."""
    if runs < 2:
        return draws
    scale = math.sqrt(runs / (runs - 1))
    finite = np.isfinite(draws)
    out = draws.copy()
    out[finite] = estimate + scale * (draws[finite] - estimate)
    return out


def bias_corrected_tails(draws: np.ndarray, estimate: float) -> tuple[float, float]:
    """The percentiles (0-100) of a 95 % bias-corrected (BC) bootstrap interval (Efron 1987): with z0 =
    Phi^-1(the share of replicates below the estimate, ties counted half), the ends are at Phi(2 z0 -/+
    z_0.975). A p95 resampled from few sessions lies below the p95 of the whole more often than above
    it (a resample repeats sessions and leaves the slowest out a third of the time), so the plain
    percentile interval of a crossing sits to one side of its estimate; BC moves it back. z0 = 0 gives
    the plain 2.5-97.5 percentiles."""
    n = len(draws)
    share = (float(np.sum(draws < estimate)) + 0.5 * float(np.sum(draws == estimate))) / n
    share = min(max(share, 1.0 / (n + 1)), n / (n + 1.0))
    normal = NormalDist()
    z0, z = normal.inv_cdf(share), normal.inv_cdf(1 - _TAIL / 100)
    return 100 * normal.cdf(2 * z0 - z), 100 * normal.cdf(2 * z0 + z)


def interval(
    draws: np.ndarray, low: float, high: float, estimate: float | None = None
) -> tuple[list[float], list[bool]] | None:
    """The 95 % interval of crossing replicates: bias-corrected (`bias_corrected_tails`) around
    `estimate` when it is given, else the percentile interval; a replicate below (above) the bracket
    counts at its low (high) end, and an end that falls among those is a bound. None when more than
    the tails' share of the replicates is unknown."""
    known = draws[~np.isnan(draws)]
    if not len(known) or len(known) < len(draws) * (1 - 2 * _TAIL / 100):
        return None
    q_lo, q_hi = (_TAIL, 100 - _TAIL) if estimate is None else bias_corrected_tails(known, estimate)
    clipped = np.clip(known, low, high)
    lo, hi = np.percentile(clipped, q_lo), np.percentile(clipped, q_hi)
    below = float(np.mean(known == -np.inf)) * 100
    above = float(np.mean(known == np.inf)) * 100
    return [float(lo), float(hi)], [below > q_lo, above > 100 - q_hi]


_LEVEL_FIGURE = {
    "ttft_p95": "ttft_p95_s",
    "ttft_p50": "ttft_p50_s",
    "tpot_p95": "tpot_p95_s",
    "hit_rate": "hit_rate",
}


def at_level(level: Level, lims: Sequence[Limit]) -> dict[str, np.ndarray]:
    """A level's own figures in the shape `cross` takes (one replicate)."""
    return {lim.key: np.array([getattr(level, _LEVEL_FIGURE[lim.key])], dtype=float) for lim in lims}


def ratio_draws(t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Per replicate t / g; a crossing below (above) its bracket makes the ratio -inf (+inf) in the
    direction it pushes, NaN where the two push both ways."""
    down = (t == -np.inf) | (g == np.inf)
    up = (t == np.inf) | (g == -np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = t / g
    out = np.where(down, -np.inf, out)
    out = np.where(up, np.inf, out)
    out = np.where(down & up, np.nan, out)
    out = np.where(np.isnan(t) | np.isnan(g), np.nan, out)
    return out


def ratio_interval(draws: np.ndarray) -> list[float | None] | None:
    """The 95 % interval of ratio replicates; an end that falls among the infinite ones is open (None).
    None when more than the tails' share is unknown."""
    known = draws[~np.isnan(draws)]
    if not len(known) or len(known) < len(draws) * (1 - 2 * _TAIL / 100):
        return None
    finite = known[np.isfinite(known)]
    if not len(finite):
        return None
    clipped = np.clip(known, finite.min(), finite.max())
    lo, hi = float(np.percentile(clipped, _TAIL)), float(np.percentile(clipped, 100 - _TAIL))
    below, above = float(np.mean(known == -np.inf)) * 100, float(np.mean(known == np.inf)) * 100
    return [None if below > _TAIL else lo, None if above > _TAIL else hi]
