"""The closed loop spread over worker processes, so a many-core client host can hold hundreds of streams.

One asyncio loop on one core parses every stream's chunks; past a few hundred streams at real inter-token
gaps it falls behind, and a late loop stamps first tokens late (replay/client.py says when). `WorkerPool`
splits the run over `workers` processes, as aiperf does: worker i replays users i, i+W, i+2W, ... (a
user, whose rounds are sequential, never leaves its worker) on its share of the slots, with its own
warm-ups, stall watchdog and `--duration`, through the same `ReplayRunner`, into
OUTPUT/workers/<i>/requests.jsonl. The parent merges those into OUTPUT/requests.jsonl in a stable order
(by t_start, then worker, then line), sums the session counts into OUTPUT/sessions.json and removes the
worker folders. SIGINT/SIGTERM to the parent is passed on to every worker, whose runner stops cleanly and
keeps what it wrote; the merge runs after an interruption too. A worker that dies without its counts is
an error the parent reports (its records are still merged). Progress reaches the parent through a queue.
This module does no HTTP and no printing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import multiprocessing
import os
import queue
import shutil
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from kvoffload import aio
from kvoffload.atomic import write_text_atomic
from kvoffload.contracts.layout import CellPaths
from kvoffload.datasets import VirtualUser
from kvoffload.replay.records import ResultsUnwritable, SessionCounts
from kvoffload.replay.runner import Progress, ReplayConfig, ReplayRunner, prepare_output

log = logging.getLogger(__name__)

STREAMS_PER_WORKER = 128  # what one core holds at 5-30 ms between tokens with room to spare
PROGRESS_EVERY_S = 0.5
# Which worker's reason for stopping names the whole run's, most telling first.
_STOP_ORDER = ("results", "stall", "interrupt", "duration", "warmup", "pool")


def default_workers(concurrency: int, cores: int | None = None) -> int:
    """One worker per STREAMS_PER_WORKER streams, at most one per core but one left for everything else."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, min(cores - 1, math.ceil(concurrency / STREAMS_PER_WORKER)))


def split(
    users: tuple[VirtualUser, ...], concurrency: int, workers: int
) -> list[tuple[tuple[VirtualUser, ...], int]]:
    """(users, slots) per worker: users dealt round-robin, slots spread evenly; no worker left empty."""
    n = max(1, min(workers, concurrency, len(users)))
    return [(users[i::n], concurrency // n + (1 if i < concurrency % n else 0)) for i in range(n)]


def merge_counts(parent: SessionCounts, parts: list[SessionCounts]) -> None:
    """Add the workers' counts into `parent` (which holds what was asked: concurrency, rounds, pool)."""
    summed = ("achieved_sessions", "complete", "incomplete", "error", "failed_requests", "requests")
    for name in (*summed, "exceptions"):
        setattr(parent, name, getattr(parent, name) + sum(getattr(p, name) for p in parts))
    parent.interrupted = parent.interrupted or any(p.interrupted for p in parts)
    reasons = [p.stopped_by for p in parts]
    if reasons and parent.stopped_by == "pool":
        # Every worker must fail its warm-ups for the run to be a warm-up failure.
        candidates = [r for r in _STOP_ORDER if r in reasons and (r != "warmup" or set(reasons) == {r})]
        parent.stopped_by = candidates[0] if candidates else "pool"
    for p in parts:
        if parent.stop_reason is None and p.stopped_by == parent.stopped_by and p.stop_reason:
            parent.stop_reason = p.stop_reason
        if parent.first_error is None and p.first_error:
            parent.first_error = p.first_error
        parent.warmup_errors.extend(p.warmup_errors)


def merge_records(folders: list[Path], path: Path) -> int:
    """Write the workers' records into `path` by (t_start, worker, line); the number of records."""
    keyed: list[tuple[float, int, int, str]] = []
    for index, folder in enumerate(folders):
        part = CellPaths(folder).requests
        if not part.exists():
            continue
        for line_no, line in enumerate(part.read_text(encoding="utf-8").splitlines()):
            keyed.append((float(json.loads(line)["t_start"]), index, line_no, line))
    keyed.sort()
    text = "".join(line + "\n" for *_, line in keyed)
    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise ResultsUnwritable(exc.errno, f"cannot write {path}: {exc.strerror}") from exc
    return len(keyed)


def _worker_main(
    index: int,
    config: ReplayConfig,
    users: tuple[VirtualUser, ...],
    counts: SessionCounts,
    messages: Any,
) -> None:
    """A worker process: one `ReplayRunner` on its own loop; progress and final counts to `messages`."""
    logging.basicConfig(level=logging.INFO, format=f"worker {index}: %(levelname)s %(name)s: %(message)s")
    last = 0.0

    def progress(p: Progress) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY_S:
            last = now
            messages.put(("progress", index, _snapshot(p)))

    runner = ReplayRunner(config, users, counts, progress)

    try:
        aio.run(aio.until_signal(runner.run, runner.stop))
    finally:
        messages.put(("progress", index, _snapshot(runner.progress)))
        messages.put(("done", index, counts.model_dump()))


def _snapshot(p: Progress) -> dict[str, Any]:
    return {**{f.name: getattr(p, f.name) for f in fields(p) if f.name != "ttfts"}, "ttfts": list(p.ttfts)}


class WorkerPool:
    """A replay over worker processes; the same interface as `ReplayRunner` (run, stop)."""

    def __init__(
        self,
        config: ReplayConfig,
        users: tuple[VirtualUser, ...],
        counts: SessionCounts,
        workers: int,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.config = config
        self.counts = counts
        self.shares = split(users, config.concurrency, workers)
        self.progress = Progress(users_total=len(users))
        self._on_progress = on_progress or (lambda _p: None)
        self._procs: list[Any] = []
        self._stopped = False

    def stop(self) -> None:
        """Interrupt: every worker stops as a single replay does (SIGTERM); the merge still runs."""
        self._stopped = True
        for proc in self._procs:
            if proc.pid is not None and proc.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)

    def _prepare(self) -> tuple[Path, list[Path]]:
        path = prepare_output(self.config.output)  # the same checks and messages as a single replay
        folders = [CellPaths(self.config.output).worker(i).root for i in range(len(self.shares))]
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)  # scratch of an earlier, interrupted merge
        return path, folders

    def _show(self, snapshots: dict[int, dict[str, Any]]) -> None:
        p = self.progress
        for name in ("users_started", "users_done", "requests", "failed", "active", "late", "read_stamped"):
            setattr(p, name, sum(s[name] for s in snapshots.values()))
        ttfts = [t for s in snapshots.values() for t in s["ttfts"]]
        p.ttfts = deque(ttfts[-200:], maxlen=200)
        p.elapsed_s = max((s["elapsed_s"] for s in snapshots.values()), default=0.0)
        self._on_progress(p)

    async def run(self) -> SessionCounts:
        path, folders = self._prepare()
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads or a loop
        messages = ctx.Queue()
        t0 = time.monotonic()
        parts: dict[int, SessionCounts] = {}
        snapshots: dict[int, dict[str, Any]] = {}
        try:
            for i, ((users, slots), folder) in enumerate(zip(self.shares, folders, strict=True)):
                config = replace(self.config, concurrency=slots, output=folder)
                template = self.counts.model_copy(
                    update={"requested_concurrency": slots, "virtual_users_available": len(users)}
                )
                proc = ctx.Process(target=_worker_main, args=(i, config, users, template, messages))
                proc.start()
                self._procs.append(proc)
                if self._stopped:
                    self.stop()
            while len(parts) < len(self._procs):
                try:
                    kind, index, body = messages.get_nowait()
                except queue.Empty:
                    if not any(p.is_alive() for p in self._procs):
                        # A worker died without its counts; drain what is still queued, then give up on it.
                        await asyncio.sleep(PROGRESS_EVERY_S)
                        if messages.empty():
                            break
                    await asyncio.sleep(0.05)
                    continue
                if kind == "progress":
                    snapshots[index] = body
                    self._show(snapshots)
                else:
                    parts[index] = SessionCounts.model_validate(body)
        finally:
            for proc in self._procs:
                await asyncio.to_thread(proc.join)
            for index, proc in enumerate(self._procs):
                if index not in parts:
                    self.counts.exceptions += 1
                    reason = f"replay worker {index} ended (exit {proc.exitcode}) without its session counts"
                    self.counts.first_error = self.counts.first_error or reason
                    log.error("%s; its records are kept", reason)
            merge_counts(self.counts, [parts[i] for i in sorted(parts)])
            if self._stopped and not self.counts.interrupted:
                self.counts.interrupted, self.counts.stopped_by = True, "interrupt"
            self.counts.duration_s = round(time.monotonic() - t0, 3)
            merged = merge_records(folders, path)
            if merged != self.counts.requests:
                log.error("merged %d records, the workers counted %d", merged, self.counts.requests)
            sessions = CellPaths(self.config.output).sessions
            try:
                write_text_atomic(sessions, self.counts.to_json() + "\n")
            except OSError as exc:
                raise ResultsUnwritable(exc.errno, f"cannot write {sessions}: {exc.strerror}") from exc
            if len(parts) == len(self._procs):
                shutil.rmtree(CellPaths(self.config.output).workers_dir, ignore_errors=True)
        return self.counts
