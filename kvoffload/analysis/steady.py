"""A cell's steady window: the span in which its replay held the load it was asked for.

Pure (numpy and pandas, no IO); docs/metrics.md "Steady window" defines every figure here. Used by
kvoffload/analysis/summary.py (the per-cell `steady_*` columns the knee search judges) and
kvoffload/analysis/crossing.py (the decision's levels), so both judge a level on the same requests.

The replay is a closed loop: `concurrency` virtual users run at once and a finished one is replaced
by the next user of the pool, until the pool is empty; then the live users drain. A session (virtual
user, `user_id`) is live from its first request's start to its last request's end (recorded think and
tool gaps included). With L the sessions asked for (`level`), the window opens when the live sessions
first reach L (warm-up over) and closes when they last fall below L (drain begins). A request belongs
to the window when it starts inside it. The window *held* the level when:
- it lasts at least one median session (every slot turned over once: a window shorter than a session
  is only the synchronized start, whose users all sit in the same round),
- the time-weighted mean of the live sessions in it is at least HELD_SHARE x L,
- it holds at least MIN_WINDOW_REQUESTS later-round (round >= 2) ok requests.
A level that was not held is named with the first rule it broke and is not judged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvoffload.config.slo import MIN_WINDOW_REQUESTS

__all__ = ["HELD_SHARE", "MIN_WINDOW_REQUESTS", "STEADY_COLUMNS", "Held", "Window", "not_held", "window"]

# Share of the level the live sessions must average over the window (a closed loop dips below it only
# for the instant between a user finishing and the next one starting).
HELD_SHARE = 0.9


@dataclass(frozen=True)
class Window:
    """The steady window of one cell (times in seconds from its first request)."""

    level: int
    start_s: float | None
    end_s: float | None
    held_sessions: float | None
    session_s: float | None
    later_requests: int
    held: bool
    why: str | None

    @property
    def seconds(self) -> float:
        if self.start_s is None or self.end_s is None:
            return 0.0
        return self.end_s - self.start_s


def _spans(requests: pd.DataFrame) -> pd.DataFrame:
    """Per session: first start and last end (a request without a latency ends where it starts)."""
    end = requests["t_start"] + pd.to_numeric(requests["latency_s"], errors="coerce").fillna(0.0)
    frame = pd.DataFrame({"user": requests["user_id"].astype(str), "start": requests["t_start"], "end": end})
    return frame.groupby("user", sort=False).agg(start=("start", "min"), end=("end", "max"))


def live_steps(spans: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The live-session count as a step function: event times (sorted) and the count from each time
    on. An end and a start at the same instant count the end first (the slot was free)."""
    times = np.concatenate([spans["start"].to_numpy(float), spans["end"].to_numpy(float)])
    delta = np.concatenate([np.ones(len(spans)), -np.ones(len(spans))])
    order = np.lexsort((delta, times))
    return times[order], np.cumsum(delta[order])


def window(requests: pd.DataFrame, level: int, min_requests: int = MIN_WINDOW_REQUESTS) -> Window:
    """The steady window of one cell's request records at `level` sessions (module docstring);
    `min_requests`: the later-round requests a held window needs."""
    if requests.empty or level < 1:
        return Window(level, None, None, None, None, 0, False, "no requests")
    spans = _spans(requests)
    t0 = float(spans["start"].min())
    times, live = live_steps(spans)
    at = np.flatnonzero(live >= level)
    session_s = float((spans["end"] - spans["start"]).median())
    if not len(at):
        top = int(live.max()) if len(live) else 0
        return Window(
            level, None, None, None, session_s, 0, False, f"never {level} sessions live (at most {top})"
        )
    opened = int(at[0])
    closed = int(at[-1]) + 1  # the event after the last one at the level: the drain's first step
    start = float(times[opened])
    end = float(times[closed]) if closed < len(times) else start
    span = end - start
    if span > 0:
        steps = np.diff(times[opened : closed + 1])
        held_sessions = float(np.sum(live[opened:closed] * steps) / span)
    else:
        held_sessions = float(level)
    inside = requests[(requests["t_start"] >= start) & (requests["t_start"] <= end)]
    later = int(((inside["status"] == "ok") & (inside["round"] >= 2)).sum())
    why = not_held(level, span, held_sessions, session_s, later, min_requests)
    return Window(level, start - t0, end - t0, held_sessions, session_s, later, why is None, why)


def not_held(
    level: int, seconds: float, held_sessions: float, session_s: float, later: int, min_requests: int
) -> str | None:
    """The first rule of a held window (module docstring) that a window broke; None when it held."""
    if seconds < session_s:
        return f"held {seconds:.3g} s, shorter than the median session ({session_s:.3g} s)"
    if held_sessions < HELD_SHARE * level:
        return f"{held_sessions:.3g} sessions live on average, under {HELD_SHARE:.0%} of {level}"
    if later < min_requests:
        return f"{later} later-round requests in the window, fewer than {min_requests}"
    return None


@dataclass(frozen=True)
class Held:
    """A cell that held its level: its window and the records that start inside it."""

    window: Window
    records: pd.DataFrame


def in_window(requests: pd.DataFrame, w: Window) -> pd.DataFrame:
    """The records that start inside the window (all of them when it has no bounds)."""
    if requests.empty or w.start_s is None or w.end_s is None:
        return requests.iloc[0:0]
    t0 = float(requests["t_start"].min())
    t = requests["t_start"] - t0
    return requests[(t >= w.start_s) & (t <= w.end_s)]


# The per-cell summary columns of the steady window (docs/metrics.md "Steady window").
STEADY_COLUMNS = (
    "steady_level",
    "steady_start_s",
    "steady_s",
    "steady_held_sessions",
    "steady_session_s",
    "steady_later_requests",
    "steady_held",
    "steady_not_held",
    "steady_ttft_later_p95_s",
    "steady_ttft_later_p50_s",
    "steady_tpot_later_p95_s",
    "steady_later_cached_share",
)


def _pct(values: pd.Series, q: float) -> float | None:
    v = pd.to_numeric(values, errors="coerce").dropna().to_numpy(dtype=float)
    return float(np.percentile(v, q)) if len(v) else None


def later_figures(requests: pd.DataFrame) -> dict[str, float | None]:
    """The later-round (round >= 2, ok) figures the latency target judges, of some records: p95 and p50
    TTFT, p95 TPOT, and the hit rate (cached / prompt tokens of the requests that report both)."""
    later = (
        requests[(requests["status"] == "ok") & (requests["round"] >= 2)] if not requests.empty else requests
    )
    if later.empty:
        return {"ttft_p95": None, "ttft_p50": None, "tpot_p95": None, "hit_rate": None}
    hit = None
    if "cached_tokens" in later and "prompt_tokens" in later:
        both = later[later["cached_tokens"].notna() & later["prompt_tokens"].notna()]
        prompt = float(both["prompt_tokens"].sum())
        hit = float(both["cached_tokens"].sum()) / prompt if prompt > 0 else None
    return {
        "ttft_p95": _pct(later["ttft_s"], 95),
        "ttft_p50": _pct(later["ttft_s"], 50),
        "tpot_p95": _pct(later["tpot_s"], 95) if "tpot_s" in later else None,
        "hit_rate": hit,
    }


def steady_figures(requests: pd.DataFrame, level: float | None) -> dict[str, object]:
    """The STEADY_COLUMNS of one cell at `level` sessions (None or NaN: unknown, every column null)."""
    if level is None or pd.isna(level) or requests.empty:
        return dict.fromkeys(STEADY_COLUMNS)
    w = window(requests, int(level))
    f = later_figures(in_window(requests, w))
    return {
        "steady_level": w.level,
        "steady_start_s": w.start_s,
        "steady_s": w.seconds if w.start_s is not None else None,
        "steady_held_sessions": w.held_sessions,
        "steady_session_s": w.session_s,
        "steady_later_requests": w.later_requests,
        "steady_held": w.held,
        "steady_not_held": w.why,
        "steady_ttft_later_p95_s": f["ttft_p95"],
        "steady_ttft_later_p50_s": f["ttft_p50"],
        "steady_tpot_later_p95_s": f["tpot_p95"],
        "steady_later_cached_share": f["hit_rate"],
    }
