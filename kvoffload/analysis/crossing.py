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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from kvoffload.analysis import bootstrap
from kvoffload.analysis.capacity import live_sessions
from kvoffload.config.slo import Slo

# crossing: bracketed by two measured levels; at_least: never missed; fewer_than: always missed.
Status = Literal["crossing", "at_least", "fewer_than", "no_data"]
# How a figure relates to the truth: "=" an estimate, ">=" / "<=" a bound the data give.
Bound = Literal["=", ">=", "<="]
# Percent of the replicates in each tail of a 95 % interval.
_TAIL = (100.0 - bootstrap.CONFIDENCE) / 2
# Replicates evaluated at once (bounds the replicates x requests weight matrix).
_BATCH = 200


@dataclass(frozen=True)
class Limit:
    """One limit of the target: a later-round figure and its threshold."""

    key: str  # ttft_p95 | ttft_p50 | tpot_p95 | hit_rate
    threshold: float
    upper: bool  # True: a figure above the threshold misses; False: one below it
    words: str

    def margin(self, figure: np.ndarray) -> np.ndarray:
        """Above 0: missed; the distance to the threshold in the figure's own unit."""
        out: np.ndarray = figure - self.threshold if self.upper else self.threshold - figure
        return out

    def text(self, value: float) -> str:
        if self.key == "hit_rate":
            return f"{self.words} {100 * value:.0f} % < {100 * self.threshold:g} %"
        scale, unit = (1000.0, "ms") if self.key == "tpot_p95" else (1.0, "s")
        return f"{self.words} {scale * value:.3g} {unit} > {scale * self.threshold:g} {unit}"


def limits(slo: Slo) -> list[Limit]:
    """The limits `slo` sets, p95 TTFT first."""
    out = [Limit("ttft_p95", slo.ttft_p95_s, True, "p95 TTFT")]
    if slo.ttft_p50_s is not None:
        out.append(Limit("ttft_p50", slo.ttft_p50_s, True, "p50 TTFT"))
    if slo.tpot_p95_s is not None:
        out.append(Limit("tpot_p95", slo.tpot_p95_s, True, "p95 TPOT"))
    if slo.min_later_hit_rate is not None:
        out.append(Limit("hit_rate", slo.min_later_hit_rate, False, "hit rate"))
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
    """One measured level of a tier's sweep: its later-round figures and whether they meet the target."""

    sessions_at_once: int
    concurrencies: list[int]
    cells: list[str]
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


@dataclass(frozen=True)
class Ramp:
    """Where a tier's levels cross the target, before the interval."""

    status: Status
    low: Level | None
    high: Level | None
    bound: int | None
    non_monotone: list[int]


def levels(
    rows: pd.DataFrame, requests: Mapping[str, pd.DataFrame], lims: Sequence[Limit]
) -> tuple[list[Level], dict[int, Sample]]:
    """A tier's levels (its valid cells grouped by the sessions live at once), each judged against
    `lims`, and their later-round samples by level."""
    live = live_sessions(rows)
    levels: list[Level] = []
    samples: dict[int, Sample] = {}
    for x, g in rows.groupby(live.round().astype("Int64"), sort=True):
        level = int(x)
        cells = sorted(g["cell_id"].astype(str))
        s = sample([requests.get(c, pd.DataFrame()) for c in cells])
        est = estimates(s, ["ttft_p95", "ttft_p50", "tpot_p95", "hit_rate"])
        missed, unknown = [], []
        for lim in lims:
            v = est[lim.key]
            if v is None:
                unknown.append(lim.words)
            elif float(lim.margin(np.array([v]))[0]) > 0:
                missed.append(lim.text(v))
        meets = None if unknown else not missed
        samples[level] = s
        levels.append(
            Level(
                sessions_at_once=level,
                concurrencies=sorted({int(c) for c in g["concurrency"]}),
                cells=cells,
                sessions=s.sessions,
                ttft_p95_s=est["ttft_p95"],
                ttft_p50_s=est["ttft_p50"],
                tpot_p95_s=est["tpot_p95"],
                hit_rate=est["hit_rate"],
                meets=meets,
                missed=missed,
                unknown=unknown,
            )
        )
    return levels, samples


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
        g0, g1 = lim.margin(low[lim.key]), lim.margin(high[lim.key])
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


def interval(draws: np.ndarray, low: float, high: float) -> tuple[list[float], list[bool]] | None:
    """The 95 % percentile interval of crossing replicates, a replicate below (above) the bracket
    counted at its low (high) end; an end that falls among those is a bound. None when more than the
    tails' share of the replicates is unknown."""
    known = draws[~np.isnan(draws)]
    if len(known) < len(draws) * (1 - 2 * _TAIL / 100):
        return None
    clipped = np.clip(known, low, high)
    lo, hi = np.percentile(clipped, _TAIL), np.percentile(clipped, 100 - _TAIL)
    below = float(np.mean(known == -np.inf)) * 100
    above = float(np.mean(known == np.inf)) * 100
    return [float(lo), float(hi)], [below > _TAIL, above > _TAIL]


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
