"""Timing on a device the way the device tool's METHOD.md asks: warm-up, CUDA events, repeats, median;
CUDA-graph capture for replayed steps; memory release between measurements.

No measurement logic of its own. torch is imported inside `import_torch` only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvoffload.errors import UserError

if TYPE_CHECKING:
    from torch import device as Device


def import_torch() -> Any:
    """The torch module, or a UserError saying how to get it."""
    try:
        import torch
    except ImportError as exc:
        raise UserError(
            "calibrate: PyTorch is not installed; install it on the GPU host "
            "(pip install 'kvoffload-lab[calibrate]') or pass --from-raw to convert an earlier run"
        ) from exc
    return torch


class Timer:
    """Median seconds per call of a function: device events on CUDA, a host clock on CPU."""

    def __init__(self, torch: Any, device: Device, warmup: int, repeats: int) -> None:
        self._torch = torch
        self._device = device
        self.warmup = warmup
        self.repeats = repeats
        self.clock = "CUDA events" if device.type == "cuda" else "a host clock"

    def sync(self) -> None:
        if self._device.type == "cuda":
            self._torch.cuda.synchronize(self._device)

    def median_s(self, fn: Callable[[], object], inner: int = 1) -> float:
        """Median over `repeats` of the time of `inner` back-to-back calls, divided by `inner`."""
        for _ in range(self.warmup):
            fn()
        self.sync()
        runs: list[float] = []
        for _ in range(self.repeats):
            if self._device.type == "cuda":
                start = self._torch.cuda.Event(enable_timing=True)
                end = self._torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    fn()
                end.record()
                end.synchronize()
                runs.append(float(start.elapsed_time(end)) / 1000.0 / inner)
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                runs.append((time.perf_counter() - t0) / inner)
        return statistics.median(runs)


def is_oom(torch: Any, exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return bool(oom is not None and isinstance(exc, oom)) or "out of memory" in str(exc)


def release(torch: Any, device: Device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def graphed(torch: Any, device: Device, fn: Callable[[], object]) -> tuple[Callable[[], object], Any]:
    """A CUDA graph replay of fn (and the graph, to keep alive), or fn itself off CUDA."""
    if device.type != "cuda":
        return fn, None
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay, graph
