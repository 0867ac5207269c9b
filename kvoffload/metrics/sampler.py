"""The periodic sampler and the one-shot snapshot (lab-host side, base deps only).

Every `interval_s` it scrapes all targets at once (one thread each, so a dead target cannot delay the
others by more than `timeout_s`) and appends the samples to `<output>/<target>.jsonl`, flushing after
each round so a killed sampler loses at most the round in flight. A failed scrape writes one
`up == 0` sample with the error, never raises. `run()` returns when the stop event is set (the CLI
sets it on SIGTERM/SIGINT) or, given a `ReplayLease`, once the replay it samples for is over (the
replay role runs the replay under `flock`, so a sampler whose stop never comes, after a Ctrl-C that
canceled the playbook or a lost controller, ends with its replay instead of scraping dead targets
until the next run); rounds that overrun are skipped, not queued.

This module must not interpret samples; analysis lives on the controller.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import httpx

from kvoffload.atomic import write_text_atomic
from kvoffload.metrics.gpu import GpuTool, parse_gpu_output, run_gpu_tool
from kvoffload.metrics.samples import Sample, parse_exposition, to_jsonl, up_sample
from kvoffload.metrics.targets import GpuTarget, HttpTarget

log = logging.getLogger(__name__)

GpuRunner = Callable[[GpuTool, float], str]


class Scraper:
    """Scrapes a fixed set of targets once per call; owns the HTTP client."""

    def __init__(
        self,
        http_targets: Sequence[HttpTarget],
        gpu_targets: Sequence[GpuTarget] = (),
        timeout_s: float = 10.0,
        client: httpx.Client | None = None,
        gpu_runner: GpuRunner = run_gpu_tool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.http_targets = list(http_targets)
        self.gpu_targets = list(gpu_targets)
        self.timeout_s = timeout_s
        self._client = client or httpx.Client(timeout=timeout_s, follow_redirects=False)
        self._gpu_runner = gpu_runner
        self._clock = clock
        workers = max(1, len(self.http_targets) + len(self.gpu_targets))
        self._pool = ThreadPoolExecutor(max_workers=min(workers, 32), thread_name_prefix="scrape")

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.http_targets] + [t.name for t in self.gpu_targets]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def _scrape_http(self, target: HttpTarget) -> list[Sample]:
        ts = self._clock()
        try:
            resp = self._client.get(target.url)
            resp.raise_for_status()
            samples = parse_exposition(resp.text, target.name, ts)
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("scrape of %s (%s) failed: %s", target.name, target.url, exc)
            return [up_sample(target.name, ts, f"{type(exc).__name__}: {exc}")]
        return [*samples, up_sample(target.name, ts, None)]

    def _scrape_gpu(self, target: GpuTarget) -> list[Sample]:
        ts = self._clock()
        try:
            text = self._gpu_runner(target.tool, self.timeout_s)
            samples = parse_gpu_output(target.tool, text, target.name, ts)
        except (RuntimeError, ValueError) as exc:
            log.warning("GPU poll %s (%s) failed: %s", target.name, target.tool, exc)
            return [up_sample(target.name, ts, f"{type(exc).__name__}: {exc}")]
        return [*samples, up_sample(target.name, ts, None)]

    def scrape(self) -> dict[str, list[Sample]]:
        """One round over all targets, concurrently; target name -> its samples (always non-empty)."""
        futures = {t.name: self._pool.submit(self._scrape_http, t) for t in self.http_targets}
        futures.update({t.name: self._pool.submit(self._scrape_gpu, t) for t in self.gpu_targets})
        return {name: f.result() for name, f in futures.items()}


class ReplayLease:
    """Whether the replay a sampler samples for still runs. The replay holds an flock on `path` for its
    whole life (the replay role runs it as `flock PATH kvoffload-lab replay ...`), and the kernel drops
    the lock however the replay ends. The sampler starts first: the lease is over once the lock was
    held and is free again, or when no replay took it within `grace_s`."""

    def __init__(self, path: Path, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.grace_s = grace_s
        self._clock = clock
        self._start = clock()
        self._seen = False  # the replay held the lock at some check

    def held(self) -> bool:
        """Whether a process holds the lock now (asked with a shared lock taken and dropped at once)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # also drops the shared lock, if this check took it
        return False

    def over(self) -> str | None:
        """Why the sampler should stop now; None while the replay runs, or may still start."""
        if self.held():
            self._seen = True
            return None
        if self._seen:
            return f"the replay that held {self.path} has ended"
        if self._clock() - self._start > self.grace_s:
            return f"no replay took {self.path} within {self.grace_s:g} s"
        return None


def run_sampler(
    scraper: Scraper,
    output_dir: Path,
    interval_s: float,
    stop: threading.Event,
    lease: ReplayLease | None = None,
) -> int:
    """Scrape every `interval_s` into `<output_dir>/<target>.jsonl` until `stop` is set or `lease` is
    over (checked before each round); return the rounds."""
    output_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, IO[str]] = {}
    rounds = 0
    try:
        for name in scraper.names:
            files[name] = (output_dir / f"{name}.jsonl").open("a", encoding="utf-8")
        start = time.monotonic()
        while not stop.is_set():
            why = lease.over() if lease is not None else None
            if why is not None:
                log.warning("sampler stops after %d round(s): %s", rounds, why)
                break
            for name, samples in scraper.scrape().items():
                files[name].writelines(to_jsonl(samples))
                files[name].flush()
            rounds += 1
            # Next slot on the fixed grid start + k * interval; skip slots a slow round overran.
            elapsed = time.monotonic() - start
            next_slot = (int(elapsed // interval_s) + 1) * interval_s
            stop.wait(next_slot - elapsed)
    finally:
        for f in files.values():
            f.close()
    return rounds


def take_snapshot(scraper: Scraper, output_file: Path) -> int:
    """One round over all targets into one file (all targets together); return the sample count."""
    output_file.parent.mkdir(parents=True, exist_ok=True)
    rows = [s for samples in scraper.scrape().values() for s in samples]
    write_text_atomic(output_file, "".join(to_jsonl(rows)))  # whole or not at all (a full disk)
    return len(rows)
