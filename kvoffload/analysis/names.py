"""Metric names the analysis reads, with the older spellings it also accepts (DESIGN.md section 7).

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

# LMCache MP server (docs/metrics.md "## LMCache").
LMC_LOOKUP_REQUESTED = ("lmcache_mp_lookup_requested_tokens_total",)
LMC_LOOKUP_HIT = ("lmcache_mp_lookup_hit_tokens_total",)
LMC_L1_USAGE_BYTES = ("lmcache_mp_l1_memory_usage_bytes",)
LMC_L1_USAGE_RATIO = ("lmcache_mp_l1_usage_ratio",)
LMC_L2_USAGE_BYTES = ("lmcache_mp_l2_usage_bytes",)
LMC_L1_EVICTED = ("lmcache_mp_l1_evicted_chunks_total",)
LMC_L2_EVICTED = ("lmcache_mp_l2_evicted_chunks_total",)
LMC_LOOP_TICKS = ("lmcache_mp_l1_eviction_loop_ticks_total",)
LMC_LOOP_TRIGGERED = ("lmcache_mp_l1_eviction_loop_triggered_total",)
LMC_CHUNKS_LOADED = ("lmcache_mp_num_chunks_loaded_total",)
LMC_L0_L1_STORE_TPUT = (r"lmcache_mp_l0_l1_store_throughput_\w+",)
LMC_L0_L1_LOAD_TPUT = (r"lmcache_mp_l0_l1_load_throughput_\w+",)
LMC_L2_STORE_TPUT = (r"lmcache_mp_l2_store_throughput_\w+",)
LMC_L2_LOAD_TPUT = (r"lmcache_mp_l2_load_throughput_\w+",)

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
