"""LMCache MP server figures of one cell (names: kvoffload/analysis/names.py, docs/metrics.md).

Hit rate: lookup hit tokens over requested tokens, as a windowed rate ratio (same rule as the vLLM hit
rates). Counters: increase over the run, summed over label sets (per-tier hit tokens, evicted, stored,
loaded and failed chunks). LMCache's OpenTelemetry counters appear at their first update, so on a
server that was scraped (its always-present gauges are there) an absent event counter means the event
never happened: 0 (no L2 eviction because L2 never filled). The exception is the counter only
LMCache's GPU transfer path emits (chunks loaded, `N.LMC_GPU_PATH_ONLY`), which a CPU-mode server never
shows whatever it moved: None there, and 0 only where the GPU path is proven present (the server shows
another of its families, the L0-L1 store throughput that every store through it records). Usage: L1 +
L2 bytes at the last sample (what the server retains at the end) and L1 usage ratio mean/max.
Throughputs: mean GB/s per transfer from the histograms (increase of _sum / increase of _count). Every
figure is None when its metric is absent (gpu tier: no lmcache-server). Pure: DataFrame in, dict out, no IO.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvoffload.analysis import names as N
from kvoffload.analysis.engine import gauge_stats, histogram_mean, increase, rate_ratio
from kvoffload.analysis.series import AFTER, RUN


def _last_total(samples: pd.DataFrame, candidates: tuple[str, ...]) -> float | None:
    """Sum over series of each series' last value (run samples, else the after snapshot)."""
    name = N.resolve(samples["name"].unique(), candidates)
    if name is None:
        return None
    rows = samples[(samples["name"] == name) & samples["value"].notna()]
    for phase in (AFTER, RUN):
        part = rows[rows["phase"] == phase]
        if not part.empty:
            last = part.sort_values("ts", kind="stable").groupby(["target", "labels"])["value"].last()
            return float(last.sum())
    return None


def _scraped(samples: pd.DataFrame) -> bool:
    """Whether an lmcache-server was sampled: its usage gauges exist from start-up on."""
    names = samples["name"].unique()
    return N.resolve(names, N.LMC_L1_USAGE_BYTES) is not None


def _gpu_path(samples: pd.DataFrame) -> bool:
    """Whether the server used LMCache's GPU transfer path: one of its own families is there."""
    return N.resolve_histogram(samples["name"].unique(), N.LMC_GPU_PATH_HISTOGRAMS) is not None


def _events(
    samples: pd.DataFrame, candidates: tuple[str, ...], scraped: bool, gpu_path: bool = False
) -> float | None:
    """Increase of a lazily created event counter: 0 when absent on a scraped server.

    A GPU-path-only counter is 0 when absent only where `gpu_path` proves that path ran (on CUDA a cell
    without a single load shows no counter yet, as a CPU-mode server never does).
    """
    value = increase(samples, candidates)
    if value is None and scraped and (gpu_path or not set(candidates) & N.LMC_GPU_PATH_ONLY):
        return 0.0
    return value


def lmcache_figures(samples: pd.DataFrame) -> dict[str, Any]:
    """All LMCache figures as a flat dict (None where absent)."""
    scraped = _scraped(samples)
    hit = rate_ratio(samples, N.LMC_LOOKUP_HIT, N.LMC_LOOKUP_REQUESTED)
    l1_evicted = _events(samples, N.LMC_L1_EVICTED, scraped)
    l2_evicted = _events(samples, N.LMC_L2_EVICTED, scraped)
    l1_bytes = _last_total(samples, N.LMC_L1_USAGE_BYTES)
    l2_bytes = _last_total(samples, N.LMC_L2_USAGE_BYTES)
    ratio = gauge_stats(samples, N.LMC_L1_USAGE_RATIO, scale=100.0)
    evicted = None if l1_evicted is None and l2_evicted is None else (l1_evicted or 0.0) + (l2_evicted or 0.0)
    used = None if l1_bytes is None and l2_bytes is None else (l1_bytes or 0.0) + (l2_bytes or 0.0)
    return {
        "lmcache_hit_rate": hit.value,
        "lmcache_hit_rate_source": hit.source,
        "lmcache_lookup_hit_tokens": _events(samples, N.LMC_LOOKUP_HIT, scraped),
        "lmcache_lookup_requested_tokens": _events(samples, N.LMC_LOOKUP_REQUESTED, scraped),
        "lmcache_l1_hit_tokens": _events(samples, N.LMC_LOOKUP_HIT_L1, scraped),
        "lmcache_l2_hit_tokens": _events(samples, N.LMC_LOOKUP_HIT_L2, scraped),
        "lmcache_l2_stored_chunks": _events(samples, N.LMC_L2_STORED, scraped),
        "lmcache_l2_loaded_chunks": _events(samples, N.LMC_L2_LOADED, scraped),
        "lmcache_l2_prefetch_failed_chunks": _events(samples, N.LMC_L2_PREFETCH_FAILED, scraped),
        "lmcache_l1_allocation_failed_chunks": _events(samples, N.LMC_L1_ALLOCATION_FAILED, scraped),
        "lmcache_l1_evicted_chunks": l1_evicted,
        "lmcache_l2_evicted_chunks": l2_evicted,
        "lmcache_evicted_chunks": evicted,
        "lmcache_usage_bytes_last": used,
        "lmcache_l1_usage_mean_pct": ratio["mean"],
        "lmcache_l1_usage_max_pct": ratio["max"],
        "lmcache_eviction_loop_ticks": _events(samples, N.LMC_LOOP_TICKS, scraped),
        "lmcache_eviction_loop_triggered": _events(samples, N.LMC_LOOP_TRIGGERED, scraped),
        "lmcache_chunks_loaded": _events(samples, N.LMC_CHUNKS_LOADED, scraped, _gpu_path(samples)),
        "lmcache_l0_l1_store_gbps": histogram_mean(samples, N.LMC_L0_L1_STORE_TPUT),
        "lmcache_l0_l1_load_gbps": histogram_mean(samples, N.LMC_L0_L1_LOAD_TPUT),
        "lmcache_l2_store_gbps": histogram_mean(samples, N.LMC_L2_STORE_TPUT),
        "lmcache_l2_load_gbps": histogram_mean(samples, N.LMC_L2_LOAD_TPUT),
    }
