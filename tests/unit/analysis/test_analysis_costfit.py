"""The non-negative least-squares fit and its session bootstrap, worked by hand on tiny designs."""

from __future__ import annotations

import numpy as np
import pytest

from kvoffload.analysis import costfit


def _gram(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (x.T @ x)[None], (x.T @ y)[None]


def test_a_negative_slope_is_held_at_zero_and_the_base_refitted() -> None:
    # y = 3 - z exactly: ordinary least squares gives base 3, slope -1; with b >= 0 the slope stays at 0
    # and the base is the mean of y, 1.5 (KKT: the slope's gradient, sum z (1.5 - y) = sum z (z - 1.5)
    # = 0 - .5 + 1 + 4.5 = 5, is positive at the bound).
    z = np.array([0.0, 1.0, 2.0, 3.0])
    x = np.column_stack([np.ones(4), z])
    constrained, free = costfit.nnls_gram(*_gram(x, 3.0 - z))
    assert free[0] == pytest.approx([3.0, -1.0])
    assert constrained[0] == pytest.approx([1.5, 0.0])


def test_a_negative_base_is_held_at_zero_and_the_slope_refitted() -> None:
    # y = -1 + 2 z at z = 1, 2, 3: ordinary base -1; with b >= 0 the line goes through the origin,
    # slope sum(z y) / sum(z^2) = (1 + 6 + 15) / 14.
    z = np.array([1.0, 2.0, 3.0])
    x = np.column_stack([np.ones(3), z])
    constrained, free = costfit.nnls_gram(*_gram(x, -1.0 + 2.0 * z))
    assert free[0] == pytest.approx([-1.0, 2.0])
    assert constrained[0] == pytest.approx([0.0, 22.0 / 14.0])


def test_positive_coefficients_are_the_ordinary_ones() -> None:
    z = np.array([1.0, 2.0, 3.0, 5.0])
    x = np.column_stack([np.ones(4), z, z**2])
    y = 0.5 + 0.25 * z + 0.125 * z**2
    constrained, free = costfit.nnls_gram(*_gram(x, y))
    assert constrained[0] == pytest.approx([0.5, 0.25, 0.125]) and free[0] == pytest.approx(constrained[0])


def test_the_interval_resamples_sessions_and_needs_enough_of_them() -> None:
    # 30 requests of 15 sessions (two each) in 3 cells of 10 requests: y = .01 + .04 z +- .005.
    z = np.tile([1.0, 2.0, 3.0], 10)
    y = 0.01 + 0.04 * z + np.where(np.arange(30) % 2 == 0, 0.005, -0.005)
    x = np.column_stack([np.ones(30), z])
    session, cell = np.arange(30) // 2, np.arange(30) // 10
    fit = costfit.fit(x, y, session, cell, replicates=400)
    assert fit.sessions == 15
    # a session is a user within its cell: one user name in three cells is three sessions
    assert costfit.fit(x, y, np.zeros(30), cell, replicates=10, min_sessions=99).sessions == 3
    assert fit.low is not None and fit.high is not None
    assert fit.low[1] < fit.estimate[1] < fit.high[1] and fit.low[1] > 0
    again = costfit.fit(x, y, session, cell, replicates=400)
    assert again.low is not None and list(again.low) == list(fit.low)  # seeded: the same every time
    # the same requests as 3 sessions of one cell: too few for an interval, the estimate stands
    few = costfit.fit(x, y, session % 3, np.zeros(30), replicates=400)
    assert few.sessions == 3 and few.low is None and few.estimate[1] == pytest.approx(fit.estimate[1])


def test_each_replicate_draws_every_cell_slot_and_its_sessions() -> None:
    rng = np.random.default_rng(1)
    cells = [np.array([0, 1, 2]), np.array([3, 4])]
    counts = costfit._session_counts(cells, 5, 50, rng)
    # two cells drawn with replacement, each drawn cell's sessions drawn in full: 3 or 2 sessions per
    # draw, so a replicate holds 4 (two of the small cell), 5 or 6 (two of the large one) session draws
    assert set(counts.sum(axis=1)) <= {4, 5, 6} and len(set(counts.sum(axis=1))) > 1
    one = costfit._session_counts([np.arange(4)], 4, 50, rng)
    assert (one.sum(axis=1) == 4).all()
