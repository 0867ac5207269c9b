"""The simulated `lmcache server`: one shared KV chunk store for many simulated engines.

- L1: host RAM pool of `--l1-size-gb` (GiB), chunks kept in LRU order. An eviction loop ticks once a
  second; when usage is at or above `--eviction-trigger-watermark` it evicts `--eviction-ratio` of the
  chunks, least recently used first. A store that does not fit is dropped and counted
  (`l1_allocation_failure`), as in LMCache, which never evicts on the store path.
- L2 (`--l2-adapter` fs/fs_native): every chunk newly stored in L1 is also written to L2 by a
  background writer (write-through, LMCache's default store policy). Every lookup also probes L2
  (LMCache's prefetch lookup); chunks past the L1 prefix that L2 holds are read back into L1 before
  the answer, as far as L1 has room (the rest fail as `l1_oom`). An adapter with an `eviction` block
  and a `max_capacity_gb` is checked once a second, like LMCache's L2 eviction controller: at or above
  the block's watermark its ratio of chunks is deleted, least recently used first. Without the block
  LMCache never evicts from L2, and neither does the simulator. The same once-a-second pass drops the
  chunks whose files were deleted from disk by hand, so usage and lookups follow a wiped folder.
- Time: L2 reads and writes take `bytes / disk bandwidth` from `--sim-profile`, queued on one read and
  one write timeline (the drive is shared), and never less than the real file IO took.
The engine protocol is `kvoffload.sim.protocol` on `--host:--port`. LMCache's HTTP API is served on
`--http-host:--http-port`, as far as the simulator can fill it truthfully: `GET /healthcheck`,
`GET /status` (a subset of the real keys), `POST /cache/clear` (L1 only), `DELETE /cache/objects`
(key-addressed, L1, L2 or both; a key is matched by its chunk hash), `GET /cache/objects` (503, as
fs_native does not list) and `GET /metrics`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from typing import Any

from aiohttp import web

from kvoffload import aio
from kvoffload.errors import UserError
from kvoffload.sim import protocol
from kvoffload.sim.cache_args import STATUS_TYPE, CacheArgs
from kvoffload.sim.cache_metrics import L1_BACKEND, L1_TAG, CacheMetrics
from kvoffload.sim.http_common import (
    BACKLOG,
    LARGE_BODY,
    app_runner,
    detail_response,
    fastapi_errors,
    metrics_handler,
    stop_on_signals,
    validation_error,
)
from kvoffload.sim.l2_fs import FsL2
from kvoffload.sim.profile import Disk, load_profile

log = logging.getLogger("kvoffload.sim.cache_server")

EVICTION_INTERVAL_S = 1.0
CLEAR_TIERS = ("l1", "l2", "all")  # LMCache's Tier values; /cache/clear supports l1 only
MAX_DELETE_BATCH = 10_000  # LMCache's limit on the keys of one DELETE /cache/objects
# LMCache 0.5.6's per-request prefetch line (tests/fixtures/lmcache-0.5.6-cpu-attribution/README.md).
PREFETCH_LINE = (
    "Prefetch request completed (L1+L2): %d/%d retained keys (%d L1, %d L2) in %.1f ms "
    "(external_request_id=%s, prefetch_request_id=%d)"
)


class _Timeline:
    """A device that serves one transfer at a time: each one starts when the previous one ends."""

    def __init__(self) -> None:
        self.free_at = 0.0

    def reserve(self, seconds: float) -> float:
        start = max(self.free_at, time.monotonic())
        self.free_at = start + seconds
        return self.free_at


class CacheStore:
    """L1 + L2 state and the operations the engines and the HTTP API call."""

    def __init__(self, args: CacheArgs, disk: Disk, metrics: CacheMetrics) -> None:
        self.args = args
        self.disk = disk
        self.m = metrics
        self.l1_capacity = int(args.l1_size_gb * 2**30)
        self.l1: OrderedDict[str, int] = OrderedDict()
        self.l1_used = 0
        self.l1_reserved = 0  # bytes held for L2 prefetches in flight
        self.l2 = [FsL2(a, args.sim_l2_scale) for a in args.l2_adapters]
        self._reads = _Timeline()
        self._writes = _Timeline()
        self._l2_queue: asyncio.Queue[tuple[str, list[str], int, float]] = asyncio.Queue()
        self._prefetches = 0
        for adapter in self.l2:
            self._publish_l2(adapter)
        self._publish()

    # ---- L1 -------------------------------------------------------------------------------------
    def _publish(self) -> None:
        labels = {"backend": L1_BACKEND, "l1_tag": L1_TAG}
        used = self.l1_used + self.l1_reserved
        self.m.l1_bytes.set(used, **labels)
        self.m.l1_ratio.set(used / self.l1_capacity, **labels)

    def _publish_l2(self, adapter: FsL2) -> None:
        self.m.l2_usage.set(adapter.used, l2_name=adapter.name)

    def _fits(self, nbytes: int) -> bool:
        return self.l1_used + self.l1_reserved + nbytes <= self.l1_capacity

    def _l1_insert(self, key: str, nbytes: int) -> None:
        self.l1[key] = nbytes
        self.l1_used += nbytes

    def eviction_tick(self) -> int:
        """One pass of the L1 eviction loop; the number of chunks evicted."""
        self.m.l1_ticks.add(1)
        usage = (self.l1_used + self.l1_reserved) / self.l1_capacity
        if usage < self.args.eviction_trigger_watermark:
            return 0
        self.m.l1_triggered.add(1)
        if self.args.eviction_policy == "noop":
            return 0
        evicted = self._evict_l1(int(len(self.l1) * self.args.eviction_ratio))
        self._publish()
        return evicted

    def _evict_l1(self, count: int) -> int:
        evicted = 0
        while self.l1 and evicted < count:
            _key, size = self.l1.popitem(last=False)
            self.l1_used -= size
            evicted += 1
        if evicted:
            self.m.l1_evicted.add(evicted, l1_tag=L1_TAG)
        return evicted

    async def eviction_loop(self) -> None:
        while True:
            await asyncio.sleep(EVICTION_INTERVAL_S)
            self.eviction_tick()

    def clear(self, force: bool = False) -> int:
        """Empty L1 (`POST /cache/clear`, the connector's CLEAR); L2 files stay. The chunks dropped.

        Chunks being prefetched stay reserved either way: LMCache keeps locked objects unless `force`,
        and the simulator has nothing else that a forced clear would also drop.
        """
        cleared = self._evict_l1(len(self.l1))
        self._publish()
        log.info("L1 cleared (%d chunks, force=%s)", cleared, force)
        return cleared

    def delete(self, tier: str, keys: list[str]) -> int:
        """`DELETE /cache/objects`: these chunks out of L1, L2 (every adapter) or both. Counted as LMCache
        counts: the L1 chunks removed plus, for L2, the whole batch (absent keys are skipped silently)."""
        deleted = 0
        if tier in ("l1", "all"):
            for key in keys:
                size = self.l1.pop(key, None)
                if size is not None:
                    self.l1_used -= size
                    deleted += 1
            self._publish()
        if tier in ("l2", "all"):
            for adapter in self.l2:
                held = adapter.delete(keys)
                log.info("L2 %s: %d of %d keys deleted through the object API", adapter.name, held, len(keys))
                self._publish_l2(adapter)
            deleted += len(keys)
        return deleted

    # ---- L2 eviction ----------------------------------------------------------------------------
    def l2_eviction_tick(self) -> int:
        """One pass of the L2 eviction controller over every adapter; the chunks deleted."""
        total = 0
        for adapter in self.l2:
            ev = adapter.cfg.eviction
            usage = adapter.usage_fraction
            if ev is None or ev.eviction_policy == "noop" or usage < 0 or usage < ev.trigger_watermark:
                continue
            evicted = adapter.evict(int(len(adapter.index) * ev.eviction_ratio))
            if evicted:
                log.info("L2 %s usage %.2f above watermark %.2f: evicted %d chunks", adapter.name, usage,
                         ev.trigger_watermark, len(evicted))  # fmt: skip
                self.m.l2_evicted.add(len(evicted))
                self._publish_l2(adapter)
            total += len(evicted)
        return total

    async def l2_reconcile(self) -> int:
        """Forget L2 chunks whose files were deleted from disk (the orchestrator wipes L2 between cells
        without a restart); the chunks forgotten. Not evictions: LMCache would not have chosen them."""
        total = 0
        for adapter in self.l2:
            gone = await adapter.reconcile()
            if gone:
                log.info("L2 %s: %d chunk files gone from %s, dropped from the index", adapter.name,
                         len(gone), adapter.base)  # fmt: skip
                self._publish_l2(adapter)
            total += len(gone)
        return total

    async def l2_eviction_loop(self) -> None:
        while True:
            await asyncio.sleep(EVICTION_INTERVAL_S)
            await self.l2_reconcile()
            self.l2_eviction_tick()

    # ---- engine operations ----------------------------------------------------------------------
    async def lookup(self, model: str, keys: list[str], chunk_bytes: int) -> tuple[int, int]:
        """Leading chunks held (after reading L2-only ones back into L1), and how many came from L2."""
        m = self.m
        labels = {"cache_salt": "", "model_name": model}
        cs = self.args.chunk_size
        m.lookups.add(1, **labels)
        if not keys:
            m.lookup_early_exit.add(1, reason="empty_chunk_hashes", **labels)
        l1_hits = 0
        for key in keys:
            if key not in self.l1:
                break
            self.l1.move_to_end(key)
            l1_hits += 1
        loaded = 0
        if keys and self.l2:
            m.l2_lookup_requests.add(1)
            m.l2_lookup_chunks.add(len(keys))
            run: list[tuple[FsL2, str]] = []
            for key in keys[l1_hits:]:
                adapter = next((a for a in self.l2 if key in a), None)
                if adapter is None:
                    break
                run.append((adapter, key))
            if run:
                loaded = await self._prefetch(model, run, chunk_bytes)
        hits = l1_hits + loaded
        if hits:
            m.l1_read.add(hits, l1_tag=L1_TAG)  # the hit chunks are read out of L1 for the engine
        m.lookup_requested.add(len(keys) * cs, **labels)
        m.lookup_hit.add(hits * cs, **labels)
        m.lookup_hit_l1.add(l1_hits * cs, **labels)
        m.lookup_hit_l2.add(loaded * cs, **labels)
        m.lookup_hit_l1_keys.add(l1_hits, **labels)
        m.lookup_hit_l2_keys.add(loaded, **labels)
        return hits, loaded

    async def _prefetch(self, model: str, run: list[tuple[FsL2, str]], chunk_bytes: int) -> int:
        """Read a run of L2 chunks back into L1 as far as L1 has room; how many made it."""
        m = self.m
        room = max(0, (self.l1_capacity - self.l1_used - self.l1_reserved) // chunk_bytes)
        fit = run[:room]
        if len(fit) < len(run):
            m.l2_prefetch_failure.add(len(run) - len(fit), model_name=model, reason="l1_oom")
        if not fit:
            return 0
        reserved = len(fit) * chunk_bytes
        self.l1_reserved += reserved
        self._prefetches += 1
        m.active_prefetch.set(self._prefetches)
        m.l2_load_submitted.add(len({a.name for a, _ in fit}))
        m.l2_load_submitted_chunks.add(len(fit))
        submitted = time.monotonic()
        loaded = 0
        nbytes: dict[str, int] = {}
        try:
            done_at = self._reads.reserve(self.disk.read_s(sum(a.index[k] for a, k in fit)))
            for adapter, key in fit:
                try:
                    nbytes[adapter.name] = nbytes.get(adapter.name, 0) + await adapter.read(key)
                except FileNotFoundError:
                    m.l2_prefetch_failure.add(len(fit) - loaded, model_name=model, reason="not_found")
                    break
                loaded += 1
            delay = done_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            self.l1_reserved -= reserved
            self._prefetches -= 1
            m.active_prefetch.set(self._prefetches)
        inserted = 0
        for _adapter, key in fit[:loaded]:
            if key in self.l1:  # an engine stored it meanwhile
                self.l1.move_to_end(key)
            else:
                self._l1_insert(key, chunk_bytes)
                inserted += 1
        if inserted:
            m.l1_write.add(inserted, l1_tag=L1_TAG)
        if loaded:
            m.l2_loaded_chunks.add(loaded)
        elapsed = max(time.monotonic() - submitted, 1e-9)
        for name, total in nbytes.items():
            m.l2_load_completed.add(1, l2_name=name)
            m.l2_load_tp.record(total / elapsed / 1e9, l2_name=name)
        self._publish()
        return loaded

    def store(self, model: str, keys: list[str], chunk_bytes: int) -> int:
        """Chunks an engine computed: into L1 where they fit (then on to L2); how many were new to L1."""
        new: list[str] = []
        failed = 0
        for key in keys:
            if key in self.l1:
                self.l1.move_to_end(key)
            elif self._fits(chunk_bytes):
                self._l1_insert(key, chunk_bytes)
                new.append(key)
            else:
                failed += 1
        if failed:
            self.m.l1_alloc_fail.add(failed, during="l1_store", model_name=model)
        if new:
            self.m.l1_write.add(len(new), l1_tag=L1_TAG)
            if self.l2:
                # LMCache submits every chunk new to L1, also one L2 already holds (it is rewritten).
                self.m.l2_store_submitted.add(1)
                self.m.l2_store_submitted_chunks.add(len(new))
                self._l2_queue.put_nowait((model, new, chunk_bytes, time.monotonic()))
        self._publish()
        return len(new)

    async def l2_writer(self) -> None:
        """Write-through to every L2 adapter, one task at a time, at the modelled write bandwidth."""
        while True:
            model, keys, chunk_bytes, submitted = await self._l2_queue.get()
            self.m.l1_read.add(len(keys), l1_tag=L1_TAG)  # read out of L1 once for all adapters
            for adapter in self.l2:
                total = len(keys) * chunk_bytes
                done_at = self._writes.reserve(self.disk.write_s(total))
                for key in keys:
                    await adapter.write(key, chunk_bytes, model)
                delay = done_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                self.m.l2_store_completed.add(1, l2_name=adapter.name)
                self.m.l2_store_completed_chunks.add(len(keys))
                elapsed = max(time.monotonic() - submitted, 1e-9)
                self.m.l2_store_tp.record(total / elapsed / 1e9, l2_name=adapter.name)
                self._publish_l2(adapter)

    # ---- GET /status ----------------------------------------------------------------------------
    def status(self, loops_alive: bool) -> dict[str, Any]:
        """The keys of LMCache's `GET /status` that the simulator can fill truthfully, same names."""
        cap = self.l1_capacity
        used = self.l1_used + self.l1_reserved
        l1 = {
            "is_healthy": True,
            "total_object_count": len(self.l1),
            "memory_used_bytes": used,
            "memory_total_bytes": cap,
            "memory_configured_bytes": cap,
            "capacity_bytes_by_backend": {L1_BACKEND: cap},
            "memory_usage_ratio": used / cap,
        }
        l1_eviction = {
            "is_healthy": loops_alive,
            "thread_alive": loops_alive,
            "eviction_policy": self.args.eviction_policy,
            "trigger_watermark": self.args.eviction_trigger_watermark,
            "eviction_ratio": self.args.eviction_ratio,
        }
        adapters = [_adapter_status(a) for a in self.l2]
        l2_eviction = {
            "is_healthy": loops_alive,
            "thread_alive": loops_alive,
            "adapters": [
                {
                    "eviction_policy": a.cfg.eviction.eviction_policy,
                    "trigger_watermark": a.cfg.eviction.trigger_watermark,
                    "eviction_ratio": a.cfg.eviction.eviction_ratio,
                    "current_usage": a.usage_fraction,
                    "total_bytes_used": a.used,
                    "total_capacity_bytes": a.capacity_bytes,
                }
                for a in self.l2
                if a.cfg.eviction is not None
            ],
        }
        storage = {
            "is_healthy": loops_alive,
            "l1_managers": {L1_TAG: l1},
            "l1_eviction_controllers": {L1_TAG: l1_eviction},
            "l2_eviction_controller": l2_eviction,
            "l2_adapters": adapters,
            "num_l2_adapters": len(adapters),
            "l1_usage": [used, cap],
            "l1_capacity_bytes_by_backend": {L1_BACKEND: cap},
            "l1_manager": l1,
            "l1_eviction_controller": l1_eviction,
        }
        return {
            "is_healthy": loops_alive,
            "engine_type": "MPCacheServer",
            "chunk_size": self.args.chunk_size,
            "storage_manager": storage,
            "active_prefetch_jobs": self._prefetches,
        }

    def close(self) -> None:
        for adapter in self.l2:
            adapter.close()


def _adapter_status(adapter: FsL2) -> dict[str, Any]:
    cfg = adapter.cfg
    out: dict[str, Any] = {
        "is_healthy": True,
        "type": STATUS_TYPE[cfg.type_name],
        "base_path": cfg.base_path,
        "use_odirect": cfg.use_odirect,
    }
    if cfg.type_name == "fs_native":
        out |= {
            "num_workers": cfg.num_workers,
            "read_ahead_size": cfg.read_ahead_size,
            "pad_buffers_to_alignment": cfg.use_odirect,
        }
    return out


def _chunk_hash(key: Any) -> str | None:
    """The chunk hash (hex) of an `EncodedObjectKey`, or None when it is not one."""
    if not isinstance(key, dict):
        return None
    chunk, model, rank = key.get("chunk_hash_hex"), key.get("model_name"), key.get("kv_rank")
    if not isinstance(chunk, str) or not chunk or not isinstance(model, str) or not isinstance(rank, int):
        return None
    try:
        bytes.fromhex(chunk)
    except ValueError:
        return None
    return chunk


class CacheServer:
    """The two aiohttp applications: engine protocol and LMCache's HTTP API."""

    def __init__(self, args: CacheArgs, store: CacheStore, metrics: CacheMetrics) -> None:
        self.args = args
        self.store = store
        self.metrics = metrics
        self._tasks: list[asyncio.Task[None]] = []
        self._prefetch_lines = 0  # LMCache's prefetch_request_id: a count of the lookups that hit

    def engine_app(self) -> web.Application:
        app = web.Application(client_max_size=LARGE_BODY)
        app.router.add_get(protocol.PING, self.ping)
        app.router.add_post(protocol.LOOKUP, self.lookup)
        app.router.add_post(protocol.STORE, self.store_chunks)
        app.router.add_post(protocol.CLEAR, self.engine_clear)
        return app

    def http_app(self) -> web.Application:
        app = web.Application(middlewares=[fastapi_errors])
        app.router.add_get("/", self.root)
        app.router.add_get("/healthcheck", self.health)
        app.router.add_get("/status", self.status)
        app.router.add_post("/cache/clear", self.cache_clear)
        app.router.add_get("/cache/objects", self.list_objects)
        app.router.add_delete("/cache/objects", self.delete_objects)
        app.router.add_get("/metrics", metrics_handler(self.metrics.registry))
        return app

    # ---- engine protocol ------------------------------------------------------------------------
    async def ping(self, _request: web.Request) -> web.Response:
        return web.json_response({"chunk_size": self.args.chunk_size})

    async def lookup(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        started = time.perf_counter()
        keys = list(body["keys"])
        hits, l2 = await self.store.lookup(str(body["model"]), keys, int(body["chunk_bytes"]))
        # LMCache's per-request line, the only place it splits a request's hits by tier, written for a
        # lookup that hit only: the collect role keeps it, ingest joins it (kvoffload/ingest/lmcache_log.py).
        if hits:
            self._prefetch_lines += 1
            log.info(
                PREFETCH_LINE,
                hits, len(keys), hits - l2, l2, (time.perf_counter() - started) * 1000,
                body.get("request_id") or "", self._prefetch_lines,
            )  # fmt: skip
        return web.json_response({"hit_chunks": hits, "l2_chunks": l2})

    async def store_chunks(self, request: web.Request) -> web.Response:
        b: dict[str, Any] = await request.json()
        n = self.store.store(str(b["model"]), list(b["keys"]), int(b["chunk_bytes"]))
        return web.json_response({"stored": n})

    async def engine_clear(self, request: web.Request) -> web.Response:
        b: dict[str, Any] = await request.json()
        return web.json_response({"cleared": self.store.clear(bool(b.get("force", False)))})

    # ---- HTTP API -------------------------------------------------------------------------------
    async def root(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "service": "LMCache HTTP API"})

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    async def status(self, _request: web.Request) -> web.Response:
        return web.json_response(self.store.status(self.loops_alive()))

    async def cache_clear(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body: Any = {}
        if raw.strip():
            try:
                body = json.loads(raw)
            except json.JSONDecodeError as exc:
                return validation_error(["body", exc.pos], "JSON decode error", raw.decode(errors="replace"))
            if not isinstance(body, dict):
                return validation_error(["body"], "Input should be a valid dictionary", body)
        tier = body.get("tier", "l1")
        force = body.get("force", False)
        if tier not in CLEAR_TIERS:
            return validation_error(["body", "tier"], "Input should be 'l1', 'l2' or 'all'", tier)
        if not isinstance(force, bool):
            return validation_error(["body", "force"], "Input should be a valid boolean", force)
        if tier != "l1":
            return detail_response(400, f"tier {tier!r} not supported; only 'l1'")
        self.store.clear(force)
        return web.json_response({"status": "ok", "cleared": {"tier": "l1"}})

    async def list_objects(self, request: web.Request) -> web.Response:
        """fs / fs_native cannot list their keys in LMCache 0.5.6: the same 503."""
        tier = request.query.get("tier", "l2")
        if tier != "l2":
            return detail_response(400, f"tier {tier!r} not supported; only 'l2'")
        if not self.store.l2:
            return detail_response(503, "no L2 adapters configured")
        name = self.store.l2[0].name
        impl = "NativeConnectorL2Adapter" if name == "fs_native" else "FSL2Adapter"
        detail = f"L2 adapter {name!r} does not support listing: {impl} does not implement list_l2_keys"
        return detail_response(503, detail)

    async def delete_objects(self, request: web.Request) -> web.Response:
        """Key-addressed delete, body `{"tier", "keys": [EncodedObjectKey], "force"}` as LMCache takes it."""
        try:
            body = json.loads(await request.read())
        except json.JSONDecodeError as exc:
            return validation_error(["body", exc.pos], "JSON decode error", None)
        if not isinstance(body, dict):
            return validation_error(["body"], "Input should be a valid dictionary", body)
        tier, keys = body.get("tier", "l2"), body.get("keys")
        if tier not in CLEAR_TIERS:
            return validation_error(["body", "tier"], "Input should be 'l1', 'l2' or 'all'", tier)
        if not isinstance(keys, list):
            return validation_error(["body", "keys"], "Field required (a list of object keys)", keys)
        if len(keys) > MAX_DELETE_BATCH:
            detail = f"too many keys in a single request (limit={MAX_DELETE_BATCH}, got={len(keys)})"
            return detail_response(400, detail)
        hashes = []
        for i, key in enumerate(keys):
            chunk = _chunk_hash(key)
            if chunk is None:
                return detail_response(400, f"keys[{i}]: not an object key: {key!r}")
            hashes.append(chunk)
        if tier != "l1" and not self.store.l2:
            return detail_response(503, "no L2 adapters configured")
        deleted = self.store.delete(tier, hashes)
        return web.json_response({"deleted": deleted, "skipped": 0, "ok": True})

    # ---- background -----------------------------------------------------------------------------
    def start_background(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.store.eviction_loop()))
        if self.store.l2:
            self._tasks.append(loop.create_task(self.store.l2_writer()))
            self._tasks.append(loop.create_task(self.store.l2_eviction_loop()))

    def loops_alive(self) -> bool:
        return bool(self._tasks) and not any(t.done() for t in self._tasks)

    def stop_background(self) -> None:
        for task in self._tasks:
            task.cancel()


def serve_cache(args: CacheArgs) -> int:
    """Run the cache server until SIGTERM/SIGINT."""
    profile = load_profile(args.sim_profile)
    log.info(
        "simulated LMCache MP server: L1 %.2f GiB (%s, watermark %.2f, ratio %.2f), chunk %d tokens, L2 %s",
        args.l1_size_gb,
        args.eviction_policy,
        args.eviction_trigger_watermark,
        args.eviction_ratio,
        args.chunk_size,
        ", ".join(f"{a.type_name}:{a.base_path}" for a in args.l2_adapters) or "none",
    )
    try:
        aio.run(_run(args, profile.disk))
    except OSError as exc:
        raise UserError(
            f"--host {args.host} --port {args.port} / --http-host {args.http_host} --http-port "
            f"{args.http_port}: cannot listen: {exc}"
        ) from exc
    return 0


async def _run(args: CacheArgs, disk: Disk) -> None:
    metrics = CacheMetrics()
    store = CacheStore(args, disk, metrics)
    server = CacheServer(args, store, metrics)
    stop = asyncio.Event()
    stop_on_signals(stop)
    # In-flight requests (a lookup waiting on modelled L2 reads) get SHUTDOWN_GRACE_S at a stop.
    engine_runner = app_runner(server.engine_app())
    http_runner = app_runner(server.http_app())
    await engine_runner.setup()
    await http_runner.setup()
    try:
        await web.TCPSite(engine_runner, args.host, args.port, backlog=BACKLOG).start()
        await web.TCPSite(http_runner, args.http_host, args.http_port).start()
        server.start_background()
        log.info(
            "LMCache cache server is running on %s:%d (HTTP %s:%d)",
            args.host,
            args.port,
            args.http_host,
            args.http_port,
        )
        await stop.wait()
        log.info("shutting down")
    finally:
        server.stop_background()
        await asyncio.gather(engine_runner.cleanup(), http_runner.cleanup())
        store.close()
