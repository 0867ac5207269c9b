"""Non-negative least squares with a session bootstrap: the fit behind the cost of each token source.

Sits under kvoffload/analysis/attribution.py, which builds the design (an intercept and the tokens of
each source per request, in 1K) and says what the coefficients mean; this module only fits. Pure numpy:
arrays in, arrays out; no pandas, no IO.

Why constrained: a coefficient here is seconds of TTFT per 1K tokens of one source, and no token makes
a request faster, so a negative value is no cost at all; ordinary least squares gives one whenever the
requests do not pin a small cost down (or something the model leaves out, such as queueing, moves with
that source). The fit is min ||X b - y||^2 subject to b >= 0 (the intercept too: a request of no
tokens still takes no negative time). With at most a handful of columns, it is solved exactly by trying
every set of free coefficients: the least-squares solution on the set that has no negative coefficient
and the lowest residual is the constrained optimum (the optimum solves the normal equations on the
coefficients it leaves above zero, and every other candidate is a feasible point, so none does better).
Everything is computed from the weighted Gram matrix X'WX and X'Wy, so a bootstrap replicate (weights =
how often each request's session was drawn) costs a few k x k solves, batched over replicates.

The interval: the resampling unit is the session (a virtual user within its cell), as in
kvoffload/analysis/bootstrap.py: a replicate draws the cells with replacement, then each drawn cell's
sessions with replacement; the 2.5th and 97.5th percentiles of the replicates' coefficients (95 %).
Alongside, the unconstrained (ordinary least-squares) coefficients and their interval on the same draws,
which say when the data put a coefficient below zero beyond their noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from kvoffload.analysis.bootstrap import CONFIDENCE, MIN_SESSIONS, REPLICATES, SEED

# Replicates evaluated at once (bounds the replicates x requests weight matrix).
_BATCH = 200
# A ridge of this share of the mean diagonal keeps a replicate's Gram matrix invertible where a column
# drew no request with that source (its coefficient then comes out 0); far below any figure's digits.
_RIDGE = 1e-10
# Coefficients below this (seconds per 1K tokens) are zero: the solver's rounding, not a cost.
_ZERO = 1e-12


@dataclass(frozen=True)
class Fit:
    """Coefficients of one fit, in the columns' order. `low`/`high` (constrained) and `free_low`/
    `free_high` (unconstrained) are None below MIN_SESSIONS sessions (no interval)."""

    estimate: np.ndarray
    free_estimate: np.ndarray
    low: np.ndarray | None
    high: np.ndarray | None
    free_low: np.ndarray | None
    free_high: np.ndarray | None
    sessions: int


def _solve(gram: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Batched solve of gram @ b = rhs, shapes (B, s, s) and (B, s), with a tiny ridge."""
    s = gram.shape[-1]
    scale = np.trace(gram, axis1=1, axis2=2) / s
    ridge = _RIDGE * np.where(scale > 0, scale, 1.0)
    solved: np.ndarray = np.linalg.solve(gram + ridge[:, None, None] * np.eye(s), rhs[..., None])[..., 0]
    return solved


def nnls_gram(gram: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(non-negative, unconstrained) least-squares coefficients from X'WX and X'Wy, batched: shapes
    (B, k, k) and (B, k) in, two (B, k) out. Exact for the small k of a cost fit (2^k - 1 solves)."""
    batch, k = rhs.shape
    best = np.zeros((batch, k))
    best_obj = np.zeros(batch)  # the empty set: b = 0, objective b'Gb - 2c'b = 0
    free = np.zeros((batch, k))
    for size in range(1, k + 1):
        for subset in combinations(range(k), size):
            idx = np.array(subset)
            b = _solve(gram[:, idx[:, None], idx[None, :]], rhs[:, idx])
            if size == k:
                free = b
            # At the solution of the normal equations on `subset`, b'Gb - 2c'b = -c'b.
            obj = -np.einsum("bi,bi->b", rhs[:, idx], b)
            better = (b >= -_ZERO).all(axis=1) & (obj < best_obj - 1e-15 * np.abs(best_obj))
            if better.any():
                best[better] = 0.0
                best[np.ix_(better, idx)] = b[better]
                best_obj[better] = obj[better]
    best[best < _ZERO] = 0.0
    return best, free


def _session_counts(
    cell_sessions: Sequence[np.ndarray], n_sessions: int, replicates: int, rng: np.random.Generator
) -> np.ndarray:
    """How often each session is drawn in each replicate, shape (replicates, sessions): cells drawn
    with replacement, then each drawn cell's sessions (`times` draws of m sessions each are one
    multinomial of times * m draws)."""
    n_cells = len(cell_sessions)
    counts = np.zeros((replicates, n_sessions), dtype=np.int64)
    if n_cells == 1:
        drawn = np.ones((replicates, 1), dtype=np.int64)
    else:
        picks = rng.integers(0, n_cells, (replicates, n_cells))
        drawn = np.stack([(picks == c).sum(axis=1) for c in range(n_cells)], axis=1)
    for c, ids in enumerate(cell_sessions):
        m = len(ids)
        counts[:, ids] = rng.multinomial(drawn[:, c] * m, np.full(m, 1.0 / m))
    return counts


def _bounds(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    tail = (100.0 - CONFIDENCE) / 2
    low: np.ndarray = np.percentile(draws, tail, axis=0)
    high: np.ndarray = np.percentile(draws, 100.0 - tail, axis=0)
    return low, high


def fit(
    x: np.ndarray,
    y: np.ndarray,
    session: np.ndarray,
    cell: np.ndarray,
    replicates: int = REPLICATES,
    seed: int = SEED,
    min_sessions: int = MIN_SESSIONS,
) -> Fit:
    """Fit y ~ x (n x k, the intercept a column of x) with b >= 0, and its session bootstrap.
    `session` and `cell`: per request, labels of its session (unique within its cell) and its cell."""
    gram, rhs = (x.T @ x)[None], (x.T @ y)[None]
    est, free = nnls_gram(gram, rhs)
    cells, cell_of = np.unique(cell.astype(str), return_inverse=True)
    keys = np.char.add(np.char.add(cell.astype(str), "\x00"), session.astype(str))
    uniq, session_of = np.unique(keys, return_inverse=True)
    cell_of_session = np.zeros(len(uniq), dtype=np.int64)
    cell_of_session[session_of] = cell_of
    out = Fit(est[0], free[0], None, None, None, None, len(uniq))
    if len(uniq) < min_sessions:
        return out
    cell_sessions = [np.flatnonzero(cell_of_session == c) for c in range(len(cells))]
    rng = np.random.default_rng(seed)
    k = x.shape[1]
    # Per request, its outer product x x' (flattened) and x y: a replicate's Gram matrix and right side
    # are then one matrix product with its weights.
    outer, xy = (x[:, :, None] * x[:, None, :]).reshape(len(x), k * k), x * y[:, None]
    draws, free_draws = [], []
    for start in range(0, replicates, _BATCH):
        n = min(_BATCH, replicates - start)
        w = _session_counts(cell_sessions, len(uniq), n, rng)[:, session_of].astype(float)
        b, f = nnls_gram((w @ outer).reshape(n, k, k), w @ xy)
        draws.append(b)
        free_draws.append(f)
    low, high = _bounds(np.concatenate(draws))
    free_low, free_high = _bounds(np.concatenate(free_draws))
    return Fit(est[0], free[0], low, high, free_low, free_high, len(uniq))
