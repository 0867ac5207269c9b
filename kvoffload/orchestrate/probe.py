"""Reading live counters from the controller: the cold-start check and replay progress.

A cell must start cold: engines freshly restarted (no prefix-cache hits, nothing running) and, on the
offload tiers, an empty lmcache L1 and L2. A reset that leaves an offload tier warm silently inflates
its hit rate, so the check reads the counters themselves rather than trusting the restart.
Only the HTTP metrics endpoints of the cell's targets are read; nothing is changed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

# current name first, the older alias second (DESIGN.md section 7)
VLLM_HITS = ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
VLLM_RUNNING = ("vllm:num_requests_running",)
VLLM_SUCCESS = ("vllm:request_success",)
LMCACHE_L1_BYTES = ("lmcache_mp_l1_memory_usage_bytes",)
LMCACHE_L2_BYTES = ("lmcache_mp_l2_usage_bytes",)


def scrape(url: str, timeout: float = 5.0, client: httpx.Client | None = None) -> dict[str, float]:
    """Sum of every sample per family name (counters under their family name, without `_total`)."""
    resp = client.get(url, timeout=timeout) if client is not None else httpx.get(url, timeout=timeout)
    text = resp.text
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (family.name, f"{family.name}_total"):
                sums[family.name] = sums.get(family.name, 0.0) + float(sample.value)
    return sums


def _value(sums: Mapping[str, float], names: Sequence[str]) -> float | None:
    return next((sums[n] for n in names if n in sums), None)


@dataclass(frozen=True)
class ColdCheck:
    cold: bool
    checked: dict[str, dict[str, float | None]]
    problems: tuple[str, ...]
    unreachable: tuple[str, ...]


def check_cold(targets: Sequence[Mapping[str, str]]) -> ColdCheck:
    """Read vLLM and lmcache targets (`{name, url}`) and say whether every one of them is cold."""
    checked: dict[str, dict[str, float | None]] = {}
    problems: list[str] = []
    unreachable: list[str] = []
    for target in targets:
        name, url = target["name"], target["url"]
        if not (name.startswith("vllm") or name == "lmcache"):
            continue
        try:
            sums = scrape(url)
        except httpx.HTTPError as exc:
            unreachable.append(f"{name} ({url}): {type(exc).__name__}")
            continue
        if name == "lmcache":
            l1, l2 = _value(sums, LMCACHE_L1_BYTES), _value(sums, LMCACHE_L2_BYTES)
            checked[name] = {"l1_bytes": l1, "l2_bytes": l2}
            if l1:
                problems.append(f"{name}: L1 holds {l1:.0f} bytes")
            if l2:
                problems.append(f"{name}: L2 holds {l2:.0f} bytes")
        else:
            hits, running = _value(sums, VLLM_HITS), _value(sums, VLLM_RUNNING)
            checked[name] = {"prefix_cache_hits": hits, "running": running}
            if hits:
                problems.append(f"{name}: {hits:.0f} prefix-cache hits before any traffic")
            if running:
                problems.append(f"{name}: {running:.0f} requests running")
    return ColdCheck(not problems, checked, tuple(problems), tuple(unreachable))


class ReplayWatcher:
    """Polls the replicas' request counters during a replay and reports finished requests."""

    def __init__(
        self, targets: Sequence[Mapping[str, str]], on_update: Callable[[int], None], interval_s: float = 2.0
    ) -> None:
        self.urls = [t["url"] for t in targets if t["name"].startswith("vllm")]
        self.on_update = on_update
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="replay-watcher", daemon=True)
        self._base: float | None = None

    def _total(self) -> float | None:
        total = 0.0
        for url in self.urls:
            try:
                value = _value(scrape(url, timeout=2.0), VLLM_SUCCESS)
            except httpx.HTTPError:
                return None
            total += value or 0.0
        return total

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            total = self._total()
            if total is None:
                continue
            if self._base is None:
                self._base = total
            self.on_update(int(total - self._base))

    def __enter__(self) -> ReplayWatcher:
        self._base = self._total()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
