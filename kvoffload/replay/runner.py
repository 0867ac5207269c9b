"""The closed-loop replay: `concurrency` slots, each replaying one virtual user's rounds in order, then
taking the next user, until the pool, `--duration`, the stall watchdog or a stop request ends it
(docs/architecture.md section 6).

Records are appended to requests.jsonl as each request finishes (flushed), so an interrupted run keeps
every finished record; sessions.json is written at the end, also after an interruption, a stall or
failed warm-ups. Nothing fails silently: a user whose replay raises is logged with its traceback and
counted as an error session while its slot goes on with the next user; a run whose in-flight requests
all go quiet is stopped by the watchdog (watchdog.py), those requests recorded as failed with the
reason. `outcome.exit_code` turns the counts into the CLI's exit status. The runner does no printing:
it reports progress through a callback that the CLI renders.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvoffload.atomic import write_text_atomic
from kvoffload.contracts.layout import CellPaths
from kvoffload.datasets import VirtualUser
from kvoffload.errors import UserError
from kvoffload.replay.client import StreamResult, stream_chat
from kvoffload.replay.netstamp import stamped_client
from kvoffload.replay.records import RecordLog, RequestRecord, ResultsUnwritable, SessionCounts
from kvoffload.replay.requests import RequestOptions, build_payload, warmup_payload
from kvoffload.replay.watchdog import Activity, watch

log = logging.getLogger(__name__)


# Warm-up rounds in which every request failed although the server answered: repeated this often.
WARMUP_ROUNDS = 3
WARMUP_PAUSE_S = 2.0


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
    stall_timeout_s: float = 300.0  # 0: no stall watchdog


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
    late: int = 0  # ok requests whose first-token stamp may be late (the client could not keep up)
    read_stamped: int = 0  # ok requests whose TTFT was stamped at read time, not by the kernel
    ttfts: deque[float] = field(default_factory=lambda: deque(maxlen=200))  # recent, for the display


def _failure(result: StreamResult) -> str:
    http = f"HTTP {result.http_status}: " if result.http_status is not None else ""
    return f"{http}{result.error}"


def chat_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return f"{base}/chat/completions" if base.endswith("/v1") else f"{base}/v1/chat/completions"


def prepare_output(folder: Path) -> Path:
    """Create the output folder; the path of its requests.jsonl, which must not hold records yet."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--output {folder}: cannot create the folder ({exc.strerror})") from None
    path = CellPaths(folder).requests
    if path.exists() and path.stat().st_size > 0:
        raise UserError(
            f"{path}: already holds records; give --output a new folder (results are never overwritten)"
        )
    return path


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
        self._stopping = asyncio.Event()  # wakes users waiting out a recorded gap
        self._tasks: list[asyncio.Task[None]] = []
        self._t0 = 0.0
        self._url = chat_url(config.base_url)
        self.activity = Activity()

    def _halt(self) -> None:
        """Start no new round (a round already sent runs to its end unless aborted or cancelled)."""
        self._no_new_rounds = True
        self._stopping.set()

    def stop(self) -> None:
        """Interrupt: cancel in-flight requests; finished records are already on disk."""
        self.counts.interrupted = True
        self.counts.stopped_by = "interrupt"
        self._halt()
        for task in self._tasks:
            task.cancel()

    def _on_stall(self, reason: str) -> None:
        if self.counts.interrupted:
            return
        self.counts.stopped_by = "stall"
        self.counts.stop_reason = reason
        log.error(
            "stall watchdog: %s; stopping the replay, in-flight requests are recorded as failed", reason
        )
        self._halt()
        self.activity.abort(reason)

    def _on_unwritable(self, exc: ResultsUnwritable) -> None:
        """The results cannot be written: stop everything; what is on disk is whole records."""
        if self.counts.stopped_by == "results":
            return
        self.counts.stopped_by = "results"
        self.counts.stop_reason = exc.strerror
        log.error("%s; stopping the replay", exc.strerror)
        self._halt()
        self.activity.abort(str(exc.strerror))

    def _note_error(self, error: str) -> None:
        if self.counts.first_error is None:
            self.counts.first_error = error[:500]

    def _tick(self) -> None:
        self.progress.elapsed_s = time.monotonic() - self._t0
        self._on_progress(self.progress)

    async def _warmup(self, client: httpx.AsyncClient) -> bool:
        """Send the warm-ups; False (with `counts` saying why) when the replay cannot go on.

        A round in which every warm-up failed although the server answered (an HTTP status, an error
        inside a 200 stream: an engine still settling after a cache reset) is repeated, at most
        WARMUP_ROUNDS rounds WARMUP_PAUSE_S apart; each such round's first failure is kept in
        `warmup_errors`. A round that reached no server is not repeated.
        """
        nonce = uuid.uuid4().hex
        for round_no in range(1, WARMUP_ROUNDS + 1):
            results = await asyncio.gather(
                *(
                    stream_chat(
                        client,
                        self._url,
                        warmup_payload(self.config.request, i, f"{nonce}{round_no}"),
                        {"x-user-id": f"warmup-{nonce[:8]}-{i}"},
                        self.config.request_timeout_s,
                        self.activity,
                    )
                    for i in range(self.config.warmup)
                )
            )
            if self.counts.stopped_by == "stall":
                return False
            failed = [r for r in results if r.status != "ok"]
            if len(failed) < len(results):
                if failed:
                    log.warning(
                        "%d of %d warm-up requests failed (%s); the others answered, going on",
                        len(failed), len(results), failed[0].error,
                    )  # fmt: skip
                return True
            first = _failure(failed[0])
            self.counts.warmup_errors.append(first)
            answered = any(r.http_status is not None for r in failed)
            if not answered or round_no == WARMUP_ROUNDS:
                break
            log.warning(
                "warm-up round %d of %d: all %d requests failed (%s); trying again in %g s",
                round_no, WARMUP_ROUNDS, len(results), first, WARMUP_PAUSE_S,
            )  # fmt: skip
            await asyncio.sleep(WARMUP_PAUSE_S)
        self._note_error(first)
        self.counts.stopped_by = "warmup"
        rounds = len(self.counts.warmup_errors)
        self.counts.stop_reason = (
            f"{self._url}: all {len(results)} warm-up requests failed"
            + (f" in each of {rounds} rounds" if rounds > 1 else "")
            + f" ({first}); check --base-url and --model"
        )
        log.error("%s; nothing was replayed", self.counts.stop_reason)
        return False

    async def _send(self, client: httpx.AsyncClient, user: VirtualUser, rnd: int, out: RecordLog) -> bool:
        call = user.calls[rnd - 1]
        payload = build_payload(call, self.config.request)
        for attempt in range(1, self.config.max_attempts + 1):
            result = await stream_chat(
                client,
                self._url,
                payload,
                {"x-user-id": user.user_id},
                self.config.request_timeout_s,
                self.activity,
            )
            record = RequestRecord(
                user_id=user.user_id,
                session_id=user.session_id,
                chunk=user.chunk,
                round=rnd,
                request_id=uuid.uuid4().hex[:16],
                **result.model_dump(),  # the measurements, field for field
            )
            try:
                out.append(record)
            except ResultsUnwritable as exc:
                self._on_unwritable(exc)
                raise
            self.counts.requests += 1
            self.progress.requests += 1
            if result.status == "ok":
                self._note_clock(result)
                self.progress.last_ttft_s = result.ttft_s
                if result.ttft_s is not None:
                    self.progress.ttfts.append(result.ttft_s)
                self._tick()
                return True
            self.counts.failed_requests += 1
            self.progress.failed += 1
            self._note_error(_failure(result))
            self._tick()
            log.warning("user %s round %d attempt %d failed: %s", user.user_id, rnd, attempt, result.error)
            if self.activity.abort_reason is not None:
                break  # stalled: no retry
        return False

    def _note_clock(self, result: StreamResult) -> None:
        """Count late and read-stamped TTFTs; say the first of each (the report shows them per cell)."""
        if result.late_s is not None:
            self.progress.late += 1
            if self.progress.late == 1:
                log.warning(
                    "the client is not keeping up: a first token was read %.1f ms after it arrived, together "
                    "with a later token, so its kernel stamp may be a later token's (late_s in the record); "
                    "use fewer streams per worker or more --workers",
                    result.late_s * 1000,
                )
        if result.ttft_clock == "read":
            self.progress.read_stamped += 1
            if self.progress.read_stamped == 1:
                log.warning(
                    "TTFT falls back to read-time stamps (ttft_clock 'read': https, a proxy, or no kernel "
                    "receive stamps): the client's own lateness counts in TTFT"
                )

    def _summarize_clocks(self) -> None:
        ok = self.counts.ok_requests
        if self.progress.late:
            log.warning("%d of %d ok requests have a possibly late TTFT stamp", self.progress.late, ok)
        if self.progress.read_stamped:
            log.warning("%d of %d ok requests have read-time TTFT stamps", self.progress.read_stamped, ok)

    async def _pause(self, seconds: float) -> None:
        """Wait a recorded gap, or less when the run stops meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _run_user(self, client: httpx.AsyncClient, user: VirtualUser, out: RecordLog) -> None:
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
                    await self._pause(user.calls[rnd - 1].pre_gap)
                    if self._no_new_rounds:
                        outcome = "incomplete"
                        return
                if not await self._send(client, user, rnd, out):
                    outcome = "error"
                    return
        except asyncio.CancelledError:
            outcome = "incomplete"
            raise
        except ResultsUnwritable:
            outcome = "incomplete"  # cut by the stop; said once by _on_unwritable
        except Exception as exc:
            # A bug or an unexpected input in the client (the request could not even be built, a record
            # could not be written): this user is an error session; the slot goes on with the next one.
            outcome = "error"
            self.counts.exceptions += 1
            self._note_error(f"{type(exc).__name__}: {exc}")
            log.exception(
                "user %s: the replay client raised; counted as an error session, the run goes on",
                user.user_id,
            )
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

    async def _slot(self, client: httpx.AsyncClient, out: RecordLog) -> None:
        while not self._no_new_rounds and self._next < len(self.users):
            user = self.users[self._next]
            self._next += 1
            await self._run_user(client, user, out)

    async def _deadline(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if not self._no_new_rounds:
            self.counts.stopped_by = "duration"
            self._halt()

    async def _replay(self, client: httpx.AsyncClient, out: RecordLog, slots: int) -> None:
        self._t0 = time.monotonic()
        self._tasks = [asyncio.create_task(self._slot(client, out)) for _ in range(slots)]
        deadline = (
            asyncio.create_task(self._deadline(self.config.duration_s)) if self.config.duration_s else None
        )
        try:
            results = await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            if deadline is not None:
                deadline.cancel()
        for result in results:
            if isinstance(result, Exception):  # outside any user (users catch their own): still said
                self._note_error(f"{type(result).__name__}: {result}")
                log.error("a replay slot ended on an exception", exc_info=result)

    async def run(self) -> SessionCounts:
        path = prepare_output(self.config.output)
        # Slots beyond the pool would add no load (the CLI warns about them): none is started.
        slots = min(self.config.concurrency, len(self.users))
        limits = httpx.Limits(
            max_connections=max(1, slots + self.config.warmup), max_keepalive_connections=None
        )
        timeout = httpx.Timeout(self.config.request_timeout_s, connect=30.0)
        self._t0 = time.monotonic()
        stall = self.config.stall_timeout_s
        watchdog = asyncio.create_task(watch(self.activity, stall, self._on_stall)) if stall > 0 else None
        try:
            async with stamped_client(limits=limits, timeout=timeout) as client:
                with RecordLog(path) as out:
                    if not self.config.warmup or await self._warmup(client):
                        await self._replay(client, out, slots)
        finally:
            if watchdog is not None:
                watchdog.cancel()
            self._summarize_clocks()
            self.counts.duration_s = round(time.monotonic() - self._t0, 3)
            sessions = CellPaths(self.config.output).sessions
            try:
                write_text_atomic(sessions, self.counts.to_json() + "\n")
            except OSError as exc:
                raise ResultsUnwritable(exc.errno, f"cannot write {sessions}: {exc.strerror}") from exc
            self._tick()
        return self.counts
