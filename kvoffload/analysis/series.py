"""Counter and gauge arithmetic over the `samples` table of one cell (Prometheus semantics, no IO).

Conventions used by every figure:
- A series is one (target, labels) pair of one metric name.
- Counter resets (a value lower than the previous one: a restarted process) are corrected the way
  Prometheus does: the new value counts as the increase since the reset.
- `delta()` (totals and means over the whole run) takes each series from its start (the before
  snapshot) through its sampler rounds to its end (the after snapshot), correcting resets on the way, so
  a replica restarted inside the cell counts what it did before and after the restart. A target with no
  before snapshot starts at its first sampler round, one with no after snapshot ends at its last; a
  target with neither a snapshot nor samples on one side makes the figure None (never a sum without
  it), and so does a reset seen in the snapshots with no samples to correct it. A series absent from its
  target's before snapshot started at 0 (labelled counters appear at their first increment), unless
  the snapshot file was cut short (`collect_notes(before_cut=True)`) and the series is already there at
  the target's first sampler round: then that round is its start.
- Every such fallback or None leaves a note (kind, message naming the metric and target) in the
  collector opened by `collect_notes()`; the summary turns them into warnings (docs/metrics.md "Null
  rules"). Without an open collector the notes are dropped.
- `windowed_rate()` is Prometheus `rate()` without extrapolation: at each grid time t the increase of
  each series over its samples in (t - window, t] divided by their time span, summed over series. The
  grid's step is the sampler's own interval (`grid_step`: the median gap between a target's rounds, at
  most STEP_S): a fixed 15 s step over a replay of 14 s sampled every 2 s had one grid point with one
  round in its window, so no rate at all, an empty plot and a snapshot figure said to come from a run
  "shorter than one sampling interval" (issue 43).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import pandas as pd

RUN, BEFORE, AFTER = "run", "before", "after"
WINDOW_S = 300.0
# The methodology's sampling interval, and the coarsest grid step (campaign `sample_interval_s` default).
STEP_S = 15.0
# The finest grid step: a sampler faster than this still gets a grid of whole seconds.
MIN_STEP_S = 1.0
# Sampler rounds of one target closer than this are one round (the sampler scrapes targets in turn).
_SAME_ROUND_S = STEP_S / 2


@dataclass(frozen=True)
class Note:
    """Why a figure fell back or is None: `kind` (a warning kind) and a message naming metric and target."""

    kind: str
    message: str


_NOTES: ContextVar[list[Note] | None] = ContextVar("kvoffload_analysis_notes", default=None)
_BEFORE_CUT: ContextVar[bool] = ContextVar("kvoffload_before_snapshot_cut", default=False)


@contextmanager
def collect_notes(before_cut: bool = False) -> Iterator[list[Note]]:
    """Collect the notes of the figures computed inside the block (deduplicated, in order).

    `before_cut`: the cell's before-snapshot file ends mid-line (ingest kept the lines before it), so a
    series absent from it may have been cut off rather than born during the run (module doc).
    """
    notes: list[Note] = []
    token, cut = _NOTES.set(notes), _BEFORE_CUT.set(before_cut)
    try:
        yield notes
    finally:
        _NOTES.reset(token)
        _BEFORE_CUT.reset(cut)


def note(kind: str, message: str) -> None:
    """Add a note to the open collector (once); no-op without one."""
    notes = _NOTES.get()
    if notes is not None and Note(kind, message) not in notes:
        notes.append(Note(kind, message))


@dataclass(frozen=True)
class Delta:
    """Increase of a counter (summed over series) over `seconds`; source is 'snapshots' or 'samples'."""

    increase: float
    seconds: float
    source: str

    @property
    def per_second(self) -> float | None:
        return self.increase / self.seconds if self.seconds > 0 else None


def label_filter(df: pd.DataFrame, **labels: str) -> pd.DataFrame:
    """Rows whose labels include every key=value given (exact match on the canonical JSON text)."""
    mask = pd.Series(True, index=df.index)
    for key, value in labels.items():
        mask &= df["labels"].str.contains(f"{json.dumps(key)}:{json.dumps(value)}", regex=False)
    return df[mask]


def labels_of(text: str) -> dict[str, str]:
    """Parse one canonical labels string."""
    parsed: dict[str, str] = json.loads(text)
    return parsed


def metric(samples: pd.DataFrame, name: str, phase: str | None = None) -> pd.DataFrame:
    """Rows of one metric name (and phase when given), sorted by time."""
    rows = samples[samples["name"] == name]
    if phase is not None:
        rows = rows[rows["phase"] == phase]
    return rows.sort_values("ts", kind="stable")


def corrected(values: np.ndarray) -> np.ndarray:
    """Cumulative counter values with resets removed (monotone non-decreasing)."""
    if len(values) == 0:
        return values
    diffs = np.diff(values)
    inc = np.where(diffs >= 0, diffs, values[1:])
    return np.concatenate([[values[0]], values[0] + np.cumsum(inc)])


@dataclass(frozen=True)
class _Series:
    """One series of one counter as arrays sorted by time: phase, ts, value (NaN values dropped)."""

    phase: np.ndarray
    ts: np.ndarray
    value: np.ndarray

    def part(self, phase: str) -> tuple[np.ndarray, np.ndarray]:
        mask = self.phase == phase
        return self.ts[mask], self.value[mask]


def _series_delta(
    name: str,
    target: str,
    series: _Series,
    before_ts: float | None,
    has_after: bool,
    first_round: float | None,
) -> tuple[float, float, float, bool] | str:
    """(increase, start ts, end ts, both ends from snapshots) of one series, or why it is unknown."""
    b_ts, b_val = series.part(BEFORE)
    a_ts, a_val = series.part(AFTER)
    r_ts, r_val = series.part(RUN)
    ts: list[float] = []
    values: list[float] = []
    snapshots = True  # both ends from the snapshots (a series born during the run starts at one)
    if len(b_ts):
        ts.append(float(b_ts[-1]))
        values.append(float(b_val[-1]))
    elif before_ts is not None and (
        not _BEFORE_CUT.get()
        or not len(r_ts)
        or first_round is None
        or float(r_ts[0]) - first_round > _SAME_ROUND_S
    ):
        # born during the run: labelled counters appear at their first increment
        ts.append(before_ts)
        values.append(0.0)
    elif len(r_ts):
        snapshots = False
        if before_ts is not None:
            note(
                "snapshot_incomplete",
                f"{name} on {target}: absent from the before snapshot but sampled from the first round "
                "(snapshot cut short): counted from that round",
            )
        else:
            note(
                "before_snapshot_missing",
                f"{target}: no before snapshot; its counters count from its first sampler round",
            )
    else:
        return f"{target}: no before snapshot and no sampler rounds, so {name} has no start"
    ts += r_ts.tolist()
    values += r_val.tolist()
    if len(a_ts):
        ts.append(float(a_ts[-1]))
        values.append(float(a_val[-1]))
    elif has_after and len(r_ts):
        snapshots = False  # the series vanished from the after snapshot: its last round is its end
    elif len(r_ts):
        snapshots = False
        note(
            "after_snapshot_missing",
            f"{target}: no after snapshot; its counters count to its last sampler round",
        )
    elif not len(b_ts):
        return f"{target}: {name} has neither samples nor an after snapshot"
    else:
        return f"{target}: no after snapshot and no sampler rounds, so {name} has no end"
    arr = np.asarray(values, dtype=float)
    if len(arr) < 2:
        return f"{target}: {name} was seen once only"
    if bool((np.diff(arr) < 0).any()):
        if not len(r_ts):
            return (
                f"{target}: {name} went down between the before and after snapshots (a restart) and "
                "no sampler round can correct it"
            )
        note(
            "counter_reset",
            f"{target}: {name} was reset inside the cell (a restart); increase corrected from the "
            f"{STEP_S:.0f} s sampler rounds",
        )
    c = corrected(arr)
    return float(c[-1] - c[0]), min(ts), max(ts), snapshots


def delta(samples: pd.DataFrame, name: str | None) -> Delta | None:
    """Increase of counter `name` over the run (see module doc); None when there is no data, or when
    some series of it cannot be counted (with a note naming the target)."""
    if name is None:
        return None
    rows = samples[(samples["name"] == name) & samples["value"].notna()]
    if rows.empty:
        return None
    # per target and phase: the first time (which targets have a before/after snapshot, first round)
    firsts = samples.groupby(["target", "phase"], sort=False)["ts"].min()
    firsts_map = {
        (str(t), str(p)): float(v)
        for (t, p), v in zip(firsts.index.tolist(), firsts.to_numpy(dtype=float), strict=True)
    }
    rows = rows.sort_values("ts", kind="stable")
    total, t0, t1 = 0.0, math.inf, -math.inf
    all_snapshots = True
    for (target, _), g in rows.groupby(["target", "labels"], sort=False):
        tgt = str(target)
        series = _Series(
            g["phase"].to_numpy(dtype=object), g["ts"].to_numpy(dtype=float), g["value"].to_numpy(dtype=float)
        )
        got = _series_delta(
            name,
            tgt,
            series,
            firsts_map.get((tgt, BEFORE)),
            (tgt, AFTER) in firsts_map,
            firsts_map.get((tgt, RUN)),
        )
        if isinstance(got, str):
            note("counter_unknown", f"{got}: figures from {name} are null")
            return None
        inc, start, end, snapshots = got
        total += inc
        t0, t1 = min(t0, start), max(t1, end)
        all_snapshots &= snapshots
    if not math.isfinite(t0) or t1 < t0:
        return None
    return Delta(total, t1 - t0, "snapshots" if all_snapshots else "samples")


def cut_short(rows: pd.DataFrame, name: str, window: tuple[float, float] | None) -> bool:
    """Whether some target's sampler rounds of `rows` stop more than two sampling intervals before the
    replay `window` ends (its metrics file was cut short): then a figure over the rounds would cover
    another span than the replay's, and it is None; notes the target. False without a window."""
    if window is None or window[1] - window[0] < 2 * STEP_S:
        return False
    run = rows[(rows["phase"] == RUN) & rows["value"].notna()]
    last = run.groupby("target")["ts"].max()
    for target, ts in last.items():
        if float(ts) < window[1] - 2 * STEP_S:
            note(
                "samples_cut",
                f"{target}: its sampler rounds of {name} stop {window[1] - float(ts):.0f} s before the "
                f"replay ends (metrics/{target}.jsonl cut short?): figures over the rounds are null",
            )
            return True
    return False


def sampler_interval(samples: pd.DataFrame) -> float | None:
    """The sampler's interval in this cell: the median gap between consecutive run rounds of a target
    (one scrape stamps all its samples with one time), over every target; None below two rounds."""
    rounds = samples.loc[samples["phase"] == RUN, ["target", "ts"]].drop_duplicates()
    if len(rounds) < 2:
        return None
    rounds = rounds.sort_values(["target", "ts"], kind="stable")
    gaps = rounds.groupby("target", sort=False)["ts"].diff().dropna().to_numpy(dtype=float)
    gaps = gaps[gaps > 0]
    return float(np.median(gaps)) if len(gaps) else None


def grid_step(samples: pd.DataFrame) -> float:
    """Step of the windowed-rate grid: the sampler's interval between MIN_STEP_S and STEP_S; STEP_S
    when it cannot be told (fewer than two rounds)."""
    interval = sampler_interval(samples)
    return STEP_S if interval is None else min(STEP_S, max(MIN_STEP_S, interval))


def make_grid(t0: float, t1: float, step_s: float = STEP_S) -> np.ndarray:
    """Evaluation times t0, t0 + step, ... up to t1 (inclusive within a millisecond)."""
    if t1 < t0:
        return np.array([], dtype=float)
    return t0 + step_s * np.arange(math.floor((t1 - t0) / step_s + 1e-6) + 1)


def windowed_rate(
    samples: pd.DataFrame, name: str | None, grid: np.ndarray, window_s: float = WINDOW_S
) -> pd.Series:
    """Sum over series of the per-second increase in (t - window, t] at each grid time; NaN if none."""
    out = np.full(len(grid), np.nan)
    if name is None:
        return pd.Series(out, index=grid)
    run = samples[(samples["name"] == name) & (samples["phase"] == RUN) & samples["value"].notna()]
    for _, g in run.groupby(["target", "labels"], sort=False):
        g = g.sort_values("ts", kind="stable")
        ts = g["ts"].to_numpy(dtype=float)
        c = corrected(g["value"].to_numpy(dtype=float))
        lo = np.searchsorted(ts, grid - window_s, side="right")
        hi = np.searchsorted(ts, grid, side="right") - 1
        ok = hi > lo
        lo_c, hi_c = np.clip(lo, 0, len(ts) - 1), np.clip(hi, 0, len(ts) - 1)
        span = ts[hi_c] - ts[lo_c]
        ok &= span > 0
        rate = np.where(ok, (c[hi_c] - c[lo_c]) / np.where(span > 0, span, 1.0), np.nan)
        out = np.where(np.isnan(out), rate, np.where(np.isnan(rate), out, out + rate))
    return pd.Series(out, index=grid)


def final_quarter_mean(series: pd.Series) -> float | None:
    """Mean of the non-NaN values in the last quarter (ceil) of the grid; None when there are none."""
    n = len(series)
    if n == 0:
        return None
    tail = series.iloc[n - math.ceil(n / 4) :].dropna()
    return float(tail.mean()) if len(tail) else None


def run_span(samples: pd.DataFrame) -> tuple[float, float] | None:
    """First and last sampler time of the cell (any target), or None without run samples."""
    run = samples[samples["phase"] == RUN]
    if run.empty:
        return None
    return float(run["ts"].min()), float(run["ts"].max())


def gauge_values(samples: pd.DataFrame, name: str | None, phase: str = RUN) -> pd.DataFrame:
    """Non-null samples of a gauge in one phase, sorted by time."""
    if name is None:
        return samples.iloc[0:0]
    rows = metric(samples, name, phase)
    return rows[rows["value"].notna()]


def gauge_over_time(
    samples: pd.DataFrame,
    name: str | None,
    t0: float,
    step_s: float = STEP_S,
    window: tuple[float, float] | None = None,
) -> pd.Series:
    """The largest value over series (replicas) per sampler round, rounds bucketed by `step_s` and
    indexed by seconds since t0; with `window` (start, end) only the rounds in (start, end].

    The max, not the mean over replicas: its peak is the summary's max over the same samples (a gauge
    such as KV usage, whose table figure is the fullest replica's), and a mean over replicas or over
    15 s of 2 s rounds drew a plot that peaked at 34 % where the table said 86.1 % (issue 43)."""
    rows = gauge_values(samples, name)
    if window is not None:
        rows = rows[(rows["ts"] > window[0]) & (rows["ts"] <= window[1])]
    if rows.empty:
        return pd.Series(dtype=float)
    bucket = np.round((rows["ts"].to_numpy(dtype=float) - t0) / step_s) * step_s
    return rows.groupby(bucket)["value"].max()
