"""The cache server's store without HTTP: L1 LRU and watermark eviction, L2 write-through and prefetch."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.sim.cache_args import parse_cache_args
from kvoffload.sim.cache_metrics import CacheMetrics
from kvoffload.sim.cache_server import CacheStore
from kvoffload.sim.l2_fs import scaled_size
from kvoffload.sim.profile import load_profile

MIB = 2**20


def _store(extra: list[str]) -> tuple[CacheStore, CacheMetrics]:
    # 8 MiB of L1 = eight 1 MiB chunks; evict half once 3/4 full.
    argv = ["--l1-size-gb", str(8 / 1024), "--eviction-policy", "LRU"]
    argv += ["--eviction-trigger-watermark", "0.75", "--eviction-ratio", "0.5", *extra]
    metrics = CacheMetrics()
    return CacheStore(parse_cache_args(argv), load_profile("tiny").disk, metrics), metrics


def _values(metrics: CacheMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "le" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_scaled_size_rounds_up_to_4k_pages() -> None:
    assert scaled_size(32 * MIB, 64) == 512 * 1024
    assert scaled_size(1000, 64) == 4096
    assert scaled_size(MIB, 16) == 64 * 1024


def test_lookup_counts_the_leading_run_only() -> None:
    store, metrics = _store([])
    store.store("m", "e", ["a", "b", "c"], MIB, 0.001)
    hits, l2 = asyncio.run(store.lookup("m", ["a", "b", "x", "c"], MIB))
    assert (hits, l2) == (2, 0)
    v = _values(metrics)
    assert v["lmcache_mp_lookup_requested_tokens_total"] == 4 * 256
    assert v["lmcache_mp_lookup_hit_tokens_total"] == 2 * 256


def test_full_l1_drops_stores_and_the_loop_evicts_lru_above_the_watermark() -> None:
    store, metrics = _store([])
    keys = [f"k{i}" for i in range(10)]
    assert store.store("m", "e", keys, MIB, 0.001) == 8  # two did not fit
    asyncio.run(store.lookup("m", ["k0"], MIB))  # k0 becomes most recently used
    assert store.eviction_tick() == 4  # 8 MiB used >= 6 MiB: evict half, least recently used first
    assert list(store.l1) == ["k5", "k6", "k7", "k0"]
    assert store.eviction_tick() == 0  # 4/8 is below the watermark
    v = _values(metrics)
    assert v["lmcache_mp_l1_allocation_failure_chunks_total"] == 2
    assert v["lmcache_mp_l1_eviction_loop_ticks_total"] == 2
    assert v["lmcache_mp_l1_eviction_loop_triggered_total"] == 1
    assert v["lmcache_mp_l1_evicted_chunks_total"] == 4
    assert v["lmcache_mp_l1_usage_ratio"] == 0.5


def test_l2_write_through_and_prefetch_back_into_l1(tmp_path: Path) -> None:
    spec = f'{{"type": "fs", "base_path": "{tmp_path}", "max_capacity_gb": {3 / 1024}}}'
    store, metrics = _store(["--l2-adapter", spec, "--sim-l2-scale", "16"])

    async def scenario() -> tuple[int, int]:
        writer = asyncio.get_running_loop().create_task(store.l2_writer())
        store.store("m", "e", ["a", "b", "c", "d"], MIB, 0.001)
        while store._l2_queue.qsize() or store.l2[0].used < 3 * MIB:
            await asyncio.sleep(0.01)
        store.l1.clear()
        store.l1_used = 0
        result = await store.lookup("m", ["b", "c", "d", "e"], MIB)
        writer.cancel()
        return result

    hits, l2 = asyncio.run(scenario())
    # Capacity 3 MiB: the least recently written chunk "a" was deleted; b, c, d come back from L2.
    assert (hits, l2) == (3, 3)
    assert sorted(p.name for p in tmp_path.glob("*.data")) == sorted(f"kvsim@{k}.data" for k in "bcd")
    assert all(p.stat().st_size == MIB // 16 for p in tmp_path.glob("*.data"))
    assert set(store.l1) == {"b", "c", "d"}
    v = _values(metrics)
    assert v["lmcache_mp_l2_evicted_chunks_total"] == 1
    assert v["lmcache_mp_l2_usage_bytes"] == 3 * MIB
    assert v["lmcache_mp_l2_prefetch_load_completed_chunks_total"] == 3
