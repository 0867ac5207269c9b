"""The closed-loop replay: `concurrency` slots, each replaying one virtual user's rounds in order, then
taking the next user, until the pool, `--duration` or a stop request ends it (DESIGN.md section 6).

Records are appended to requests.jsonl as each request finishes (flushed), so an interrupted run keeps
every finished record; sessions.json is written at the end, also after an interruption. The runner does
no printing: it reports progress through a callback that the CLI renders.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import httpx

from kvoffload.datasets import VirtualUser
from kvoffload.errors import UserError
from kvoffload.replay.client import stream_chat
from kvoffload.replay.netstamp import stamped_client
from kvoffload.replay.records import RequestRecord, SessionCounts
from kvoffload.replay.requests import RequestOptions, build_payload, warmup_payload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayConfig:
    base_url: str
    concurrency: int
    num_rounds: int
    output: Path
    request: RequestOptions
    warmup: int = 4
    request_timeout_s: float = 64800.0
    duration_s: float | None = None
    honor_gaps: bool = False
    max_attempts: int = 1


@dataclass
class Progress:
    """A snapshot for the progress display."""

    users_total: int
    users_started: int = 0
    users_done: int = 0
    requests: int = 0
    failed: int = 0
    active: int = 0
    elapsed_s: float = 0.0
    last_ttft_s: float | None = None
    ttfts: deque[float] = field(default_factory=lambda: deque(maxlen=200))  # recent, for the display


def chat_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return f"{base}/chat/completions" if base.endswith("/v1") else f"{base}/v1/chat/completions"


class ReplayRunner:
    """Runs one replay; `stop()` (from a signal handler) ends it cleanly."""

    def __init__(
        self,
        config: ReplayConfig,
        users: tuple[VirtualUser, ...],
        counts: SessionCounts,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.config = config
        self.users = users
        self.counts = counts
        self.progress = Progress(users_total=len(users))
        self._on_progress = on_progress or (lambda _p: None)
        self._next = 0
        self._no_new_rounds = False
        self._tasks: list[asyncio.Task[None]] = []
        self._t0 = 0.0
        self._url = chat_url(config.base_url)

    def stop(self) -> None:
        """Interrupt: cancel in-flight requests; finished records are already on disk."""
        self.counts.interrupted = True
        self.counts.stopped_by = "interrupt"
        self._no_new_rounds = True
        for task in self._tasks:
            task.cancel()

    def _prepare_output(self) -> Path:
        self.config.output.mkdir(parents=True, exist_ok=True)
        path = self.config.output / "requests.jsonl"
        if path.exists() and path.stat().st_size > 0:
            raise UserError(
                f"{path}: already holds records; give --output a new folder (results are never overwritten)"
            )
        return path

    def _tick(self) -> None:
        self.progress.elapsed_s = time.monotonic() - self._t0
        self._on_progress(self.progress)

    async def _warmup(self, client: httpx.AsyncClient) -> None:
        nonce = uuid.uuid4().hex
        results = await asyncio.gather(
            *(
                stream_chat(
                    client,
                    self._url,
                    warmup_payload(self.config.request.model, i, nonce),
                    {"x-user-id": f"warmup-{nonce[:8]}-{i}"},
                    self.config.request_timeout_s,
                )
                for i in range(self.config.warmup)
            )
        )
        failed = [r for r in results if r.status != "ok"]
        if failed and len(failed) < len(results):
            log.warning(
                "%d of %d warm-up requests failed (%s); the others answered, going on",
                len(failed), len(results), failed[0].error,
            )  # fmt: skip
        elif failed:
            first = failed[0]
            raise UserError(
                f"{self._url}: all {len(results)} warm-up requests failed "
                f"(HTTP {first.http_status}: {first.error}); check --base-url and --model"
            )

    async def _send(self, client: httpx.AsyncClient, user: VirtualUser, rnd: int, out: TextIO) -> bool:
        call = user.calls[rnd - 1]
        payload = build_payload(call, self.config.request)
        for attempt in range(1, self.config.max_attempts + 1):
            result = await stream_chat(
                client, self._url, payload, {"x-user-id": user.user_id}, self.config.request_timeout_s
            )
            record = RequestRecord(
                user_id=user.user_id,
                session_id=user.session_id,
                chunk=user.chunk,
                round=rnd,
                request_id=uuid.uuid4().hex[:16],
                **asdict(result),  # the measurements, field for field
            )
            out.write(record.to_json() + "\n")
            out.flush()
            self.counts.requests += 1
            self.progress.requests += 1
            if result.status == "ok":
                self.progress.last_ttft_s = result.ttft_s
                if result.ttft_s is not None:
                    self.progress.ttfts.append(result.ttft_s)
                self._tick()
                return True
            self.counts.failed_requests += 1
            self.progress.failed += 1
            self._tick()
            log.warning("user %s round %d attempt %d failed: %s", user.user_id, rnd, attempt, result.error)
        return False

    async def _run_user(self, client: httpx.AsyncClient, user: VirtualUser, out: TextIO) -> None:
        self.counts.achieved_sessions += 1
        self.progress.users_started += 1
        self.progress.active += 1
        outcome = "complete"
        try:
            for rnd in range(1, len(user.calls) + 1):
                if self._no_new_rounds:
                    outcome = "incomplete"
                    return
                if self.config.honor_gaps and rnd > 1 and user.calls[rnd - 1].pre_gap > 0:
                    await asyncio.sleep(user.calls[rnd - 1].pre_gap)
                if not await self._send(client, user, rnd, out):
                    outcome = "error"
                    return
        except asyncio.CancelledError:
            outcome = "incomplete"
            raise
        finally:
            self.progress.active -= 1
            self.progress.users_done += 1
            if outcome == "complete":
                self.counts.complete += 1
            elif outcome == "error":
                self.counts.error += 1
            else:
                self.counts.incomplete += 1
            self._tick()

    async def _slot(self, client: httpx.AsyncClient, out: TextIO) -> None:
        while not self._no_new_rounds and self._next < len(self.users):
            user = self.users[self._next]
            self._next += 1
            await self._run_user(client, user, out)

    async def _deadline(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if not self._no_new_rounds:
            self._no_new_rounds = True
            self.counts.stopped_by = "duration"

    async def run(self) -> SessionCounts:
        path = self._prepare_output()
        limits = httpx.Limits(
            max_connections=self.config.concurrency + self.config.warmup, max_keepalive_connections=None
        )
        timeout = httpx.Timeout(self.config.request_timeout_s, connect=30.0)
        self._t0 = time.monotonic()
        async with stamped_client(limits=limits, timeout=timeout) as client:
            if self.config.warmup:
                await self._warmup(client)
            self._t0 = time.monotonic()
            with path.open("a", encoding="utf-8") as out:
                self._tasks = [
                    asyncio.create_task(self._slot(client, out)) for _ in range(self.config.concurrency)
                ]
                deadline = (
                    asyncio.create_task(self._deadline(self.config.duration_s))
                    if self.config.duration_s
                    else None
                )
                try:
                    await asyncio.gather(*self._tasks, return_exceptions=True)
                finally:
                    if deadline is not None:
                        deadline.cancel()
                    self.counts.duration_s = round(time.monotonic() - self._t0, 3)
                    (self.config.output / "sessions.json").write_text(self.counts.to_json() + "\n")
                    self._tick()
        return self.counts
