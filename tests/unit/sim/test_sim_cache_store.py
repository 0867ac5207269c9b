"""The cache server's store without HTTP: L1 LRU and watermark eviction, L2 write-through, prefetch,
L2 eviction, clearing, `/status`, and the exposed metric families held to real LMCache 0.5.6."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.analysis.names import LMC_NOT_IN_CPU_CAPTURE
from kvoffload.sim.cache_args import parse_cache_args
from kvoffload.sim.cache_metrics import CacheMetrics
from kvoffload.sim.cache_server import CacheStore
from kvoffload.sim.l2_fs import object_name, scaled_size
from kvoffload.sim.profile import load_profile
from tests.support.metrics import families, sample_values

MIB = 2**20
LMCACHE = Path(__file__).resolve().parents[2] / "fixtures" / "lmcache-0.5.6-cpu"


def _store(extra: list[str]) -> tuple[CacheStore, CacheMetrics]:
    # 8 MiB of L1 = eight 1 MiB chunks; evict half once 3/4 full.
    argv = ["--l1-size-gb", str(8 / 1024), "--eviction-policy", "LRU"]
    argv += ["--eviction-trigger-watermark", "0.75", "--eviction-ratio", "0.5", *extra]
    metrics = CacheMetrics()
    return CacheStore(parse_cache_args(argv), load_profile("tiny").disk, metrics), metrics


def _l2(tmp_path: Path, **extra: Any) -> list[str]:
    spec = {"type": "fs_native", "base_path": str(tmp_path), "use_odirect": True, "num_workers": 2, **extra}
    return ["--l2-adapter", json.dumps(spec), "--sim-l2-scale", "16"]


def _values(metrics: CacheMetrics) -> dict[str, float]:
    return sample_values(metrics.registry)


def _with_l2_writer(store: CacheStore, body: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    async def scenario() -> Any:
        writer = asyncio.get_running_loop().create_task(store.l2_writer())
        try:
            return await body()
        finally:
            writer.cancel()

    return asyncio.run(scenario())


async def _settle(store: CacheStore) -> None:
    """Until every L2 store task submitted so far has completed on every adapter."""
    m = store.m
    while m.l2_store_completed.total() < m.l2_store_submitted.total() * len(store.l2):
        await asyncio.sleep(0.01)


def test_scaled_size_rounds_up_to_4k_pages() -> None:
    assert scaled_size(32 * MIB, 64) == 512 * 1024
    assert scaled_size(1000, 64) == 4096
    assert scaled_size(MIB, 16) == 64 * 1024


def test_lookup_counts_the_leading_run_only_and_splits_hits_by_tier() -> None:
    store, metrics = _store([])
    store.store("m", ["a", "b", "c"], MIB)
    hits, l2 = asyncio.run(store.lookup("m", ["a", "b", "x", "c"], MIB))
    assert (hits, l2) == (2, 0)
    v = _values(metrics)
    assert v["lmcache_mp_lookup_requested_tokens_total"] == 4 * 256
    assert v["lmcache_mp_lookup_hit_tokens_total"] == 2 * 256
    assert v["lmcache_mp_lookup_hit_l1_tokens_total"] == 2 * 256
    assert v["lmcache_mp_lookup_hit_l2_tokens_total"] == 0
    assert v["lmcache_mp_lookup_hit_l1_keys_total"] == 2
    assert v["lmcache_mp_lookups_requests_total"] == 1
    assert v["lmcache_mp_l1_write_chunks_total"] == 3
    assert v["lmcache_mp_l1_read_chunks_total"] == 2  # the hit chunks, read out for the engine
    # No L2 adapter: no L2 family at all (OTel instruments appear at their first update).
    assert not [name for name in v if name.startswith("lmcache_mp_l2_")]


def test_a_prompt_without_a_full_chunk_is_an_early_exit() -> None:
    store, metrics = _store([])
    assert asyncio.run(store.lookup("m", [], MIB)) == (0, 0)
    samples = {
        (s.name, tuple(sorted(s.labels.items())))
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in f.samples
    }
    exit_labels = (("cache_salt", ""), ("model_name", "m"), ("reason", "empty_chunk_hashes"))
    assert ("lmcache_mp_lookup_early_exit_requests_total", exit_labels) in samples
    assert _values(metrics)["lmcache_mp_lookup_requested_tokens_total"] == 0


def test_full_l1_drops_stores_and_the_loop_evicts_lru_above_the_watermark() -> None:
    store, metrics = _store([])
    keys = [f"k{i}" for i in range(10)]
    assert store.store("m", keys, MIB) == 8  # two did not fit
    asyncio.run(store.lookup("m", ["k0"], MIB))  # k0 becomes most recently used
    assert store.eviction_tick() == 4  # 8 MiB used >= 6 MiB: evict half the chunks, least recently used
    assert list(store.l1) == ["k5", "k6", "k7", "k0"]
    assert store.eviction_tick() == 0  # 4/8 is below the watermark
    v = _values(metrics)
    assert v["lmcache_mp_l1_allocation_failure_chunks_total"] == 2
    assert v["lmcache_mp_l1_eviction_loop_ticks_total"] == 2
    assert v["lmcache_mp_l1_eviction_loop_triggered_total"] == 1
    assert v["lmcache_mp_l1_evicted_chunks_total"] == 4
    assert v["lmcache_mp_l1_usage_ratio"] == 0.5


def test_l2_write_through_and_prefetch_back_into_l1(tmp_path: Path) -> None:
    store, metrics = _store(_l2(tmp_path))

    async def body() -> tuple[int, int]:
        store.store("m", ["a", "b", "c", "d"], MIB)
        await _settle(store)
        assert store.clear() == 4  # L1 only: the files stay
        return await store.lookup("m", ["b", "c", "d", "e"], MIB)

    assert _with_l2_writer(store, body) == (3, 3)
    names = sorted(p.name for p in tmp_path.glob("*.data"))
    assert names == sorted(f"m@0x00000000@0@{k}.data" for k in "abcd")
    assert all(p.stat().st_size == MIB // 16 for p in tmp_path.glob("*.data"))
    assert set(store.l1) == {"b", "c", "d"}
    v = _values(metrics)
    assert v["lmcache_mp_l2_usage_bytes"] == 4 * MIB
    assert v["lmcache_mp_l2_store_submitted_requests_total"] == 1
    assert v["lmcache_mp_l2_store_completed_objects_chunks_total"] == 4
    assert v["lmcache_mp_l2_prefetch_lookup_objects_chunks_total"] == 4  # every requested chunk
    assert v["lmcache_mp_l2_prefetch_load_completed_chunks_total"] == 3
    assert v["lmcache_mp_lookup_hit_l2_tokens_total"] == 3 * 256
    assert v["lmcache_mp_lookup_hit_l2_keys_total"] == 3
    assert v["lmcache_mp_l1_evicted_chunks_total"] == 4  # what the clear dropped
    assert "lmcache_mp_l2_evicted_objects_chunks_total" not in v  # no eviction block: never evicts


def test_l2_files_deleted_under_the_running_server_leave_usage_and_lookups(tmp_path: Path) -> None:
    """The campaign's wipe between cells: clear L1, delete L2's files, no restart."""
    store, metrics = _store(_l2(tmp_path))

    async def body() -> tuple[int, int, int, float]:
        store.store("m", ["a", "b", "c"], MIB)
        await _settle(store)
        store.clear()
        for path in tmp_path.glob("*.data"):
            path.unlink()
        forgotten = await store.l2_reconcile()
        usage = _values(metrics)["lmcache_mp_l2_usage_bytes"]
        hits, l2 = await store.lookup("m", ["a", "b", "c"], MIB)
        return forgotten, hits, l2, usage

    assert _with_l2_writer(store, body) == (3, 0, 0, 0.0)
    v = _values(metrics)
    assert v["lmcache_mp_l1_memory_usage_bytes"] == 0
    assert "lmcache_mp_l2_prefetch_failure_chunks_total" not in v  # the index knew: no read was tried
    assert store.l2[0].used == 0 and not store.l2[0].index


def test_a_key_addressed_delete_empties_l2_and_its_account(tmp_path: Path) -> None:
    """`DELETE /cache/objects` (the nvme tier's reset): files, index and usage go; L1 is left alone
    by an l2 delete, and the answer counts the batch as LMCache does."""
    store, metrics = _store(_l2(tmp_path))

    async def body() -> tuple[int, int]:
        store.store("org/model", ["aa", "bb", "cc"], MIB)
        await _settle(store)
        assert sorted(p.name for p in tmp_path.glob("*.data")) == [
            f"org-SEP-model@0x00000000@0@{k}.data" for k in ("aa", "bb", "cc")
        ]
        deleted = store.delete("l2", ["aa", "bb", "cc", "dd"])  # dd: absent, skipped
        return deleted, (await store.lookup("org/model", ["aa"], MIB))[1]

    assert _with_l2_writer(store, body) == (4, 0)
    assert not list(tmp_path.glob("*.data")) and not store.l2[0].index
    assert _values(metrics)["lmcache_mp_l2_usage_bytes"] == 0
    assert "aa" in store.l1  # the lookup found it in L1: an l2 delete leaves L1
    assert store.delete("all", ["aa"]) == 2 and "aa" not in store.l1


def test_a_chunk_written_while_the_folder_is_listed_is_kept(tmp_path: Path) -> None:
    store, _metrics = _store(_l2(tmp_path))
    adapter = store.l2[0]

    async def body() -> list[str]:
        await adapter.write("gone", MIB)
        await adapter.write("again", MIB)
        for key in ("gone", "again"):
            (tmp_path / object_name("", key)).unlink()
        listing = asyncio.ensure_future(adapter.reconcile())
        await asyncio.sleep(0)  # the listing has started in its thread
        await adapter.write("again", MIB)  # rewritten meanwhile: its file may postdate the listing
        return await listing

    assert asyncio.run(body()) == ["gone"]
    assert set(adapter.index) == {"again"} and adapter.used == MIB
    assert (tmp_path / object_name("", "again")).exists()


def test_a_deleted_l2_folder_is_made_again_on_the_next_write(tmp_path: Path) -> None:
    base = tmp_path / "l2"
    store, _metrics = _store(_l2(base))
    adapter = store.l2[0]
    base.rmdir()
    asyncio.run(adapter.write("k", MIB))
    assert (base / object_name("", "k")).stat().st_size == MIB // 16


def test_a_prefetch_that_l1_cannot_hold_fails_as_l1_oom(tmp_path: Path) -> None:
    store, metrics = _store(_l2(tmp_path))

    async def body() -> tuple[int, int]:
        store.store("m", ["a", "b", "c"], MIB)
        await _settle(store)
        store.clear()
        store.store("m", [f"f{i}" for i in range(7)], MIB)  # 7 of 8 MiB taken: room for one chunk
        return await store.lookup("m", ["a", "b", "c"], MIB)

    assert _with_l2_writer(store, body) == (1, 1)
    samples = [
        s
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in f.samples
        if s.name == "lmcache_mp_l2_prefetch_failure_chunks_total"
    ]
    assert [(s.labels, s.value) for s in samples] == [({"model_name": "m", "reason": "l1_oom"}, 2.0)]


def test_l2_eviction_needs_capacity_and_an_eviction_block(tmp_path: Path) -> None:
    # 4 MiB of L2; at 3/4 full the controller deletes half the chunks, least recently used first.
    eviction = {"eviction_policy": "LRU", "trigger_watermark": 0.75, "eviction_ratio": 0.5}
    store, metrics = _store(_l2(tmp_path, max_capacity_gb=4 / 1024, eviction=eviction))

    async def body() -> int:
        store.store("m", ["a", "b", "c"], MIB)
        await _settle(store)
        assert store.l2_eviction_tick() == 1  # 3/4 full: int(3 * 0.5) chunks go
        store.store("m", ["d", "e"], MIB)
        await _settle(store)
        return store.l2_eviction_tick()  # 4/4: two go

    assert _with_l2_writer(store, body) == 2
    assert sorted(p.name for p in tmp_path.glob("*.data")) == [object_name("m", "d"), object_name("m", "e")]
    v = _values(metrics)
    assert v["lmcache_mp_l2_evicted_objects_chunks_total"] == 3
    assert v["lmcache_mp_l2_usage_bytes"] == 2 * MIB
    status = store.status(True)["storage_manager"]["l2_eviction_controller"]["adapters"]
    assert status == [
        {
            "eviction_policy": "LRU",
            "trigger_watermark": 0.75,
            "eviction_ratio": 0.5,
            "current_usage": 0.5,
            "total_bytes_used": 2 * MIB,
            "total_capacity_bytes": 4 * MIB,
        }
    ]


def test_capacity_without_an_eviction_block_is_accounting_only(tmp_path: Path) -> None:
    store, _metrics = _store(_l2(tmp_path, max_capacity_gb=1 / 1024))

    async def body() -> int:
        store.store("m", ["a", "b", "c"], MIB)
        await _settle(store)
        return store.l2_eviction_tick()

    assert _with_l2_writer(store, body) == 0
    assert len(list(tmp_path.glob("*.data"))) == 3


def test_persist_disabled_deletes_the_files_at_shutdown(tmp_path: Path) -> None:
    store, _metrics = _store(_l2(tmp_path, persist_enabled=False))

    async def body() -> None:
        store.store("m", ["a", "b"], MIB)
        await _settle(store)

    _with_l2_writer(store, body)
    assert len(list(tmp_path.glob("*.data"))) == 2
    store.close()
    assert list(tmp_path.glob("*.data")) == []


def _keys(d: dict[str, Any], prefix: str = "") -> dict[str, type]:
    """Every key path of a JSON object (lists by their first element) -> the type of its value."""
    out: dict[str, type] = {}
    for k, v in d.items():
        path = f"{prefix}.{k}"
        out[path] = bool if isinstance(v, bool) else float if isinstance(v, int | float) else type(v)
        item = v[0] if isinstance(v, list) and v and isinstance(v[0], dict) else v
        if isinstance(item, dict):
            out |= _keys(item, path)
    return out


def test_status_is_a_subset_of_the_real_status_with_the_same_types(tmp_path: Path) -> None:
    store, _metrics = _store(_l2(tmp_path))
    store.store("m", ["a", "b"], MIB)
    ours = store.status(True)
    real = json.loads((LMCACHE / "status.json").read_text())
    assert _keys(ours).items() <= _keys(real).items()
    sm = ours["storage_manager"]
    assert sm["l1_manager"]["total_object_count"] == 2
    assert sm["l1_usage"] == [2 * MIB, 8 * MIB]
    assert sm["l2_adapters"] == [
        {
            "is_healthy": True,
            "type": "FSNativeL2Adapter",
            "base_path": str(tmp_path),
            "use_odirect": True,
            "num_workers": 2,
            "read_ahead_size": None,
            "pad_buffers_to_alignment": True,
        }
    ]


def _realfamilies() -> dict[str, tuple[str, frozenset[str]]]:
    real: dict[str, tuple[str, frozenset[str]]] = {}
    for path in sorted(LMCACHE.glob("metrics-*.txt")):
        for name, (kind, labels) in families(path.read_text()).items():
            if name.startswith("lmcache_mp_"):
                real[name] = (kind, real.get(name, (kind, frozenset()))[1] | labels)
    return real


def test_the_capture_file_lists_what_the_captures_show() -> None:
    listed = dict(line.split() for line in (LMCACHE / "metric-names-types.txt").read_text().splitlines())
    shown = {f"{n}_total" if k == "counter" else n: k for n, (k, _l) in _realfamilies().items()}
    assert listed == shown


def test_every_family_the_store_exposes_is_real_lmcache_with_its_type_and_labels(tmp_path: Path) -> None:
    eviction = {"eviction_policy": "LRU", "trigger_watermark": 0.5, "eviction_ratio": 0.5}
    store, metrics = _store(_l2(tmp_path, max_capacity_gb=2 / 1024, eviction=eviction))

    async def body() -> None:  # touch every instrument once
        store.store("m", [f"k{i}" for i in range(9)], MIB)  # one does not fit L1
        await _settle(store)
        await store.lookup("m", [], MIB)
        store.eviction_tick()
        store.l2_eviction_tick()
        store.clear()
        store.store("m", [f"f{i}" for i in range(7)], MIB)
        await store.lookup("m", ["k7", "k6", "k5"], MIB)  # held by L2 only; L1 has room for one

    _with_l2_writer(store, body)
    ours = families(generate_latest(metrics.registry).decode())
    assert set(ours) == set(metrics.families())
    real = _realfamilies()
    source_only = {"lmcache_mp_l2_evicted_objects_chunks": ("counter", frozenset())}
    assert {f"{n}_total" for n in source_only} <= set(LMC_NOT_IN_CPU_CAPTURE)
    for name, (kind, labels) in ours.items():
        assert name in real or name in source_only, f"{name} is not a family of LMCache 0.5.6"
        assert (kind, labels) == (real | source_only)[name], name
    assert "_created" not in generate_latest(metrics.registry).decode()


def test_allocation_failures_carry_the_stage_and_the_model() -> None:
    store, metrics = _store([])
    store.store("/models/llama", [f"k{i}" for i in range(9)], MIB)
    text = generate_latest(metrics.registry).decode()
    line = 'lmcache_mp_l1_allocation_failure_chunks_total{during="l1_store",model_name="/models/llama"} 1.0'
    assert line in text.splitlines()
