"""The `lmcache_mp_*` metrics of the simulated cache server (docs/metrics.md, LMCache section).

Names follow LMCache's MP observability reference as exported to Prometheus (counters with `_total`,
throughput histograms with the `_GB_per_second` unit suffix). Instruments only; the server updates them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

GBPS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


class CacheMetrics:
    """All cache-server instruments in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.lookup_requested = Counter(
            "lmcache_mp_lookup_requested_tokens", "Tokens requested by lookups.", ["model_name"], registry=r
        )
        self.lookup_hit = Counter(
            "lmcache_mp_lookup_hit_tokens",
            "Tokens of lookups served from L1 or L2.",
            ["model_name"],
            registry=r,
        )
        self.l1_bytes = Gauge("lmcache_mp_l1_memory_usage_bytes", "Bytes held in L1.", registry=r)
        self.l1_ratio = Gauge("lmcache_mp_l1_usage_ratio", "L1 used / total.", registry=r)
        self.l1_read = Counter("lmcache_mp_l1_read_chunks", "Chunks read from L1.", registry=r)
        self.l1_write = Counter("lmcache_mp_l1_write_chunks", "Chunks written to L1.", registry=r)
        self.l1_evicted = Counter("lmcache_mp_l1_evicted_chunks", "Chunks evicted from L1.", registry=r)
        self.l1_ticks = Counter(
            "lmcache_mp_l1_eviction_loop_ticks", "L1 eviction loop iterations.", registry=r
        )
        self.l1_triggered = Counter(
            "lmcache_mp_l1_eviction_loop_triggered", "L1 eviction loop iterations that evicted.", registry=r
        )
        self.l1_alloc_fail = Counter(
            "lmcache_mp_l1_allocation_failure_chunks", "Chunks not stored: L1 full.", ["during"], registry=r
        )
        self.l2_usage = Gauge(
            "lmcache_mp_l2_usage_bytes", "Bytes held per L2 adapter.", ["l2_name"], registry=r
        )
        self.l2_store_submitted = Counter(
            "lmcache_mp_l2_store_submitted_requests", "L1->L2 store tasks submitted.", registry=r
        )
        self.l2_store_completed = Counter(
            "lmcache_mp_l2_store_completed_requests", "L1->L2 store tasks completed.", ["l2_name"], registry=r
        )
        self.l2_store_chunks = Counter(
            "lmcache_mp_l2_store_completed_objects_chunks", "Chunks written to L2.", registry=r
        )
        self.l2_lookup_requests = Counter(
            "lmcache_mp_l2_prefetch_lookup_requests", "Lookups that consulted L2.", registry=r
        )
        self.l2_lookup_chunks = Counter(
            "lmcache_mp_l2_prefetch_lookup_objects_chunks", "Chunks looked up in L2.", registry=r
        )
        self.l2_hit_chunks = Counter("lmcache_mp_l2_prefetch_hit_chunks", "Chunks found in L2.", registry=r)
        self.l2_loaded_chunks = Counter(
            "lmcache_mp_l2_prefetch_load_completed_chunks", "Chunks read from L2 into L1.", registry=r
        )
        self.l2_load_completed = Counter(
            "lmcache_mp_l2_load_completed_requests", "L2->L1 load tasks completed.", ["l2_name"], registry=r
        )
        self.l2_evicted = Counter("lmcache_mp_l2_evicted_chunks", "Chunks evicted from L2.", registry=r)
        self.l0_l1_store = Histogram(
            "lmcache_mp_l0_l1_store_throughput_GB_per_second",
            "GPU->L1 store throughput per request, GB/s.",
            ["engine_id", "model_name"],
            buckets=GBPS_BUCKETS,
            registry=r,
        )
        self.l0_l1_load = Histogram(
            "lmcache_mp_l0_l1_load_throughput_GB_per_second",
            "L1->GPU load throughput per request, GB/s.",
            ["engine_id", "model_name"],
            buckets=GBPS_BUCKETS,
            registry=r,
        )
        self.l2_store_tp = Histogram(
            "lmcache_mp_l2_store_throughput_GB_per_second",
            "L1->L2 store throughput per task, GB/s.",
            ["l2_name"],
            buckets=GBPS_BUCKETS,
            registry=r,
        )
        self.l2_load_tp = Histogram(
            "lmcache_mp_l2_load_throughput_GB_per_second",
            "L2->L1 load throughput per task, GB/s.",
            ["l2_name"],
            buckets=GBPS_BUCKETS,
            registry=r,
        )
        self.chunks_loaded = Counter(
            "lmcache_mp_num_chunks_loaded",
            "Chunks delivered to engine workers.",
            ["worker_id", "model_name"],
            registry=r,
        )
        self.active_prefetch = Gauge(
            "lmcache_mp_active_prefetch_jobs", "L2 prefetches in flight.", registry=r
        )
