"""Bootstrap confidence intervals of later-round TTFT percentiles and of their change between tiers.

Pure: request records in, numbers out; seeded, so a report is the same every time it is built.
The resampling unit is the session (virtual user, `user_id`), never the request: the rounds of one
session share its history and its replica, so they are not independent. Within one cell, each bootstrap
replicate draws the cell's sessions with replacement and takes the percentile of the later-round (round
>= 2) ok TTFTs of the sessions drawn, every copy of a session counting all its requests. With several
cells of one configuration (`repeats` > 1), a replicate first draws the cells with replacement, then
sessions within each drawn cell, and pools the requests. A change between two tiers is
100 * (stat(tier) / stat(base) - 1), both sides resampled independently (the cells of two tiers are
separate runs). Intervals are the 2.5th and 97.5th percentiles of the replicates (95 %).
No interval is given below MIN_SESSIONS sessions on a side (the estimate still is): with few sessions
the replicates take a handful of distinct values and the percentile interval is far too narrow (one
session gives a zero-width interval); docs/metrics.md "Validity rules" says why 10.
Percentiles interpolate linearly, like `numpy.percentile` and kvoffload/analysis/client.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

REPLICATES = 2000
SEED = 20261201
CONFIDENCE = 95.0
# Fewest sessions (per side of a change) for an interval; see the module docstring.
MIN_SESSIONS = 10
# Replicates evaluated at once (bounds the B x requests weight matrix).
_BATCH = 200


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval (None where there is nothing to resample)."""

    estimate: float | None
    low: float | None
    high: float | None
    sessions: int
    cells: int
    # Sessions of the base side of a change (None for a single percentile).
    base_sessions: int | None = None

    @property
    def too_few_sessions(self) -> bool:
        """True when an estimate exists but a side has fewer than MIN_SESSIONS sessions."""
        sides = [self.sessions] + ([] if self.base_sessions is None else [self.base_sessions])
        return self.estimate is not None and self.low is None and min(sides) < MIN_SESSIONS

    def as_list(self) -> list[float] | None:
        """[low, high], or None."""
        return None if self.low is None or self.high is None else [self.low, self.high]


@dataclass(frozen=True)
class _Cells:
    """Later-round TTFTs of some cells, sorted, with each request's session and each session's cell."""

    values: np.ndarray  # sorted TTFTs
    session_of: np.ndarray  # session index of each value
    cell_sessions: list[np.ndarray]  # per cell: the global indices of its sessions

    @property
    def sessions(self) -> int:
        return sum(len(s) for s in self.cell_sessions)


def _prepare(cells: Sequence[pd.DataFrame]) -> _Cells:
    values, owners, cell_sessions = [], [], []
    offset = 0
    for requests in cells:
        later = requests[(requests["status"] == "ok") & (requests["round"] >= 2) & requests["ttft_s"].notna()]
        if later.empty:
            continue
        codes, uniques = pd.factorize(later["user_id"], sort=True)
        values.append(later["ttft_s"].to_numpy(dtype=float))
        owners.append(codes + offset)
        cell_sessions.append(np.arange(offset, offset + len(uniques)))
        offset += len(uniques)
    if not values:
        return _Cells(np.array([]), np.array([], dtype=int), [])
    v, o = np.concatenate(values), np.concatenate(owners)
    order = np.argsort(v, kind="stable")
    return _Cells(v[order], o[order], cell_sessions)


def _session_counts(c: _Cells, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """How often each session is drawn in each replicate: shape (replicates, sessions)."""
    n_cells = len(c.cell_sessions)
    if n_cells == 1:
        n = c.sessions
        counts: np.ndarray = rng.multinomial(n, np.full(n, 1.0 / n), size=replicates)
        return counts
    counts = np.zeros((replicates, c.sessions), dtype=np.int64)
    for b in range(replicates):
        drawn = np.bincount(rng.integers(0, n_cells, n_cells), minlength=n_cells)
        for k, times in enumerate(drawn):
            if times:
                ids = c.cell_sessions[k]
                # `times` draws of len(ids) sessions each == one multinomial of times * len(ids) draws.
                counts[b, ids] += rng.multinomial(int(times) * len(ids), np.full(len(ids), 1.0 / len(ids)))
    return counts


def _weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of `weights` (copies of each sorted value): the linear-interpolation percentile q."""
    cum = np.cumsum(weights, axis=1)
    total = cum[:, -1]
    pos = (total - 1) * q / 100.0
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, total - 1)
    frac = pos - lo
    # The value of rank r (0-based) sits at the first index whose cumulative count exceeds r.
    v_lo = values[(cum <= lo[:, None]).sum(axis=1)]
    v_hi = values[(cum <= hi[:, None]).sum(axis=1)]
    result: np.ndarray = v_lo + frac * (v_hi - v_lo)
    return result


def _replicates(c: _Cells, q: float, replicates: int, rng: np.random.Generator) -> np.ndarray:
    out = []
    for start in range(0, replicates, _BATCH):
        n = min(_BATCH, replicates - start)
        counts = _session_counts(c, n, rng)
        out.append(_weighted_percentile(c.values, counts[:, c.session_of], q))
    return np.concatenate(out)


def _estimate(c: _Cells, q: float) -> float:
    return float(np.percentile(c.values, q))


def _bounds(draws: np.ndarray) -> tuple[float, float]:
    tail = (100.0 - CONFIDENCE) / 2
    return float(np.percentile(draws, tail)), float(np.percentile(draws, 100.0 - tail))


def later_percentile(
    cells: Sequence[pd.DataFrame],
    q: float,
    replicates: int = REPLICATES,
    seed: int = SEED,
    min_sessions: int = MIN_SESSIONS,
) -> Interval:
    """Percentile q of later-round ok TTFTs (seconds) over `cells` (one frame of requests per cell);
    no interval below `min_sessions` sessions."""
    c = _prepare(cells)
    if not len(c.values):
        return Interval(None, None, None, 0, 0)
    if c.sessions < min_sessions:
        return Interval(_estimate(c, q), None, None, c.sessions, len(c.cell_sessions))
    rng = np.random.default_rng(seed)
    low, high = _bounds(_replicates(c, q, replicates, rng))
    return Interval(_estimate(c, q), low, high, c.sessions, len(c.cell_sessions))


def change_pct(
    cells: Sequence[pd.DataFrame],
    base_cells: Sequence[pd.DataFrame],
    q: float,
    replicates: int = REPLICATES,
    seed: int = SEED,
    min_sessions: int = MIN_SESSIONS,
) -> Interval:
    """Change (%) of the later-round TTFT percentile q of `cells` against `base_cells`; no interval
    when either side has fewer than `min_sessions` sessions."""
    c, b = _prepare(cells), _prepare(base_cells)
    if not len(c.values) or not len(b.values) or _estimate(b, q) <= 0:
        return Interval(None, None, None, c.sessions, len(c.cell_sessions), b.sessions)
    estimate = 100.0 * (_estimate(c, q) / _estimate(b, q) - 1.0)
    if min(c.sessions, b.sessions) < min_sessions:
        return Interval(estimate, None, None, c.sessions, len(c.cell_sessions), b.sessions)
    rng = np.random.default_rng(seed)
    mine = _replicates(c, q, replicates, rng)
    base = _replicates(b, q, replicates, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = 100.0 * (mine / base - 1.0)
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return Interval(estimate, None, None, c.sessions, len(c.cell_sessions), b.sessions)
    low, high = _bounds(draws)
    return Interval(estimate, low, high, c.sessions, len(c.cell_sessions), b.sessions)


# --- public resampling helpers (issue 42): kvoffload/analysis/decision.py resamples several figures of
# the same sessions at once (TTFT, TPOT, hit rate), so it takes the draws, not an interval.
def session_counts(cell_sizes: Sequence[int], replicates: int, rng: np.random.Generator) -> np.ndarray:
    """How often each session is drawn in each replicate (shape replicates x sessions), the sessions
    numbered cell after cell (`cell_sizes`: sessions per cell): cells first when there are several,
    then sessions within each drawn cell, as every interval of this module."""
    ids, offset = [], 0
    for n in cell_sizes:
        ids.append(np.arange(offset, offset + n))
        offset += n
    return _session_counts(_Cells(np.array([]), np.array([], dtype=int), ids), replicates, rng)


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of `weights` (copies of each of the sorted `values`; every row's total above 0): the
    linear-interpolation percentile q, as `numpy.percentile` of the expanded values."""
    return _weighted_percentile(values, weights, q)
