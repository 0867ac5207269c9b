"""The engine's side of the LMCacheMPConnector stand-in: lookup, store and clear calls.

Used by the simulated engine only. It reaches the cache server at `lmcache.mp.host:port` with
aiohttp and knows nothing about timing: the engine charges transfer time from its cost profile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp

from kvoffload.sim import protocol
from kvoffload.sim.engine_args import ConnectorConfig

log = logging.getLogger(__name__)


class CacheServerUnavailable(RuntimeError):
    """The cache server did not answer."""


class CacheClient:
    """One keep-alive HTTP session to the cache server."""

    def __init__(self, cfg: ConnectorConfig, model: str) -> None:
        self.cfg = cfg
        self.model = model
        self.base = f"http://{cfg.host}:{cfg.port}"
        self.chunk_size = 256
        self._session: aiohttp.ClientSession | None = None
        self._background: set[asyncio.Task[None]] = set()

    async def connect(self) -> None:
        """Wait for the server up to `lmcache.mp.mq_timeout`, as the real connector does at start-up."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.cfg.mq_timeout_s),
            connector=aiohttp.TCPConnector(limit=64),
        )
        deadline = time.monotonic() + self.cfg.mq_timeout_s
        while True:
            try:
                async with self._session.get(
                    self.base + protocol.PING, timeout=aiohttp.ClientTimeout(total=2)
                ) as resp:
                    body = await resp.json()
                    self.chunk_size = int(body["chunk_size"])
                    return
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                if time.monotonic() >= deadline:
                    await self._session.close()
                    self._session = None
                    raise CacheServerUnavailable(
                        f"LMCache MP server at tcp://{self.cfg.host}:{self.cfg.port} did not answer "
                        f"within lmcache.mp.mq_timeout={self.cfg.mq_timeout_s}s ({exc})"
                    ) from exc
                await asyncio.sleep(0.2)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self._session is not None:
            await self._session.close()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None:
            raise CacheServerUnavailable("cache client used before connect()")
        try:
            async with self._session.post(self.base + path, json=body) as resp:
                resp.raise_for_status()
                data: dict[str, Any] = await resp.json()
                return data
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise CacheServerUnavailable(
                f"LMCache MP server at tcp://{self.cfg.host}:{self.cfg.port} failed: {exc!r}"
            ) from exc

    async def lookup(self, keys: list[bytes], chunk_bytes: int, request_id: str = "") -> tuple[int, int]:
        """Leading chunks the server holds (after prefetching any from L2), and how many came from L2.

        Sent for every request, also one without a full chunk, as the real connector does (LMCache
        counts those as early exits). `request_id`: the engine's id of the request, which the server
        logs with the lookup (its prefetch line), as LMCache's connector passes vLLM's.
        """
        body = {
            "model": self.model,
            "keys": [k.hex() for k in keys],
            "chunk_bytes": chunk_bytes,
            "request_id": request_id,
        }
        data = await self._post(protocol.LOOKUP, body)
        return int(data["hit_chunks"]), int(data["l2_chunks"])

    async def clear(self) -> bool:
        """Ask the server to drop its L1 (non-forced CLEAR); False when it did not answer."""
        try:
            await self._post(protocol.CLEAR, {"force": False})
        except CacheServerUnavailable as exc:
            log.warning("%s", exc)
            return False
        return True

    def _fire(self, path: str, body: dict[str, Any]) -> None:
        async def send() -> None:
            try:
                await self._post(path, body)
            except CacheServerUnavailable as exc:
                log.warning("%s", exc)

        task = asyncio.get_running_loop().create_task(send())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def store(self, keys: list[bytes], chunk_bytes: int) -> None:
        """Send newly computed chunks to the server (fire and forget, as the copy already happened)."""
        if keys:
            body = {"model": self.model, "keys": [k.hex() for k in keys], "chunk_bytes": chunk_bytes}
            self._fire(protocol.STORE, body)
