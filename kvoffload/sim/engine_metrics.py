"""vLLM's Prometheus metrics, as the simulated engine exposes them on `/metrics`.

Names, types, labels (`model_name`, `engine`) and histogram buckets follow real vLLM 0.32
(`tests/fixtures/vllm-0.32-cpu/metrics-*.txt`): counters are declared without `_total` and
prometheus-client adds it, plus the `_created` series vLLM also shows. Only what the simulator models
is exported. This module holds the instruments; the engine updates them. No IO.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kvoffload.sim.metrics_common import Buckets

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

VERSION = "0.32.0"
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def buckets_1_2_5(limit: int) -> list[float]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to `limit`."""
    out: list[float] = []
    exp = 1
    while True:
        for m in (1, 2, 5):
            v = m * exp
            if v > limit:
                return out
            out.append(float(v))
        exp *= 10


class BatchHistogram(Collector):
    """A histogram that takes one value for a whole batch (`observe_n`): one call per engine step
    instead of one per token. Exposed exactly like prometheus-client's Histogram (with `_created`)."""

    def __init__(
        self,
        name: str,
        doc: str,
        buckets: tuple[float, ...],
        labels: dict[str, str],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.doc = doc
        self.labels = labels
        self.buckets = Buckets(buckets)
        self.created = time.time()
        registry.register(self)

    def observe_n(self, value: float, n: int) -> None:
        self.buckets.observe(value, n)

    def collect(self) -> Iterable[Metric]:
        names = list(self.labels)
        values = [self.labels[k] for k in names]
        hist = HistogramMetricFamily(self.name, self.doc, labels=names)
        hist.add_metric(values, self.buckets.cumulative(), self.buckets.sum)
        created = GaugeMetricFamily(f"{self.name}_created", self.doc, labels=names)
        created.add_metric(values, self.created)
        return [hist, created]


class EngineMetrics:
    """All engine instruments, in their own registry, pre-labelled for one model and engine 0."""

    def __init__(
        self, model_name: str, max_model_len: int, cache_info: dict[str, str], lmcache_mp: bool = False
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ln = ["model_name", "engine"]
        lv = {"model_name": model_name, "engine": "0"}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ln, registry=r).labels(**lv)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ln, registry=r).labels(**lv)

        def hist(name: str, doc: str, buckets: tuple[float, ...] | list[float]) -> Histogram:
            return Histogram(name, doc, ln, buckets=buckets, registry=r).labels(**lv)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
            "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, "
            "blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            [*ln, "reason"],
            registry=r,
        )
        self.waiting_capacity = waiting_by_reason.labels(**lv, reason="capacity")
        self.waiting_deferred = waiting_by_reason.labels(**lv, reason="deferred")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.ext_queries = counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of "
            "number of queried tokens.",
        )
        self.ext_hits = counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of "
            "number of cached tokens.",
        )
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        by_source = Counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", [*ln, "source"], registry=r
        )
        self.prompt_computed = by_source.labels(**lv, source="local_compute")
        self.prompt_local_hit = by_source.labels(**lv, source="local_cache_hit")
        self.prompt_external = by_source.labels(**lv, source="external_kv_transfer")
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        cached_by_source = Counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
            "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            [*ln, "source"],
            registry=r,
        )
        for unused in ("host", "p2p", "disk"):  # present at 0 in real vLLM too
            cached_by_source.labels(**lv, source=unused)
        self.cached_device = cached_by_source.labels(**lv, source="device")
        self.cached_external = cached_by_source.labels(**lv, source="external_unspecified")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["engine", "finished_reason", "model_name"],
            registry=r,
        )
        self.success = {reason: success.labels(**lv, finished_reason=reason) for reason in FINISHED_REASONS}
        token_buckets = buckets_1_2_5(max_model_len)
        self.request_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_buckets
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS
        )
        self.request_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", token_buckets
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = BatchHistogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
            lv,
            r,
        )
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self.inference_time = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS,
        )
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            LATENCY_BUCKETS,
        )
        self.decode_time = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS,
        )
        # Registered by LMCache's connector inside vLLM (lmcache/integration/vllm/lmcache_mp_metrics.py):
        # the lookup round trip as vLLM sees it, prometheus-client's default buckets.
        self.lmcache_lookup: Histogram | None = None
        if lmcache_mp:
            self.lmcache_lookup = Histogram(
                "vllm:lmcache_mp_lookup_duration_seconds",
                "LMCache MP lookup latency observed by vLLM.",
                ln,
                registry=r,
            ).labels(**lv)
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            sorted([*ln, *cache_info]),
            registry=r,
        )
        info.labels(**lv, **cache_info).set(1.0)
