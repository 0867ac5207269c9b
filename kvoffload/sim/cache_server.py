"""The simulated `lmcache server`: one shared KV chunk store for many simulated engines.

- L1: host RAM pool of `--l1-size-gb` (GiB), chunks kept in LRU order. An eviction loop ticks once a
  second; when usage is at or above `--eviction-trigger-watermark` it evicts `--eviction-ratio` of the
  used bytes, least recently used first. A store that does not fit is dropped and counted
  (`l1_allocation_failure`), as in LMCache, which never evicts on the store path.
- L2 (`--l2-adapter` fs/fs_native): every chunk stored in L1 is also written to L2 by a background
  writer (write-through, as LMCache's default store policy); a lookup whose L1 prefix ends early goes on
  in L2 and prefetches those chunks back into L1 before answering.
- Time: L2 reads and writes take `bytes / disk bandwidth` from `--sim-profile`, queued on one read and
  one write timeline (the drive is shared), and never less than the real file IO took. Engine-side
  copies (GPU <-> L1) are timed by the engines, which report them.
The engine protocol is `kvoffload.sim.protocol` on `--host:--port`; `/metrics` and `/api/healthcheck`
are served on `--http-host:--http-port`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import OrderedDict
from typing import Any

import prometheus_client
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvoffload import aio
from kvoffload.errors import UserError
from kvoffload.sim import protocol
from kvoffload.sim.cache_args import CacheArgs
from kvoffload.sim.cache_metrics import CacheMetrics
from kvoffload.sim.l2_fs import FsL2
from kvoffload.sim.profile import Disk, load_profile

log = logging.getLogger("kvoffload.sim.cache_server")

EVICTION_INTERVAL_S = 1.0


class _Timeline:
    """A device that serves one transfer at a time: each one starts when the previous one ends."""

    def __init__(self) -> None:
        self.free_at = 0.0

    def reserve(self, seconds: float) -> float:
        start = max(self.free_at, time.monotonic())
        self.free_at = start + seconds
        return self.free_at


class CacheStore:
    """L1 + L2 state and the operations the engines call."""

    def __init__(self, args: CacheArgs, disk: Disk, metrics: CacheMetrics) -> None:
        self.args = args
        self.disk = disk
        self.m = metrics
        self.l1_capacity = int(args.l1_size_gb * 2**30)
        self.l1: OrderedDict[str, int] = OrderedDict()
        self.l1_used = 0
        self.l2 = [FsL2(a, args.sim_l2_scale) for a in args.l2_adapters]
        self._reads = _Timeline()
        self._writes = _Timeline()
        self._l2_queue: asyncio.Queue[tuple[list[str], int, float]] = asyncio.Queue()
        for adapter in self.l2:
            self.m.l2_usage.labels(l2_name=adapter.name).set(adapter.used)
        self._publish()

    # ---- L1 -------------------------------------------------------------------------------------
    def _publish(self) -> None:
        self.m.l1_bytes.set(self.l1_used)
        self.m.l1_ratio.set(self.l1_used / self.l1_capacity)

    def _l1_put(self, key: str, nbytes: int, during: str) -> bool:
        if key in self.l1:
            self.l1.move_to_end(key)
            return True
        if self.l1_used + nbytes > self.l1_capacity:
            self.m.l1_alloc_fail.labels(during=during).inc()
            return False
        self.l1[key] = nbytes
        self.l1_used += nbytes
        self.m.l1_write.inc()
        return True

    def eviction_tick(self) -> int:
        """One pass of the eviction loop; the number of chunks evicted."""
        self.m.l1_ticks.inc()
        usage = self.l1_used / self.l1_capacity
        if self.args.eviction_policy == "noop" or usage < self.args.eviction_trigger_watermark:
            return 0
        self.m.l1_triggered.inc()
        target = self.l1_used - int(self.l1_used * self.args.eviction_ratio)
        evicted = 0
        while self.l1 and self.l1_used > target:
            _key, size = self.l1.popitem(last=False)
            self.l1_used -= size
            evicted += 1
        self.m.l1_evicted.inc(evicted)
        self._publish()
        return evicted

    async def eviction_loop(self) -> None:
        while True:
            await asyncio.sleep(EVICTION_INTERVAL_S)
            self.eviction_tick()

    # ---- engine operations ----------------------------------------------------------------------
    async def lookup(self, model: str, keys: list[str], chunk_bytes: int) -> tuple[int, int]:
        hits = 0
        for key in keys:
            if key not in self.l1:
                break
            self.l1.move_to_end(key)
            hits += 1
        l2_hits = 0
        if hits < len(keys) and self.l2:
            self.m.l2_lookup_requests.inc()
            rest = keys[hits:]
            self.m.l2_lookup_chunks.inc(len(rest))
            run: list[tuple[FsL2, str]] = []
            for key in rest:
                adapter = next((a for a in self.l2 if key in a), None)
                if adapter is None:
                    break
                run.append((adapter, key))
            if run:
                self.m.l2_hit_chunks.inc(len(run))
                l2_hits = await self._prefetch(run, chunk_bytes)
                hits += l2_hits
        cs = self.args.chunk_size
        self.m.lookup_requested.labels(model_name=model).inc(len(keys) * cs)
        self.m.lookup_hit.labels(model_name=model).inc(hits * cs)
        return hits, l2_hits

    async def _prefetch(self, run: list[tuple[FsL2, str]], chunk_bytes: int) -> int:
        """Read a run of L2 chunks back into L1; how many made it (a missing file ends the run)."""
        self.m.active_prefetch.inc()
        submitted = time.monotonic()
        try:
            done_at = self._reads.reserve(self.disk.read_s(sum(a.index[k] for a, k in run)))
            loaded = 0
            nbytes = 0
            for adapter, key in run:
                try:
                    nbytes += await adapter.read(key)
                except FileNotFoundError:
                    break
                loaded += 1
            delay = done_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            for _adapter, key in run[:loaded]:
                self._l1_put(key, chunk_bytes, "l2_prefetch")
            self.m.l2_loaded_chunks.inc(loaded)
            for name in {a.name for a, _ in run[:loaded]}:
                self.m.l2_load_completed.labels(l2_name=name).inc()
                elapsed = max(time.monotonic() - submitted, 1e-9)
                self.m.l2_load_tp.labels(l2_name=name).observe(nbytes / elapsed / 1e9)
            self._publish()
            return loaded
        finally:
            self.m.active_prefetch.dec()

    def retrieved(self, model: str, engine_id: str, chunks: int, chunk_bytes: int, seconds: float) -> None:
        self.m.l1_read.inc(chunks)
        self.m.chunks_loaded.labels(worker_id=engine_id, model_name=model).inc(chunks)
        if seconds > 0:
            self.m.l0_l1_load.labels(engine_id=engine_id, model_name=model).observe(
                chunks * chunk_bytes / seconds / 1e9
            )

    def store(self, model: str, engine_id: str, keys: list[str], chunk_bytes: int, seconds: float) -> int:
        stored = [k for k in keys if self._l1_put(k, chunk_bytes, "l1_store")]
        if seconds > 0 and keys:
            self.m.l0_l1_store.labels(engine_id=engine_id, model_name=model).observe(
                len(keys) * chunk_bytes / seconds / 1e9
            )
        if self.l2:
            fresh = [k for k in stored if not any(k in a for a in self.l2)]
            if fresh:
                self.m.l2_store_submitted.inc()
                self._l2_queue.put_nowait((fresh, chunk_bytes, time.monotonic()))
        self._publish()
        return len(stored)

    async def l2_writer(self) -> None:
        """Write-through to every L2 adapter, one task at a time, at the modelled write bandwidth."""
        while True:
            keys, chunk_bytes, submitted = await self._l2_queue.get()
            for adapter in self.l2:
                total = len(keys) * chunk_bytes
                done_at = self._writes.reserve(self.disk.write_s(total))
                for key in keys:
                    await adapter.write(key, chunk_bytes)
                    self.m.l1_read.inc()
                delay = done_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                self.m.l2_store_completed.labels(l2_name=adapter.name).inc()
                self.m.l2_store_chunks.inc(len(keys))
                elapsed = max(time.monotonic() - submitted, 1e-9)
                self.m.l2_store_tp.labels(l2_name=adapter.name).observe(total / elapsed / 1e9)
                evicted = adapter.evict_over_capacity()
                self.m.l2_evicted.inc(len(evicted))
                self.m.l2_usage.labels(l2_name=adapter.name).set(adapter.used)


class CacheServer:
    """The two aiohttp applications: engine protocol and HTTP (metrics, health)."""

    def __init__(self, args: CacheArgs, store: CacheStore, metrics: CacheMetrics) -> None:
        self.args = args
        self.store = store
        self.metrics = metrics
        self._tasks: list[asyncio.Task[None]] = []

    def engine_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_get(protocol.PING, self.ping)
        app.router.add_post(protocol.LOOKUP, self.lookup)
        app.router.add_post(protocol.RETRIEVE, self.retrieve)
        app.router.add_post(protocol.STORE, self.store_chunks)
        return app

    def http_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_get("/api/healthcheck", self.health)
        return app

    async def ping(self, _request: web.Request) -> web.Response:
        return web.json_response({"chunk_size": self.args.chunk_size})

    async def lookup(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        hits, l2 = await self.store.lookup(str(body["model"]), list(body["keys"]), int(body["chunk_bytes"]))
        return web.json_response({"hit_chunks": hits, "l2_chunks": l2})

    async def retrieve(self, request: web.Request) -> web.Response:
        b: dict[str, Any] = await request.json()
        self.store.retrieved(
            str(b["model"]), str(b["engine_id"]), int(b["chunks"]), int(b["chunk_bytes"]), float(b["seconds"])
        )
        return web.json_response({})

    async def store_chunks(self, request: web.Request) -> web.Response:
        b: dict[str, Any] = await request.json()
        n = self.store.store(
            str(b["model"]), str(b["engine_id"]), list(b["keys"]), int(b["chunk_bytes"]), float(b["seconds"])
        )
        return web.json_response({"stored": n})

    async def metrics_endpoint(self, _request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    def start_background(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.store.eviction_loop()))
        if self.store.l2:
            self._tasks.append(loop.create_task(self.store.l2_writer()))

    def stop_background(self) -> None:
        for task in self._tasks:
            task.cancel()


def serve_cache(args: CacheArgs) -> int:
    """Run the cache server until SIGTERM/SIGINT."""
    profile = load_profile(args.sim_profile)
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # the real server's OTel exporter emits no _created
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
    engine_runner = web.AppRunner(server.engine_app(), access_log=None)
    http_runner = web.AppRunner(server.http_app(), access_log=None)
    await engine_runner.setup()
    await http_runner.setup()
    try:
        await web.TCPSite(engine_runner, args.host, args.port, backlog=1024).start()
        await web.TCPSite(http_runner, args.http_host, args.http_port).start()
        server.start_background()
        log.info(
            "LMCache cache server is running on %s:%d (HTTP %s:%d)",
            args.host,
            args.port,
            args.http_host,
            args.http_port,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        server.stop_background()
        await engine_runner.cleanup()
        await http_runner.cleanup()
