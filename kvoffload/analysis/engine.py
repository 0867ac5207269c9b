"""vLLM engine figures of one cell from its samples: hit rates, prefill/queue time, KV usage.

- Local / external hit rate: windowed rate ratio (300 s window, a step of the sampler's interval, at
  most 15 s: series.grid_step) of hits over queries, summed over replicas; the figure is the mean of the
  final quarter of that series, and the plot draws that series. When no window holds two sampler rounds
  with traffic between them (a replay shorter than one sampling interval), the before/after increase
  ratio.
- Mean prefill / queue / inter-token time: increase of `_sum` over increase of `_count` of the vLLM
  histogram (before/after snapshots); None, never 0, when the histogram is absent or saw no request.
- KV usage: mean (and max) of the gauge samples in the replay window in percent (the gauge is a 0..1
  fraction): sampler rounds after the first request was sent and up to the end of the last one, so
  rounds before traffic do not pull the mean down; without a sampler round in the window (a run shorter
  than one sample), the mean of the before and after snapshot values. No replay window (no request
  record): None. The plot draws the fullest replica at each sampler round of the same window
  (`engine_series`), so its peak is the table's max.
- Where prompt tokens came from (increase over the run, summed over replicas): GPU prefix cache share =
  local hits / prefix-cache queries (queries = every prompt token vLLM scheduled), LMCache share =
  external hits / the same queries; the rest was computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvoffload.analysis import names as N
from kvoffload.analysis.series import (
    AFTER,
    BEFORE,
    WINDOW_S,
    cut_short,
    delta,
    final_quarter_mean,
    gauge_over_time,
    gauge_values,
    grid_step,
    make_grid,
    run_span,
    windowed_rate,
)


@dataclass(frozen=True)
class Ratio:
    """A hit-rate figure, where it came from, and its time series (index: seconds since run start)."""

    value: float | None
    source: str | None
    series: pd.Series = field(default_factory=lambda: pd.Series(dtype=float))


def rate_ratio(
    samples: pd.DataFrame,
    num_candidates: Sequence[str],
    den_candidates: Sequence[str],
    window_s: float = WINDOW_S,
    step_s: float | None = None,
    replay: tuple[float, float] | None = None,
) -> Ratio:
    """Steady-state ratio of two counters' windowed rates, with the before/after fallback; None when
    the sampler rounds stop well before the `replay` window (start, end) does (series.cut_short).
    The grid's step is `step_s`, by default the sampler's interval (series.grid_step)."""
    present = samples["name"].unique()
    num, den = N.resolve(present, num_candidates), N.resolve(present, den_candidates)
    if num is None or den is None:
        return Ratio(None, None)
    pair = samples[samples["name"].isin([num, den])]
    if cut_short(pair, num, replay):
        return Ratio(None, None)
    span = run_span(pair)
    series = pd.Series(dtype=float)
    if span is not None:
        grid = make_grid(span[0], span[1], grid_step(pair) if step_s is None else step_s)
        r_num = windowed_rate(samples, num, grid, window_s).to_numpy()
        r_den = windowed_rate(samples, den, grid, window_s).to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(r_den > 0, r_num / np.where(r_den > 0, r_den, 1.0), np.nan)
        series = pd.Series(ratio, index=grid - span[0])
        value = final_quarter_mean(series)
        if value is not None:
            return Ratio(value, "samples", series)
    d_num, d_den = delta(samples, num), delta(samples, den)
    if d_num is None or d_den is None or d_den.increase <= 0:
        return Ratio(None, None, series)
    return Ratio(d_num.increase / d_den.increase, d_num.source, series)


def histogram_mean(samples: pd.DataFrame, bases: Sequence[str]) -> float | None:
    """Mean observation over the run: increase(_sum) / increase(_count); None if absent or no events."""
    base = N.resolve_histogram(samples["name"].unique(), bases)
    if base is None:
        return None
    d_sum, d_count = delta(samples, f"{base}_sum"), delta(samples, f"{base}_count")
    if d_sum is None or d_count is None or d_count.increase <= 0:
        return None
    return d_sum.increase / d_count.increase


def gauge_stats(
    samples: pd.DataFrame,
    candidates: Sequence[str],
    scale: float = 1.0,
    window: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Mean and max of a gauge over the run (scaled), with the snapshot fallback; keys mean/max/source.

    With `window` (start, end), only the samples in (start, end]: the replay window.
    """
    name = N.resolve(samples["name"].unique(), candidates)
    run = gauge_values(samples, name)
    if name is not None and cut_short(run, name, window):
        return {"mean": None, "max": None, "source": None}
    if window is not None:
        run = run[(run["ts"] > window[0]) & (run["ts"] <= window[1])]
    if not run.empty:
        v = run["value"].to_numpy(dtype=float) * scale
        return {"mean": float(v.mean()), "max": float(v.max()), "source": "samples"}
    snaps = pd.concat([gauge_values(samples, name, BEFORE), gauge_values(samples, name, AFTER)])
    if not snaps.empty:
        v = snaps["value"].to_numpy(dtype=float) * scale
        return {"mean": float(v.mean()), "max": float(v.max()), "source": "snapshots"}
    return {"mean": None, "max": None, "source": None}


def increase(samples: pd.DataFrame, candidates: Sequence[str]) -> float | None:
    """Increase of the first present candidate counter over the run, or None."""
    d = delta(samples, N.resolve(samples["name"].unique(), candidates))
    return d.increase if d is not None else None


def engine_figures(samples: pd.DataFrame, window: tuple[float, float] | None = None) -> dict[str, Any]:
    """All vLLM figures of one cell as a flat dict (None where the data is absent); KV usage over the
    replay `window` (start, end) when given, else over every sampler round."""
    local = rate_ratio(samples, N.VLLM_PREFIX_HITS, N.VLLM_PREFIX_QUERIES, replay=window)
    external = rate_ratio(samples, N.VLLM_EXT_HITS, N.VLLM_EXT_QUERIES, replay=window)
    kv = gauge_stats(samples, N.VLLM_KV_USAGE, scale=100.0, window=window)
    queries, local_hits = increase(samples, N.VLLM_PREFIX_QUERIES), increase(samples, N.VLLM_PREFIX_HITS)
    external_hits = increase(samples, N.VLLM_EXT_HITS)

    def share(part: float | None) -> float | None:
        return part / queries if part is not None and queries else None

    return {
        "local_hit_rate": local.value,
        "local_hit_rate_source": local.source,
        "external_hit_rate": external.value,
        "external_hit_rate_source": external.source,
        "external_hit_tokens": external_hits,
        "prefix_query_tokens": queries,
        "local_hit_tokens": local_hits,
        "gpu_prefix_token_share": share(local_hits),
        "lmcache_token_share": share(external_hits),
        "prefill_mean_s": histogram_mean(samples, N.VLLM_PREFILL_TIME),
        "queue_mean_s": histogram_mean(samples, N.VLLM_QUEUE_TIME),
        "itl_mean_s": histogram_mean(samples, N.VLLM_ITL),
        "kv_usage_mean_pct": kv["mean"],
        "kv_usage_max_pct": kv["max"],
        "kv_usage_source": kv["source"],
        "preemptions": increase(samples, N.VLLM_PREEMPTIONS),
    }


def engine_series(samples: pd.DataFrame, window: tuple[float, float] | None = None) -> pd.DataFrame:
    """Hit rates and KV usage over time (seconds since the first sample) for plots: the hit-rate series
    whose final quarter is the table's hit rate, and `kv_usage_max_pct`, the fullest replica at each
    sampler round of the replay `window` (start, end) when given, whose peak is the table's KV usage
    max (series.gauge_over_time)."""
    local = rate_ratio(samples, N.VLLM_PREFIX_HITS, N.VLLM_PREFIX_QUERIES).series.rename("local_hit_rate")
    external = rate_ratio(samples, N.VLLM_EXT_HITS, N.VLLM_EXT_QUERIES).series.rename("external_hit_rate")
    span = run_span(samples)
    kv_name = N.resolve(samples["name"].unique(), N.VLLM_KV_USAGE)
    kv = gauge_values(samples, kv_name)
    if span is not None and not kv.empty:
        step = grid_step(kv)
        kv_series = (gauge_over_time(kv, kv_name, span[0], step, window) * 100.0).rename("kv_usage_max_pct")
    else:
        kv_series = pd.Series(dtype=float, name="kv_usage_max_pct")
    frame = pd.concat([local, external, kv_series], axis=1).sort_index()
    frame.index.name = "t_s"
    return frame.reset_index()
