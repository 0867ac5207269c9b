"""Counter and gauge arithmetic over the `samples` table of one cell (Prometheus semantics, no IO).

Conventions used by every figure:
- A series is one (target, labels) pair of one metric name.
- Counter resets (a value lower than the previous one: a restarted process) are corrected the way
  Prometheus does: the new value counts as the increase since the reset.
- `delta()` (totals and means over the whole run) uses the before/after snapshots when both exist and
  otherwise the first and last sampler rounds; a series present only after is taken to start at 0.
- `windowed_rate()` is Prometheus `rate()` without extrapolation: at each grid time t the increase of
  each series over its samples in (t - window, t] divided by their time span, summed over series.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

RUN, BEFORE, AFTER = "run", "before", "after"
WINDOW_S = 300.0
STEP_S = 15.0


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


def _snapshot_delta(rows: pd.DataFrame, snapshot_starts: pd.Series) -> Delta | None:
    """Before/after difference; a series absent from a target's before snapshot started at 0 (labelled
    counters appear at their first increment), provided that target's before snapshot exists."""
    before = rows[rows["phase"] == BEFORE]
    after = rows[rows["phase"] == AFTER]
    after = after[after["target"].isin(snapshot_starts.index) | after["target"].isin(before["target"])]
    if after.empty:
        return None
    keys = ["target", "labels"]
    b = before.groupby(keys)["value"].sum()
    a = after.groupby(keys)["value"].sum()
    b = b.reindex(a.index).fillna(0.0)
    inc = np.where(a.to_numpy() >= b.to_numpy(), a.to_numpy() - b.to_numpy(), a.to_numpy())
    start = before["ts"].min() if not before.empty else snapshot_starts[after["target"].unique()].min()
    seconds = float(after["ts"].max() - start)
    return Delta(float(inc.sum()), seconds, "snapshots")


def _run_delta(rows: pd.DataFrame) -> Delta | None:
    run = rows[(rows["phase"] == RUN) & rows["value"].notna()]
    total = 0.0
    t0, t1 = math.inf, -math.inf
    found = False
    for _, g in run.groupby(["target", "labels"], sort=False):
        if len(g) < 2:
            continue
        g = g.sort_values("ts", kind="stable")
        c = corrected(g["value"].to_numpy(dtype=float))
        total += float(c[-1] - c[0])
        t0, t1 = min(t0, float(g["ts"].iloc[0])), max(t1, float(g["ts"].iloc[-1]))
        found = True
    return Delta(total, t1 - t0, "samples") if found else None


def delta(samples: pd.DataFrame, name: str | None) -> Delta | None:
    """Increase of counter `name` over the run (see module doc); None when there is no data."""
    if name is None:
        return None
    rows = samples[samples["name"] == name]
    if rows.empty:
        return None
    before = samples[samples["phase"] == BEFORE]
    starts = before.groupby("target")["ts"].min()
    return _snapshot_delta(rows, starts) or _run_delta(rows)


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


def gauge_over_time(samples: pd.DataFrame, name: str | None, t0: float, step_s: float = STEP_S) -> pd.Series:
    """Mean over series per sampler round (bucketed by step), indexed by seconds since t0."""
    rows = gauge_values(samples, name)
    if rows.empty:
        return pd.Series(dtype=float)
    bucket = np.round((rows["ts"].to_numpy(dtype=float) - t0) / step_s) * step_s
    return rows.groupby(bucket)["value"].mean()
