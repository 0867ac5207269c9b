"""GPU telemetry for node-exporter's textfile collector (lab-host side, base deps only).

`kvoffload-lab metrics gpu-textfile` runs this on `vllm` hosts (kvoffload-gpu-telemetry.service of the
vllm role): it polls `nvidia-smi` / `amd-smi` through `kvoffload.metrics.gpu` every `interval_s` and
rewrites one `*.prom` file in node-exporter's textfile folder. node-exporter serves the file with the
host's other metrics, so the client's sampler gets the GPU samples from the `node-<host>` target it
already scrapes: no new port, no new target, one sampler.

The file always holds `kvoffload_gpu_telemetry_up` (1 when the last poll worked, 0 when it failed) and,
after a successful poll, the four gauges of `kvoffload.metrics.gpu` with the parser's labels. A failed
poll drops the GPU series rather than leaving stale values behind. The file is replaced atomically
(temporary file in the same folder, then rename), so node-exporter never reads half of it.

This module must not interpret samples or do network IO.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from kvoffload.atomic import write_text_atomic
from kvoffload.metrics.gpu import GpuTool, parse_gpu_output, run_gpu_tool
from kvoffload.metrics.samples import Sample

log = logging.getLogger(__name__)

UP_METRIC: Final = "kvoffload_gpu_telemetry_up"
# The gauges of kvoffload.metrics.gpu, in the order they are written, with their HELP text.
GPU_GAUGES: Final = {
    "gpu_power_watts": "GPU power draw in watts (nvidia-smi power.draw, amd-smi POWER).",
    "gpu_utilization_percent": "GPU utilization in percent (nvidia-smi utilization.gpu, amd-smi GFX_UTIL).",
    "gpu_memory_used_bytes": "GPU memory in use, in bytes.",
    "gpu_memory_total_bytes": "GPU memory in total, in bytes.",
}
_UP_HELP: Final = "1 when the last poll of the GPU tool worked, 0 when it failed (then no gpu_* series)."
FILE_MODE: Final = 0o644
GpuRunner = Callable[[GpuTool, float], str]


@dataclass(frozen=True)
class Poll:
    """One poll of the GPU tool: its samples, or the error that left none."""

    tool: GpuTool
    samples: tuple[Sample, ...]
    error: str | None = None


class _Families:
    """A fixed list of metric families, registered for one render."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def gpu_series(samples: Iterable[Sample]) -> dict[str, dict[tuple[tuple[str, str], ...], Sample]]:
    """Gauge name -> its series (by sorted label pairs), last sample wins; other names are left out."""
    series: dict[str, dict[tuple[tuple[str, str], ...], Sample]] = {name: {} for name in GPU_GAUGES}
    for s in samples:
        if s.name in series and s.value is not None:
            series[s.name][tuple(sorted(s.labels.items()))] = s
    return series


def render_textfile(poll: Poll) -> str:
    """The Prometheus text exposition of one poll (prometheus-client's renderer: escaping, floats).

    A series the tool printed twice in one poll keeps its last value: node-exporter refuses a file that
    repeats a series. Samples of names other than the four GPU gauges are ignored.
    """
    series = gpu_series(poll.samples)
    families: list[Metric] = []
    up = Metric(UP_METRIC, _UP_HELP, "gauge")
    up.add_sample(UP_METRIC, {"tool": poll.tool}, 0.0 if poll.error else 1.0)
    families.append(up)
    for name, help_text in GPU_GAUGES.items():
        if not series[name]:
            continue
        family = Metric(name, help_text, "gauge")
        for s in series[name].values():
            assert s.value is not None  # filtered above; narrows the type
            family.add_sample(name, dict(s.labels), s.value)
        families.append(family)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode("utf-8")


def write_atomic(path: Path, text: str, mode: int = FILE_MODE) -> None:
    """Replace `path` with `text` atomically (kvoffload.atomic). The temporary name starts with a dot
    and does not end in `.prom`, so the textfile collector never reads it."""
    write_text_atomic(path, text, mode)


def poll_gpu(
    tool: GpuTool, timeout_s: float, runner: GpuRunner = run_gpu_tool, clock: Callable[[], float] = time.time
) -> Poll:
    """Run the tool once and parse its output; a failure is returned in `error`, never raised."""
    ts = clock()
    try:
        samples = parse_gpu_output(tool, runner(tool, timeout_s), "textfile", ts)
    except (RuntimeError, ValueError) as exc:
        return Poll(tool=tool, samples=(), error=f"{type(exc).__name__}: {exc}")
    return Poll(tool=tool, samples=tuple(samples))


def write_once(path: Path, tool: GpuTool, timeout_s: float, runner: GpuRunner = run_gpu_tool) -> Poll:
    """Poll once and replace the file with the result (GPU series only when the poll worked)."""
    poll = poll_gpu(tool, timeout_s, runner)
    write_atomic(path, render_textfile(poll))
    return poll


def run_textfile(
    path: Path,
    tool: GpuTool,
    interval_s: float,
    stop: threading.Event,
    timeout_s: float = 10.0,
    runner: GpuRunner = run_gpu_tool,
) -> int:
    """Rewrite `path` every `interval_s` until `stop` is set, then remove it; return the polls made.

    Removing the file on the way out keeps node-exporter from serving the last values of a sampler that
    no longer runs. A tool failure is logged once per distinct error (not every round) and recovery once.
    """
    polls = 0
    last_error: str | None = None
    start = time.monotonic()
    try:
        while not stop.is_set():
            poll = write_once(path, tool, timeout_s, runner)
            polls += 1
            if poll.error and poll.error != last_error:
                log.warning("%s failed, %s now holds no GPU series: %s", tool, path, poll.error)
            elif not poll.error and last_error:
                log.info("%s answers again: %d samples in %s", tool, len(poll.samples), path)
            last_error = poll.error
            # Next slot on the fixed grid start + k * interval; skip slots a slow poll overran.
            elapsed = time.monotonic() - start
            stop.wait((int(elapsed // interval_s) + 1) * interval_s - elapsed)
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return polls
