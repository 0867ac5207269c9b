"""The steady window of a cell (issue 53): where its closed loop held the load, worked out by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from kvoffload.analysis import steady


def _records(sessions: list[tuple[str, float, float, int]]) -> pd.DataFrame:
    """One request per round, each session's rounds back to back: (user, start, end, rounds)."""
    rows = []
    for user, start, end, rounds in sessions:
        step = (end - start) / rounds
        for k in range(rounds):
            rows.append(
                {"user_id": user, "round": k + 1, "status": "ok", "t_start": start + k * step,
                 "latency_s": step,
                 "ttft_s": 0.1 * (k + 1), "tpot_s": 0.01, "prompt_tokens": 100, "cached_tokens": 40}
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_a_closed_loop_holds_its_level_until_the_pool_runs_out() -> None:
    """Six users of 2 s at level 2: a and b 0-2 s, c and d 2-4 s, e and f 4-6 s: two live from 0 to 6 s,
    then none. The window is 0-6 s (three sessions long), 2 held on average, and every request in it."""
    req = _records(
        [(u, s, s + 2, 4) for u, s in [("a", 0), ("b", 0), ("c", 2), ("d", 2), ("e", 4), ("f", 4)]]
    )
    w = steady.window(req, 2, min_requests=18)
    assert (w.start_s, w.end_s, w.seconds) == (0.0, 6.0, 6.0)
    assert w.held_sessions == pytest.approx(2.0) and w.session_s == pytest.approx(2.0)
    assert w.later_requests == 18 and w.held and w.why is None
    assert len(steady.in_window(req, w)) == 24
    # one later-round request short of the minimum: not held, and said so
    assert steady.window(req, 2, min_requests=19).why == (
        "18 later-round requests in the window, fewer than 19"
    )


def test_every_user_at_once_is_only_a_synchronized_start() -> None:
    """Issue 53: at the demo's level 32 with 32 users, all start together and the level lasts until the
    first one finishes. Four users of 3, 4, 5 and 6 s at level 4: held 0-3 s, shorter than the median
    session (4.5 s): not held, and the report names why."""
    req = _records([("a", 0, 3, 3), ("b", 0, 4, 4), ("c", 0, 5, 5), ("d", 0, 6, 6)])
    w = steady.window(req, 4, min_requests=1)
    assert (w.start_s, w.end_s) == (0.0, 3.0) and not w.held
    assert w.why == "held 3 s, shorter than the median session (4.5 s)"
    # the same records never reach a level of 5
    assert steady.window(req, 5).why == "never 5 sessions live (at most 4)"


def test_a_window_that_dips_below_the_level_is_not_held() -> None:
    """Level 3; a 0-10 s, b 0-10 s, c 0-2 s, then nobody replaces c until d 8-10 s: the window is 0-10 s
    (live last falls below 3 at 10 s), 3 live for 4 s and 2 for 6 s: 2.4 on average, under 90 % of 3."""
    req = _records([("a", 0, 10, 5), ("b", 0, 10, 5), ("c", 0, 2, 1), ("d", 8, 10, 1)])
    w = steady.window(req, 3, min_requests=1)
    assert (w.start_s, w.end_s) == (0.0, 10.0)
    assert w.held_sessions == pytest.approx(2.4)
    assert w.why == "2.4 sessions live on average, under 90% of 3"


def test_the_summary_columns_judge_only_the_window() -> None:
    """steady_figures: the later-round p95 over the requests that start in the window only."""
    req = _records(
        [(u, s, s + 2, 4) for u, s in [("a", 0), ("b", 0), ("c", 2), ("d", 2), ("e", 4), ("f", 4)]]
    )
    late = pd.DataFrame(
        [{**req.iloc[-1].to_dict(), "user_id": "g", "t_start": 7.0, "round": 2, "ttft_s": 9.0}]
    )
    got = steady.steady_figures(pd.concat([req, late], ignore_index=True), 2)
    assert got["steady_level"] == 2 and got["steady_s"] == 6.0
    # the window's later rounds take 0.2, 0.3 and 0.4 s (six of each): p95 0.4 s, the 9 s outlier after
    # the window left out; but 18 later requests are fewer than MIN_WINDOW_REQUESTS (40): not held
    assert got["steady_ttft_later_p95_s"] == pytest.approx(0.4)
    assert got["steady_held"] is False and "fewer than 40" in str(got["steady_not_held"])
    assert got["steady_later_cached_share"] == pytest.approx(0.4)
    assert steady.steady_figures(req, None) == dict.fromkeys(steady.STEADY_COLUMNS)
