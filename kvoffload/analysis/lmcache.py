"""LMCache MP server figures of one cell (names: kvoffload/analysis/names.py, docs/metrics.md).

Hit rate: lookup hit tokens over requested tokens, as a windowed rate ratio (same rule as the vLLM hit
rates). Counters: increase over the run, summed over label sets (per-tier hit tokens, evicted, stored,
loaded and failed chunks). LMCache's OpenTelemetry counters appear at their first update, so on a
server that was scraped (its always-present gauges are there) an absent event counter means the event
never happened: 0 (no L2 eviction because L2 never filled), but only while every `lmcache_mp_` name the
server exports is one LMCache 0.5.6 exports (`N.LMC_KNOWN_NAMES`): a name outside that set means the
server renamed its metrics, and then an absent counter is None with a note naming the unknown names.
The exception is the counter only LMCache's GPU transfer path emits (chunks loaded,
`N.LMC_GPU_PATH_ONLY`), which a CPU-mode server never shows whatever it moved: None there, and 0 only
where the GPU path is proven present (the server shows another of its families, the L0-L1 store
throughput that every store through it records). Total evictions (L1 + L2) are None when either part
is. Failed L2 prefetches for lack of room in L1: the failures labelled `reason="l1_oom"`, their share
of the L2 loads tried (loaded + failed for any reason), and whether there were any (the flag the
findings and the decision read). Usage: L1 + L2 bytes at the last sample (what the server retains at
the end) and L1 usage ratio mean/max over the replay window. Throughputs: mean GB/s per transfer from
the histograms (increase of _sum / increase of _count). Every figure is None when its metric is absent
(gpu tier: no lmcache-server). Pure: DataFrame in, dict out, no IO.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvoffload.analysis import names as N
from kvoffload.analysis.engine import gauge_stats, histogram_mean, increase, rate_ratio
from kvoffload.analysis.series import AFTER, RUN, label_filter, note

# The `reason` LMCache 0.5.6 gives a failed L2 prefetch that found no room in L1 for the chunks it was
# to load (its others: l1_contended, not_found); the real capture and the simulator show it.
L1_OOM = "l1_oom"


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
    samples: pd.DataFrame,
    candidates: tuple[str, ...],
    scraped: bool,
    unknown: list[str],
    nulled: list[str],
    gpu_path: bool = False,
) -> float | None:
    """Increase of a lazily created event counter: 0 when absent on a scraped server whose names are
    all known (`unknown`: the names it exports that LMCache 0.5.6 does not); an absent name made null
    that way is added to `nulled`. A GPU-path-only counter is 0 when absent only where `gpu_path`
    proves that path ran (on CUDA a cell without a single load shows no counter yet, as a CPU-mode
    server never does)."""
    value = increase(samples, candidates)
    if value is not None or not scraped:
        return value
    if set(candidates) & N.LMC_GPU_PATH_ONLY and not gpu_path:
        return None
    if unknown:
        nulled.append(candidates[0])
        return None
    return 0.0


def l1_oom_figures(
    samples: pd.DataFrame, loaded: float | None, failed: float | None, scraped: bool, unknown: list[str]
) -> dict[str, Any]:
    """L2 prefetches that failed for lack of room in L1: chunks (the `reason="l1_oom"` series of the
    failure counter, 0 on a scraped server that never created it), their share of the L2 loads tried
    (`loaded` + `failed`, every reason; None when either is unknown or none was tried) and whether
    there were any (None: unknown)."""
    # the other reasons' series dropped, the rest kept: a counter's start depends on the snapshots
    # its target has (series.delta)
    failures = samples[samples["name"].isin(N.LMC_L2_PREFETCH_FAILED)]
    if len(failures):
        samples = samples.drop(index=failures.index.difference(label_filter(failures, reason=L1_OOM).index))
    chunks = _events(samples, N.LMC_L2_PREFETCH_FAILED, scraped, unknown, [])
    tried = None if loaded is None or failed is None else loaded + failed
    return {
        "lmcache_l2_prefetch_failed_l1_oom_chunks": chunks,
        "lmcache_l2_prefetch_failed_l1_oom_share": chunks / tried if chunks is not None and tried else None,
        "lmcache_l2_prefetch_l1_oom": None if chunks is None else chunks > 0,
    }


def lmcache_figures(samples: pd.DataFrame, window: tuple[float, float] | None = None) -> dict[str, Any]:
    """All LMCache figures as a flat dict (None where absent); the hit rate and L1 usage over the
    replay `window` (start, end) when given, as the vLLM figures (analysis/engine.py)."""
    scraped = _scraped(samples)
    unknown = N.lmcache_unknown_names(samples["name"].unique())
    nulled: list[str] = []

    def events(candidates: tuple[str, ...]) -> float | None:
        return _events(samples, candidates, scraped, unknown, nulled)

    hit = rate_ratio(samples, N.LMC_LOOKUP_HIT, N.LMC_LOOKUP_REQUESTED, replay=window)
    l1_evicted = events(N.LMC_L1_EVICTED)
    l2_evicted = events(N.LMC_L2_EVICTED)
    l1_bytes = _last_total(samples, N.LMC_L1_USAGE_BYTES)
    l2_bytes = _last_total(samples, N.LMC_L2_USAGE_BYTES)
    ratio = gauge_stats(samples, N.LMC_L1_USAGE_RATIO, scale=100.0, window=window)
    evicted = None if l1_evicted is None or l2_evicted is None else l1_evicted + l2_evicted
    used = None if l1_bytes is None and l2_bytes is None else (l1_bytes or 0.0) + (l2_bytes or 0.0)
    loaded, failed = events(N.LMC_L2_LOADED), events(N.LMC_L2_PREFETCH_FAILED)
    out = {
        "lmcache_hit_rate": hit.value,
        "lmcache_hit_rate_source": hit.source,
        "lmcache_lookup_hit_tokens": events(N.LMC_LOOKUP_HIT),
        "lmcache_lookup_requested_tokens": events(N.LMC_LOOKUP_REQUESTED),
        "lmcache_l1_hit_tokens": events(N.LMC_LOOKUP_HIT_L1),
        "lmcache_l2_hit_tokens": events(N.LMC_LOOKUP_HIT_L2),
        "lmcache_l2_stored_chunks": events(N.LMC_L2_STORED),
        "lmcache_l2_loaded_chunks": loaded,
        "lmcache_l2_prefetch_failed_chunks": failed,
        **l1_oom_figures(samples, loaded, failed, scraped, unknown),
        "lmcache_l1_allocation_failed_chunks": events(N.LMC_L1_ALLOCATION_FAILED),
        "lmcache_l1_evicted_chunks": l1_evicted,
        "lmcache_l2_evicted_chunks": l2_evicted,
        "lmcache_evicted_chunks": evicted,
        "lmcache_usage_bytes_last": used,
        "lmcache_l1_usage_mean_pct": ratio["mean"],
        "lmcache_l1_usage_max_pct": ratio["max"],
        "lmcache_eviction_loop_ticks": events(N.LMC_LOOP_TICKS),
        "lmcache_eviction_loop_triggered": events(N.LMC_LOOP_TRIGGERED),
        "lmcache_chunks_loaded": _events(
            samples, N.LMC_CHUNKS_LOADED, scraped, unknown, nulled, _gpu_path(samples)
        ),
        "lmcache_l0_l1_store_gbps": histogram_mean(samples, N.LMC_L0_L1_STORE_TPUT),
        "lmcache_l0_l1_load_gbps": histogram_mean(samples, N.LMC_L0_L1_LOAD_TPUT),
        "lmcache_l2_store_gbps": histogram_mean(samples, N.LMC_L2_STORE_TPUT),
        "lmcache_l2_load_gbps": histogram_mean(samples, N.LMC_L2_LOAD_TPUT),
    }
    if nulled:
        note(
            "counter_renamed",
            f"lmcache-server exports {', '.join(unknown)}, which LMCache 0.5.6 does not: its names may have "
            f"changed, so the absent {', '.join(nulled)} are null, not 0",
        )
    return out
