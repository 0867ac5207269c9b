"""The `lmcache_mp_*` metrics of the simulated cache server (docs/metrics.md, LMCache section).

Every family, label set, help text and histogram bucket copies what real LMCache 0.5.6 exposes
(`tests/fixtures/lmcache-0.5.6-cpu/`; `lmcache_mp_l2_evicted_objects_chunks_total`, absent from that
capture because nothing was evicted from L2 there, from the wheel's `l2.py` metrics subscriber).
LMCache exports through OpenTelemetry's Prometheus exporter, and the instruments here behave like
OTel's: a counter or histogram has no series until its first update (a family the run never touched
is absent, not 0), the unit is part of the name (`..._objects_chunks_total`, `..._GB_per_second`), and
there is no `_created` series. Instruments only; the server updates them. No IO.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvoffload.sim.metrics_common import Buckets

# OpenTelemetry's default explicit bucket boundaries (what LMCache's GB/s histograms show).
OTEL_BUCKETS = (0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0,
                7500.0, 10000.0)  # fmt: skip
L1_TAG = "_default"
L1_BACKEND = "dram"

_LabelKey = tuple[tuple[str, str], ...]


def _key(labels: dict[str, str]) -> _LabelKey:
    return tuple(sorted(labels.items()))


class _Instrument:
    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.doc = doc

    def metric(self) -> Metric | None:
        raise NotImplementedError


class OtelCounter(_Instrument):
    """A monotonic counter; a label set appears at its first `add`, even of 0."""

    def __init__(self, name: str, doc: str) -> None:
        super().__init__(name, doc)
        self.series: dict[_LabelKey, float] = {}

    def add(self, value: float = 1.0, **labels: str) -> None:
        if value < 0:
            raise ValueError(f"{self.name}: a counter cannot decrease ({value})")
        key = _key(labels)
        self.series[key] = self.series.get(key, 0.0) + value

    def total(self) -> float:
        """The sum over label sets (for tests and logs)."""
        return sum(self.series.values())

    def metric(self) -> Metric | None:
        if not self.series:
            return None
        m = Metric(self.name, self.doc, "counter")
        for key, value in self.series.items():
            m.add_sample(f"{self.name}_total", dict(key), value)
        return m


class OtelGauge(_Instrument):
    """A gauge (LMCache's are observable gauges: present from start-up once the server sets them)."""

    def __init__(self, name: str, doc: str) -> None:
        super().__init__(name, doc)
        self.series: dict[_LabelKey, float] = {}

    def set(self, value: float, **labels: str) -> None:
        self.series[_key(labels)] = float(value)

    def add(self, delta: float, **labels: str) -> None:
        key = _key(labels)
        self.series[key] = self.series.get(key, 0.0) + delta

    def metric(self) -> Metric | None:
        if not self.series:
            return None
        m = Metric(self.name, self.doc, "gauge")
        for key, value in self.series.items():
            m.add_sample(self.name, dict(key), value)
        return m


class OtelHistogram(_Instrument):
    """An explicit-bucket histogram; a label set appears at its first `record`."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...] = OTEL_BUCKETS) -> None:
        super().__init__(name, doc)
        self.bounds = buckets
        self.series: dict[_LabelKey, Buckets] = {}

    def record(self, value: float, **labels: str) -> None:
        key = _key(labels)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = Buckets(self.bounds)
        series.observe(value)

    def metric(self) -> Metric | None:
        if not self.series:
            return None
        m = Metric(self.name, self.doc, "histogram")
        for key, series in self.series.items():
            labels = dict(key)
            cumulative = series.cumulative()
            for le, count in cumulative:
                m.add_sample(f"{self.name}_bucket", {**labels, "le": le}, count)
            m.add_sample(f"{self.name}_count", labels, cumulative[-1][1])
            m.add_sample(f"{self.name}_sum", labels, series.sum)
        return m


_I = TypeVar("_I", bound=_Instrument)


class CacheMetrics(Collector):
    """All cache-server instruments, collected from their own registry."""

    def __init__(self) -> None:
        self._all: list[_Instrument] = []
        c, g, h = self._counter, self._gauge, self._histogram
        # L1 (lmcache/v1/mp_observability/subscribers/metrics/l1*.py)
        self.l1_read = c("lmcache_mp_l1_read_chunks", "Total chunks read from L1")
        self.l1_write = c("lmcache_mp_l1_write_chunks", "Total chunks written to L1")
        self.l1_evicted = c("lmcache_mp_l1_evicted_chunks", "Total chunks evicted from L1")
        self.l1_ticks = c("lmcache_mp_l1_eviction_loop_ticks", "L1 eviction-loop iterations (every cycle)")
        self.l1_triggered = c(
            "lmcache_mp_l1_eviction_loop_triggered", "L1 eviction-loop iterations where the policy ran"
        )
        self.l1_alloc_fail = c(
            "lmcache_mp_l1_allocation_failure_chunks",
            "Count of L1 memory allocation failures (OOM) during reserve_write. Tagged by ``during`` = "
            "l1_store | l2_prefetch and ``model_name``.",
        )
        self.l1_bytes = g("lmcache_mp_l1_memory_usage_bytes", "Bytes currently held in L1 cache")
        self.l1_ratio = g("lmcache_mp_l1_usage_ratio", "L1 used/total ratio (0.0-1.0)")
        # Lookups (lookup.py)
        self.lookup_requested = c(
            "lmcache_mp_lookup_requested_tokens",
            "Total tokens submitted for lookup (denominator of the L1+L2 token-level hit rate). Only "
            "chunk-aligned tokens are counted.",
        )
        self.lookup_hit = c(
            "lmcache_mp_lookup_hit_tokens",
            "Total tokens found in L1+L2 during lookup (numerator of the L1+L2 token-level hit rate). "
            "Counts the contiguous prefix hit only.",
        )
        self.lookups = c(
            "lmcache_mp_lookups_requests", "Completed lookups (denominator for lookup_early_exit)."
        )
        self.lookup_hit_l1 = c(
            "lmcache_mp_lookup_hit_l1_tokens",
            "Of lookup_hit: tokens served from objects L1 already held (from the storage manager's "
            "per-tier hit counts).",
        )
        self.lookup_hit_l2 = c(
            "lmcache_mp_lookup_hit_l2_tokens",
            "Of lookup_hit: tokens L2 added beyond the L1-servable prefix. lookup_hit_l1 + lookup_hit_l2 "
            "== lookup_hit.",
        )
        self.lookup_hit_l1_keys = c(
            "lmcache_mp_lookup_hit_l1_keys",
            "Hit keys (one per object group, kv rank and chunk) that L1 already held.",
        )
        self.lookup_hit_l2_keys = c("lmcache_mp_lookup_hit_l2_keys", "Hit keys loaded from L2 into L1.")
        self.lookup_early_exit = c(
            "lmcache_mp_lookup_early_exit_requests",
            "Lookups that exited before a normal cache probe, labeled by reason (no_gpu_context, "
            "empty_chunk_hashes, no_group_layout_descs).",
        )
        # L2 (l2.py, l2_failures.py, l2_throughput.py)
        self.l2_usage = g(
            "lmcache_mp_l2_usage_bytes",
            "Bytes currently held in each L2 adapter, tagged by ``l2_name`` (one observation per adapter).",
        )
        self.l2_store_submitted = c(
            "lmcache_mp_l2_store_submitted_requests", "Total L2 store requests submitted"
        )
        self.l2_store_submitted_chunks = c(
            "lmcache_mp_l2_store_submitted_objects_chunks", "Total chunks submitted for L2 store"
        )
        self.l2_store_completed = c(
            "lmcache_mp_l2_store_completed_requests", "Total L2 store requests completed"
        )
        self.l2_store_completed_chunks = c(
            "lmcache_mp_l2_store_completed_objects_chunks", "Total chunks successfully stored to L2"
        )
        self.l2_lookup_requests = c(
            "lmcache_mp_l2_prefetch_lookup_requests", "Total L2 prefetch lookup requests submitted"
        )
        self.l2_lookup_chunks = c(
            "lmcache_mp_l2_prefetch_lookup_objects_chunks", "Total chunks submitted for L2 prefetch lookup"
        )
        self.l2_load_submitted = c(
            "lmcache_mp_l2_prefetch_load_submitted_requests",
            "Total L2 prefetch load requests submitted (per-adapter)",
        )
        self.l2_load_submitted_chunks = c(
            "lmcache_mp_l2_prefetch_load_submitted_objects_chunks", "Total chunks submitted for L2 load"
        )
        self.l2_loaded_chunks = c(
            "lmcache_mp_l2_prefetch_load_completed_chunks", "Total chunks successfully loaded from L2"
        )
        self.l2_load_completed = c(
            "lmcache_mp_l2_load_completed_requests", "Total L2 load tasks completed (per-adapter)"
        )
        self.l2_prefetch_failure = c(
            "lmcache_mp_l2_prefetch_failure_chunks",
            "Count of keys that were expected in L2 but failed to load into L1. Tagged by ``reason`` = "
            "l1_oom | l1_contended | not_found and ``model_name``.",
        )
        self.l2_evicted = c("lmcache_mp_l2_evicted_objects_chunks", "Total chunks evicted from L2")
        self.l2_store_tp = h(
            "lmcache_mp_l2_store_throughput_GB_per_second",
            "Histogram of L1->L2 store throughput in GB/s, measured per task as total_bytes / "
            "(completed_ts - submitted_ts).  Spans adapter queue + network/disk I/O, so this is "
            "end-to-end latency-based throughput.",
        )
        self.l2_load_tp = h(
            "lmcache_mp_l2_load_throughput_GB_per_second",
            "Histogram of L2->L1 load throughput in GB/s, measured per (request, adapter) pair as "
            "total_bytes / (completed_ts - submitted_ts).  Spans adapter queue + network/disk I/O.",
        )
        self.active_prefetch = g("lmcache_mp_active_prefetch_jobs", "Number of active prefetch jobs")
        self.active_prefetch.set(0.0)
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def _declare(self, inst: _I) -> _I:
        """Keep `inst` for collection, in declaration order (the exposition's order)."""
        self._all.append(inst)
        return inst

    def _counter(self, name: str, doc: str) -> OtelCounter:
        return self._declare(OtelCounter(name, doc))

    def _gauge(self, name: str, doc: str) -> OtelGauge:
        return self._declare(OtelGauge(name, doc))

    def _histogram(self, name: str, doc: str) -> OtelHistogram:
        return self._declare(OtelHistogram(name, doc))

    def families(self) -> Iterable[str]:
        """Every family name this server can expose (counters without `_total`)."""
        return [i.name for i in self._all]

    def collect(self) -> Iterator[Metric]:
        for inst in self._all:
            m = inst.metric()
            if m is not None:
                yield m
