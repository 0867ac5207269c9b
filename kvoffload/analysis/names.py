"""Metric names the analysis reads, with the older spellings it also accepts (docs/metrics.md).

Each figure lists candidate names in preference order; `resolve` picks the first one present in the
data, so a server exposing both a new and a deprecated name is never counted twice. Histogram bases
are regular expressions because unit suffixes differ between versions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

# vLLM (current name first).
VLLM_PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
VLLM_PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
VLLM_EXT_QUERIES = ("vllm:external_prefix_cache_queries_total",)
VLLM_EXT_HITS = ("vllm:external_prefix_cache_hits_total",)
VLLM_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
VLLM_PREEMPTIONS = ("vllm:num_preemptions_total",)
# Histogram bases: `<base>_sum` / `<base>_count`.
VLLM_PREFILL_TIME = (r"vllm:request_prefill_time(_seconds)?",)
VLLM_QUEUE_TIME = (r"vllm:request_queue_time(_seconds)?",)
VLLM_ITL = (r"vllm:inter_token_latency(_seconds)?", r"vllm:time_per_output_token(_seconds)?")

# LMCache MP server, as LMCache 0.5.6 exports them (docs/metrics.md "## LMCache"; the real capture is
# tests/fixtures/lmcache-0.5.6-cpu/metric-names-types.txt). Its OpenTelemetry export puts the unit into
# the name. No older spellings: 0.4.7 and 0.5.0 use the same names for every family read here (checked
# on their wheels), and LMCache's earlier listener-based names (`lmcache_mp:...`) are not read.
LMC_LOOKUP_REQUESTED = ("lmcache_mp_lookup_requested_tokens_total",)
LMC_LOOKUP_HIT = ("lmcache_mp_lookup_hit_tokens_total",)
# Per-tier split of LMC_LOOKUP_HIT (l1 + l2 == hit), new in 0.5.6.
LMC_LOOKUP_HIT_L1 = ("lmcache_mp_lookup_hit_l1_tokens_total",)
LMC_LOOKUP_HIT_L2 = ("lmcache_mp_lookup_hit_l2_tokens_total",)
# The same hits in chunks (keys): what the server's per-request prefetch lines count.
LMC_LOOKUP_HIT_L1_KEYS = ("lmcache_mp_lookup_hit_l1_keys_total",)
LMC_LOOKUP_HIT_L2_KEYS = ("lmcache_mp_lookup_hit_l2_keys_total",)
LMC_L1_USAGE_BYTES = ("lmcache_mp_l1_memory_usage_bytes",)
LMC_L1_USAGE_RATIO = ("lmcache_mp_l1_usage_ratio",)
LMC_L2_USAGE_BYTES = ("lmcache_mp_l2_usage_bytes",)
LMC_L1_EVICTED = ("lmcache_mp_l1_evicted_chunks_total",)
LMC_L2_EVICTED = ("lmcache_mp_l2_evicted_objects_chunks_total",)
LMC_L1_ALLOCATION_FAILED = ("lmcache_mp_l1_allocation_failure_chunks_total",)
LMC_L2_STORED = ("lmcache_mp_l2_store_completed_objects_chunks_total",)
LMC_L2_LOADED = ("lmcache_mp_l2_prefetch_load_completed_chunks_total",)
LMC_L2_PREFETCH_FAILED = ("lmcache_mp_l2_prefetch_failure_chunks_total",)
LMC_LOOP_TICKS = ("lmcache_mp_l1_eviction_loop_ticks_total",)
LMC_LOOP_TRIGGERED = ("lmcache_mp_l1_eviction_loop_triggered_total",)
LMC_CHUNKS_LOADED = ("lmcache_mp_num_chunks_loaded_total",)
LMC_L0_L1_STORE_TPUT = (r"lmcache_mp_l0_l1_store_throughput_\w+",)
LMC_L0_L1_LOAD_TPUT = (r"lmcache_mp_l0_l1_load_throughput_\w+",)
LMC_L2_STORE_TPUT = (r"lmcache_mp_l2_store_throughput_\w+",)
LMC_L2_LOAD_TPUT = (r"lmcache_mp_l2_load_throughput_\w+",)
# Names read above that the CPU-mode capture cannot show, with where LMCache 0.5.6 defines them
# (lmcache/v1/mp_observability/subscribers/metrics/ in its wheel). tests/unit/analysis holds every
# other lmcache_mp_ name here to the capture.
LMC_NOT_IN_CPU_CAPTURE = {
    "lmcache_mp_l2_evicted_objects_chunks_total": "l2.py: counted only once L2 evicts (needs an adapter "
    "with max_capacity_gb and an eviction block; the capture's L2 never filled)",
    "lmcache_mp_num_chunks_loaded_total": "engine.py: MP_RETRIEVE_END of the GPU transfer path",
    LMC_L0_L1_STORE_TPUT[0]: "l0_l1_throughput.py: GPU (cupy stream) store events only",
    LMC_L0_L1_LOAD_TPUT[0]: "l0_l1_throughput.py: GPU (cupy stream) retrieve events only",
}
# Emitted only by LMCache's GPU transfer path: absent on a CPU-mode server whatever it moved, so their
# absence is "not measured", never 0 (kvoffload/analysis/lmcache.py).
LMC_GPU_PATH_ONLY = frozenset(
    {"lmcache_mp_num_chunks_loaded_total", LMC_L0_L1_STORE_TPUT[0], LMC_L0_L1_LOAD_TPUT[0]}
)
# The histograms among them (patterns): a server showing one has used the GPU path, so there an absent
# chunks-loaded counter means none was loaded (0), not "not measured".
LMC_GPU_PATH_HISTOGRAMS = (LMC_L0_L1_STORE_TPUT[0], LMC_L0_L1_LOAD_TPUT[0])

# The families LMCache 0.5.6 can create that neither the CPU-mode capture nor the real-engine lane
# showed, with the module of its wheel (under lmcache/v1/) that defines each: the CUDA transfer path's
# and those of events the CPU runs never had (an L2 eviction, a timeout, an L1 read failure, an
# in-flight L2 task at the moment of a scrape). Derived from the wheel, not typed from memory:
# tests/fixtures/lmcache-0.5.6-wheel/metric-families.txt, written by tests/support/lmcache_names.py.
_MP_METRICS = "mp_observability/subscribers/metrics/"
LMC_NOT_SEEN_ON_CPU = {
    "lmcache_mp_event_bus_subscriber_exceptions_total": _MP_METRICS + "event_bus.py",
    "lmcache_mp_inflight_load_memory_usage_bytes": "distributed/storage_controllers/prefetch_controller.py",
    "lmcache_mp_l0_block_reuse_gap_seconds": _MP_METRICS + "l0_lifecycle.py",
    "lmcache_mp_l0_l1_load_throughput_GB_per_second": _MP_METRICS + "l0_l1_throughput.py",
    "lmcache_mp_l0_l1_store_throughput_GB_per_second": _MP_METRICS + "l0_l1_throughput.py",
    "lmcache_mp_l1_read_failure_chunks_total": _MP_METRICS + "l1_failures.py",
    "lmcache_mp_l2_evicted_objects_chunks_total": _MP_METRICS + "l2.py",
    "lmcache_mp_num_chunks_loaded_total": _MP_METRICS + "engine.py",
    "lmcache_mp_num_finished_retrieves_total": _MP_METRICS + "mp_transfer.py",
    "lmcache_mp_num_finished_stores_total": _MP_METRICS + "mp_transfer.py",
    "lmcache_mp_num_inflight_l2_loads": "distributed/storage_controllers/prefetch_controller.py",
    "lmcache_mp_num_inflight_l2_stores": "distributed/storage_controllers/store_controller.py",
    "lmcache_mp_num_submitted_retrieves_total": _MP_METRICS + "mp_transfer.py",
    "lmcache_mp_num_submitted_stores_total": _MP_METRICS + "mp_transfer.py",
    "lmcache_mp_timeouts_total": _MP_METRICS + "timeout.py",
    "lmcache_mp_transfer_phase_bytes_total": _MP_METRICS + "phase_timing.py",
    "lmcache_mp_transfer_phase_elapsed_seconds_total": _MP_METRICS + "phase_timing.py",
    "lmcache_mp_transfer_staging_throughput_GB_per_second": _MP_METRICS + "phase_timing.py",
}

# Every `lmcache_mp_` family LMCache 0.5.6 exports (counters with `_total`, histograms by base name):
# the CPU capture's metric-names-types.txt, the real-engine lane's four more, and LMC_NOT_SEEN_ON_CPU;
# together exactly the families derived from its wheel (tests/unit/analysis holds the two equal).
# LMCache creates its counters at their first update, so an absent one of these names on a scraped
# server means "never happened"; a scraped server that exports a name outside this set is not the
# version these names describe (a rename), and then an absent counter is unknown, not 0
# (kvoffload/analysis/lmcache.py).
LMC_KNOWN_NAMES = (
    frozenset(
        {
            "lmcache_mp_active_p2p_lookup_jobs",
            "lmcache_mp_active_prefetch_jobs",
            "lmcache_mp_event_bus_drain_lag_seconds",
            "lmcache_mp_event_bus_dropped_events_total",
            "lmcache_mp_event_bus_queue_depth",
            "lmcache_mp_kv_events_log_depth",
            "lmcache_mp_l1_allocation_failure_chunks_total",
            "lmcache_mp_l1_chunk_evict_reuse_gap_seconds",
            "lmcache_mp_l1_chunk_idle_before_evict_seconds",
            "lmcache_mp_l1_chunk_lifetime_seconds",
            "lmcache_mp_l1_chunk_reuse_gap_seconds",
            "lmcache_mp_l1_evicted_chunks_total",
            "lmcache_mp_l1_eviction_loop_ticks_total",
            "lmcache_mp_l1_eviction_loop_triggered_total",
            "lmcache_mp_l1_memory_usage_bytes",
            "lmcache_mp_l1_read_chunks_total",
            "lmcache_mp_l1_staging_bytes",
            "lmcache_mp_l1_usage_ratio",
            "lmcache_mp_l1_write_chunks_total",
            "lmcache_mp_l2_load_completed_requests_total",
            "lmcache_mp_l2_load_throughput_GB_per_second",
            "lmcache_mp_l2_prefetch_adapters",
            "lmcache_mp_l2_prefetch_failure_chunks_total",
            "lmcache_mp_l2_prefetch_load_completed_chunks_total",
            "lmcache_mp_l2_prefetch_load_submitted_objects_chunks_total",
            "lmcache_mp_l2_prefetch_load_submitted_requests_total",
            "lmcache_mp_l2_prefetch_lookup_objects_chunks_total",
            "lmcache_mp_l2_prefetch_lookup_requests_total",
            "lmcache_mp_l2_store_adapters",
            "lmcache_mp_l2_store_completed_objects_chunks_total",
            "lmcache_mp_l2_store_completed_requests_total",
            "lmcache_mp_l2_store_submitted_objects_chunks_total",
            "lmcache_mp_l2_store_submitted_requests_total",
            "lmcache_mp_l2_store_throughput_GB_per_second",
            "lmcache_mp_l2_usage_bytes",
            "lmcache_mp_lookup_early_exit_requests_total",
            "lmcache_mp_lookup_hit_l1_keys_total",
            "lmcache_mp_lookup_hit_l1_tokens_total",
            "lmcache_mp_lookup_hit_l2_keys_total",
            "lmcache_mp_lookup_hit_l2_tokens_total",
            "lmcache_mp_lookup_hit_tokens_total",
            "lmcache_mp_lookup_requested_tokens_total",
            "lmcache_mp_lookups_requests_total",
        }
    )
    | frozenset(
        # Histograms the 0.5.6 server creates only once its L0 blocks age or a chunk is reused: absent from
        # the capture above, sampled from the real server on the real-engine lane (2026-12-04; every family
        # of that run in tests/fixtures/lmcache-0.5.6-cpu/metric-names-real-engine-lane.txt).
        {
            "lmcache_mp_l0_block_idle_before_evict_seconds",
            "lmcache_mp_l0_block_lifetime_seconds",
            "lmcache_mp_real_reuse_gap_objects",
            "lmcache_mp_real_reuse_gap_seconds",
        }
    )
    | frozenset(LMC_NOT_SEEN_ON_CPU)
)
_HISTOGRAM_SUFFIXES = ("_sum", "_count", "_bucket")


def lmcache_unknown_names(present: Iterable[str]) -> list[str]:
    """`lmcache_mp_` names present that are no family of LMC_KNOWN_NAMES (histogram parts by base)."""
    out = []
    for name in sorted(set(present)):
        if not name.startswith("lmcache_mp_"):
            continue
        base = next((name.removesuffix(s) for s in _HISTOGRAM_SUFFIXES if name.endswith(s)), name)
        if name not in LMC_KNOWN_NAMES and base not in LMC_KNOWN_NAMES:
            out.append(name)
    return out


# node-exporter.
NODE_CPU = ("node_cpu_seconds_total",)
NODE_DISK_READ_BYTES = ("node_disk_read_bytes_total",)
NODE_DISK_WRITTEN_BYTES = ("node_disk_written_bytes_total",)
NODE_DISK_READS = ("node_disk_reads_completed_total",)
NODE_DISK_WRITES = ("node_disk_writes_completed_total",)
NODE_DISK_READ_TIME = ("node_disk_read_time_seconds_total",)
NODE_DISK_WRITE_TIME = ("node_disk_write_time_seconds_total",)
NODE_DISK_IO_TIME = ("node_disk_io_time_seconds_total",)
NODE_DISK_IO_WEIGHTED = ("node_disk_io_time_weighted_seconds_total",)

# GPU: our sampler's names (kvoffload.metrics.gpu) first, then DCGM exporter's.
GPU_POWER_W = ("gpu_power_watts", "DCGM_FI_DEV_POWER_USAGE")
GPU_UTIL_PCT = ("gpu_utilization_percent", "DCGM_FI_DEV_GPU_UTIL")
GPU_MEM_USED = ("gpu_memory_used_bytes", "DCGM_FI_DEV_FB_USED")
# Multiplier to bytes per name (DCGM reports framebuffer MiB).
GPU_MEM_SCALE = {"gpu_memory_used_bytes": 1.0, "DCGM_FI_DEV_FB_USED": 1024.0 * 1024.0}


def resolve(present: Iterable[str], candidates: Sequence[str]) -> str | None:
    """The first candidate name (exact) found among `present`."""
    names = set(present)
    for c in candidates:
        if c in names:
            return c
    return None


def resolve_histogram(present: Iterable[str], bases: Sequence[str]) -> str | None:
    """The histogram base name (without `_sum`/`_count`) matching the first pattern that has both."""
    names = set(present)
    for pattern in bases:
        rx = re.compile(f"({pattern})_sum")
        for n in sorted(names):
            m = rx.fullmatch(n)
            if m and f"{m.group(1)}_count" in names:
                return m.group(1)
    return None
