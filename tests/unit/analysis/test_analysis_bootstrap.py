"""Bootstrap CIs of later-round TTFT, worked out by hand on tiny request sets."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvoffload.analysis.bootstrap import MIN_SESSIONS, _weighted_percentile, change_pct, later_percentile


def _requests(later: dict[str, list[float]], first: float = 9.0) -> pd.DataFrame:
    """One round-1 request (TTFT `first`, never counted) plus the given later-round TTFTs per user."""
    rows = []
    for user, ttfts in later.items():
        rows.append({"user_id": user, "round": 1, "status": "ok", "ttft_s": first})
        for k, t in enumerate(ttfts, start=2):
            rows.append({"user_id": user, "round": k, "status": "ok", "ttft_s": t})
    rows.append({"user_id": "x", "round": 2, "status": "error", "ttft_s": 100.0})  # failed: ignored
    return pd.DataFrame(rows)


def test_weighted_percentile_equals_numpy_on_repeated_values() -> None:
    values = np.array([0.1, 0.2, 0.5, 0.9])
    weights = np.array([[1, 2, 0, 3], [4, 0, 1, 1]])
    for q in (50, 95):
        for row in range(2):
            expanded = np.repeat(values, weights[row])
            assert _weighted_percentile(values, weights[row : row + 1], q)[0] == pytest.approx(
                np.percentile(expanded, q)
            )


def test_identical_sessions_give_a_zero_width_interval() -> None:
    # Every session has later TTFTs 0.2 and 0.4: any resample has the same median, 0.3.
    cell = _requests({f"u{i}": [0.2, 0.4] for i in range(5)})
    ci = later_percentile([cell], 50, replicates=200, min_sessions=1)
    assert ci.estimate == pytest.approx(0.3)
    assert (ci.low, ci.high) == (pytest.approx(0.3), pytest.approx(0.3))
    assert ci.sessions == 5 and ci.cells == 1


def test_change_interval_by_hand() -> None:
    """gpu: one session at 1.0 s. cpu: two sessions, 0.4 s and 0.6 s.

    Resampling the two cpu sessions gives medians 0.4 (p = 1/4), 0.5 (1/2) and 0.6 (1/4), so the change
    against 1.0 s is -60, -50 or -40 %; the 95 % interval spans the extremes, the estimate is -50 %.
    """
    gpu = _requests({"g": [1.0]})
    cpu = _requests({"a": [0.4], "b": [0.6]})
    ci = change_pct([cpu], [gpu], 50, replicates=2000, min_sessions=1)
    assert ci.estimate == pytest.approx(-50.0)
    assert ci.low == pytest.approx(-60.0) and ci.high == pytest.approx(-40.0)


def test_sessions_not_requests_are_resampled() -> None:
    """Session a has three later requests at 0.1, session b one at 0.9. A request-level bootstrap could
    draw a median of 0.9 only rarely; a session-level one draws {b, b} a quarter of the time, so the
    97.5th percentile of the medians is 0.9."""
    cell = _requests({"a": [0.1, 0.1, 0.1], "b": [0.9]})
    ci = later_percentile([cell], 50, replicates=2000, min_sessions=1)
    assert ci.estimate == pytest.approx(0.1)
    assert ci.low == pytest.approx(0.1) and ci.high == pytest.approx(0.9)


def test_repeats_are_resampled_as_cells() -> None:
    """Two repeats with constant TTFTs 0.2 and 0.4: drawing cells gives {r1, r1} (median 0.2),
    {r1, r2} (0.3) or {r2, r2} (0.4), whatever the sessions drawn within them."""
    r1 = _requests({f"a{i}": [0.2] for i in range(3)})
    r2 = _requests({f"b{i}": [0.4] for i in range(3)})
    ci = later_percentile([r1, r2], 50, replicates=2000, min_sessions=1)
    assert ci.cells == 2 and ci.sessions == 6
    assert ci.estimate == pytest.approx(0.3)
    assert ci.low == pytest.approx(0.2) and ci.high == pytest.approx(0.4)


def test_no_later_rounds_gives_no_interval() -> None:
    cell = pd.DataFrame([{"user_id": "u", "round": 1, "status": "ok", "ttft_s": 0.5}])
    assert later_percentile([cell], 50).estimate is None
    assert change_pct([cell], [cell], 50).as_list() is None


def test_below_the_session_floor_there_is_an_estimate_but_no_interval() -> None:
    """One gpu session used to give an interval whose base side had no variance at all."""
    few = _requests({f"u{i}": [0.2 + 0.01 * i] for i in range(MIN_SESSIONS - 1)})
    enough = _requests({f"v{i}": [0.4 + 0.01 * i] for i in range(MIN_SESSIONS)})
    one = _requests({"g": [1.0]})
    p50 = later_percentile([few], 50, replicates=200)
    assert p50.estimate == pytest.approx(0.24) and p50.as_list() is None and p50.too_few_sessions
    assert later_percentile([enough], 50, replicates=200).as_list() is not None
    change = change_pct([enough], [one], 50, replicates=200)
    assert change.estimate == pytest.approx(100 * (0.445 / 1.0 - 1))
    assert change.as_list() is None and change.too_few_sessions
    assert (change.sessions, change.base_sessions) == (MIN_SESSIONS, 1)
    assert change_pct([enough], [enough], 50, replicates=200).as_list() is not None
