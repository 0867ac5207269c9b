"""Reading live counters from the controller: the cold-start check and replay progress.

A cell must start cold: engines freshly restarted (no prefix-cache hits, nothing running) and, on the
offload tiers, an empty lmcache L1 and L2. A reset that leaves an offload tier warm silently inflates
its hit rate, so the check reads the counters themselves rather than trusting the restart.
Only the HTTP metrics endpoints of the cell's targets are read; nothing is changed. During a replay
the same scrapes that count finished requests also give the live page its figures (`live_figures`):
the replicas' prefix-cache counters, KV usage and TTFT histogram, and every 15 s the lmcache-server's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

# current name first, the older alias second (docs/metrics.md)
VLLM_HITS = ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
VLLM_RUNNING = ("vllm:num_requests_running",)
VLLM_SUCCESS = ("vllm:request_success",)
LMCACHE_L1_BYTES = ("lmcache_mp_l1_memory_usage_bytes",)
LMCACHE_L2_BYTES = ("lmcache_mp_l2_usage_bytes",)


# The live page's figures (docs/metrics.md names; current name first, the older alias second)
VLLM_QUERIES = ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")
VLLM_EXT_QUERIES = ("vllm:external_prefix_cache_queries",)
VLLM_EXT_HITS = ("vllm:external_prefix_cache_hits",)
VLLM_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
VLLM_TTFT = "vllm:time_to_first_token_seconds"
LMCACHE_REQUESTED = ("lmcache_mp_lookup_requested_tokens",)
LMCACHE_HIT_L1 = ("lmcache_mp_lookup_hit_l1_tokens",)
LMCACHE_HIT_L2 = ("lmcache_mp_lookup_hit_l2_tokens",)


def parse(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """Sum of every sample per family name (counters under their family name, without `_total`), and
    the TTFT histogram's cumulative count per upper bound (`le`), summed over label sets."""
    sums: dict[str, float] = {}
    ttft: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (family.name, f"{family.name}_total"):
                sums[family.name] = sums.get(family.name, 0.0) + float(sample.value)
            elif family.name == VLLM_TTFT and sample.name == f"{VLLM_TTFT}_bucket":
                le = sample.labels.get("le", "+Inf")
                ttft[le] = ttft.get(le, 0.0) + float(sample.value)
    return sums, ttft


def scrape(url: str, timeout: float = 5.0, client: httpx.Client | None = None) -> dict[str, float]:
    """Sum of every sample per family name (counters under their family name, without `_total`)."""
    resp = client.get(url, timeout=timeout) if client is not None else httpx.get(url, timeout=timeout)
    return parse(resp.text)[0]


def live_figures(
    replicas: Sequence[Mapping[str, float]], lmcache: Mapping[str, float] | None
) -> dict[str, float | None]:
    """The counters the live page turns into rates, summed over the replicas (KV usage: the fullest
    replica's), with the lmcache-server's lookups and L1/L2 bytes (None without one, or before its
    first scrape). A figure no replica exposes is None."""

    def total(names: Sequence[str]) -> float | None:
        values = [v for v in (_value(r, names) for r in replicas) if v is not None]
        return sum(values) if values else None

    usage = [v for v in (_value(r, VLLM_KV_USAGE) for r in replicas) if v is not None]
    lmc = lmcache or {}
    return {
        "local_queries": total(VLLM_QUERIES),
        "local_hits": total(VLLM_HITS),
        "external_queries": total(VLLM_EXT_QUERIES),
        "external_hits": total(VLLM_EXT_HITS),
        "kv_usage": max(usage) if usage else None,
        "lmcache_requested": _value(lmc, LMCACHE_REQUESTED),
        "lmcache_hit_l1": _value(lmc, LMCACHE_HIT_L1),
        "lmcache_hit_l2": _value(lmc, LMCACHE_HIT_L2),
        "l1_bytes": _value(lmc, LMCACHE_L1_BYTES),
        "l2_bytes": _value(lmc, LMCACHE_L2_BYTES),
    }


def _value(sums: Mapping[str, float], names: Sequence[str]) -> float | None:
    return next((sums[n] for n in names if n in sums), None)


# What reads zero on a cold target: (its key in ColdCheck.checked, the families, what a warm value says).
_ColdFigures = tuple[tuple[str, Sequence[str], str], ...]
_COLD_LMCACHE: _ColdFigures = (
    ("l1_bytes", LMCACHE_L1_BYTES, "L1 holds {:.0f} bytes"),
    ("l2_bytes", LMCACHE_L2_BYTES, "L2 holds {:.0f} bytes"),
)
_COLD_VLLM: _ColdFigures = (
    ("prefix_cache_hits", VLLM_HITS, "{:.0f} prefix-cache hits before any traffic"),
    ("running", VLLM_RUNNING, "{:.0f} requests running"),
)


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
        figures = _COLD_LMCACHE if name == "lmcache" else _COLD_VLLM
        checked[name] = {key: _value(sums, names) for key, names, _ in figures}
        problems += [
            f"{name}: {warm.format(value)}" for key, _, warm in figures if (value := checked[name][key])
        ]
    return ColdCheck(not problems, checked, tuple(problems), tuple(unreachable))


class ReplayWatcher:
    """Polls the replicas' request counters during a replay and reports finished requests; with
    `on_live`, also the live page's figures from the same scrapes (`live_figures`, the summed TTFT
    histogram), and the lmcache-server's every `lmcache_every` polls."""

    def __init__(
        self,
        targets: Sequence[Mapping[str, str]],
        on_update: Callable[[int], None],
        interval_s: float = 2.0,
        on_live: Callable[[dict[str, float | None], dict[str, float]], None] | None = None,
        lmcache_every: int = 8,
    ) -> None:
        self.urls = [t["url"] for t in targets if t["name"].startswith("vllm")]
        self.lmcache_url = next((t["url"] for t in targets if t["name"] == "lmcache"), None)
        self.on_update = on_update
        self.on_live = on_live
        self.interval_s = interval_s
        self.lmcache_every = max(1, lmcache_every)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="replay-watcher", daemon=True)
        self._base: float | None = None
        self._polls = 0
        self._lmcache: dict[str, float] | None = None

    def _total(self) -> float | None:
        total = 0.0
        replicas: list[dict[str, float]] = []
        ttft: dict[str, float] = {}
        for url in self.urls:
            try:
                sums, buckets = parse(httpx.get(url, timeout=2.0).text)
            except httpx.HTTPError:
                return None
            total += _value(sums, VLLM_SUCCESS) or 0.0
            replicas.append(sums)
            for le, count in buckets.items():
                ttft[le] = ttft.get(le, 0.0) + count
        if self.on_live is not None:
            if self.lmcache_url is not None and self._polls % self.lmcache_every == 0:
                # a failed scrape: the next round tries again; the TargetWatch judges outages
                with contextlib.suppress(httpx.HTTPError):
                    self._lmcache = scrape(self.lmcache_url, timeout=2.0)
            self._polls += 1
            self.on_live(live_figures(replicas, self._lmcache), ttft)
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
