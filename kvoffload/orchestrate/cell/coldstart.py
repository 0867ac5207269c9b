"""Making a cell cold without restarting its engines, and proving it (docs/architecture.md section 5).

An engine restart reloads the model (minutes for a 70B model on real hardware), so between cells
that share an engine configuration the orchestrator empties the caches in place instead:
- every replica: vLLM `POST /reset_prefix_cache?reset_external=true` (needs `VLLM_SERVER_DEV_MODE=1`).
  vLLM answers 200 `{"success": false}` while blocks are still held, so it is retried within a bound;
  `reset_external` also makes the connector clear what it holds in the LMCache server.
- the lmcache-server: `POST /cache/clear` (L1). L2 (the nvme tier) is not this module's: `/cache/clear`
  takes L1 only, and its files live on the cache host. The lmcache_server role empties it through the
  server's `DELETE /cache/objects`, at the end of the previous cell's collect (so this probe finds it
  empty) and at the start of this cell's replay (dropping what the probes stored); see
  kvoffload/orchestrate/playbooks_api.py CLEAR_L2_VAR and CLEAR_L2_NEXT_VAR.
Then a probe proves the cell cold from counter deltas, never from absolute values (counters survive
a reset): one request per replica that repeats a prompt the previous cell sent, directly to the
replica. The first probe must see no cached tokens, no local or external prefix-cache hits and no
LMCache lookup hits: the replica's GPU cache and the shared server hold nothing of that prompt. The
probe itself stores its KV in the server, so the next replicas' probes may load exactly that back:
for them only their own GPU prefix cache must miss. Every replica's cache and L1 are emptied again
after each probe. Any failure here is a `ResetFailed`; the caller then falls back to restarting the engines.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvoffload.orchestrate.cell.watch import scrape

# Counter families (prometheus_client names them without `_total`); current vLLM name first.
VLLM_LOCAL_HITS = ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
VLLM_EXTERNAL_HITS = ("vllm:external_prefix_cache_hits",)
VLLM_RUNNING = ("vllm:num_requests_running",)
LMCACHE_HIT_TOKENS = ("lmcache_mp_lookup_hit_tokens",)
LMCACHE_LOOKUPS = ("lmcache_mp_lookups_requests",)
RESET_BOUND_S = 30.0
RESET_RETRY_S = 0.5
PROBE_TIMEOUT_S = 300.0


class ResetFailed(RuntimeError):
    """The caches could not be emptied in place, or the probe saw them warm: restart instead."""


@dataclass(frozen=True)
class Endpoints:
    """Base URLs of a cell's replicas (by target name) and of its lmcache-server (None on gpu)."""

    replicas: dict[str, str]
    lmcache: str | None

    @classmethod
    def from_targets(cls, targets: Sequence[Mapping[str, str]]) -> Endpoints:
        """From the cell's metric targets (`{name, url}`, url ending in /metrics)."""

        def base(url: str) -> str:
            return url.removesuffix("/metrics").rstrip("/")

        replicas = {t["name"]: base(t["url"]) for t in targets if t["name"].startswith("vllm")}
        lmcache = next((base(t["url"]) for t in targets if t["name"] == "lmcache"), None)
        return cls(replicas, lmcache)

    def metrics(self, base: str) -> str:
        return f"{base}/metrics"


def _first(sums: Mapping[str, float], names: Sequence[str]) -> float | None:
    return next((sums[n] for n in names if n in sums), None)


@dataclass
class ResetRecord:
    """What the reset did, for cell.json `cold_start`."""

    method: str = "reset"
    cold: bool = False
    resets: dict[str, int] = field(default_factory=dict)  # replica -> requests until {"success": true}
    lmcache_cleared: int = 0
    probes: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "cold": self.cold,
            "resets": self.resets,
            "lmcache_cleared": self.lmcache_cleared,
            "probes": self.probes,
            "seconds": round(self.seconds, 3),
        }


class CacheReset:
    """Empties one cell's caches in place and proves them empty with probes."""

    def __init__(
        self,
        endpoints: Endpoints,
        *,
        external: bool,
        client: httpx.Client | None = None,
        bound_s: float = RESET_BOUND_S,
        retry_s: float = RESET_RETRY_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoints = endpoints
        self.external = external
        self.client = client or httpx.Client(timeout=httpx.Timeout(30.0, read=PROBE_TIMEOUT_S))
        self.bound_s = bound_s
        self.retry_s = retry_s
        self.sleep = sleep

    # -- emptying ---------------------------------------------------------------------------------
    def reset_replica(self, name: str, base: str) -> int:
        """POST /reset_prefix_cache until it answers {"success": true}; returns the attempts."""
        params = {"reset_external": "true"} if self.external else {}
        deadline = time.monotonic() + self.bound_s
        attempts = 0
        last = ""
        while True:
            attempts += 1
            try:
                resp = self.client.post(f"{base}/reset_prefix_cache", params=params)
            except httpx.HTTPError as exc:
                raise ResetFailed(f"{name}: reset_prefix_cache: {type(exc).__name__}: {exc}") from exc
            if resp.status_code == 404:
                raise ResetFailed(
                    f"{name}: POST /reset_prefix_cache answered 404: the replica runs without "
                    "VLLM_SERVER_DEV_MODE=1"
                )
            if resp.status_code == 200 and _success(resp):
                return attempts
            last = f"HTTP {resp.status_code} {resp.text[:120]!r}"
            if time.monotonic() + self.retry_s > deadline:
                raise ResetFailed(
                    f"{name}: reset_prefix_cache did not succeed within {self.bound_s:.0f} s "
                    f"({attempts} attempts, last {last})"
                )
            self.sleep(self.retry_s)

    def clear_lmcache(self) -> None:
        """POST /cache/clear on the lmcache-server (L1; LMCache 0.5.6 clears no other tier)."""
        if self.endpoints.lmcache is None:
            return
        try:
            resp = self.client.post(
                f"{self.endpoints.lmcache}/cache/clear", json={"tier": "l1", "force": False}
            )
        except httpx.HTTPError as exc:
            raise ResetFailed(f"lmcache: /cache/clear: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise ResetFailed(f"lmcache: /cache/clear answered HTTP {resp.status_code} {resp.text[:120]!r}")

    def empty_all(self, record: ResetRecord) -> None:
        """Every replica's prefix cache (and, through reset_external, its connector's), then L1."""
        for name, base in self.endpoints.replicas.items():
            record.resets[name] = record.resets.get(name, 0) + self.reset_replica(name, base)
        self.clear_lmcache()
        if self.endpoints.lmcache is not None:
            record.lmcache_cleared += 1

    # -- proving ----------------------------------------------------------------------------------
    def _counters(self, base: str) -> dict[str, float]:
        try:
            return scrape(self.endpoints.metrics(base), client=self.client)
        except httpx.HTTPError as exc:
            raise ResetFailed(f"{base}/metrics: {type(exc).__name__}: {exc}") from exc

    def probe(
        self, name: str, base: str, payload: Mapping[str, Any], *, first: bool = True
    ) -> dict[str, Any]:
        """One request repeating a prompt of the previous cell; the counter deltas it caused. `first`:
        no probe ran before it (later ones may load the first one's KV from the shared server)."""
        before = self._counters(base)
        cache_before = self._counters(self.endpoints.lmcache) if self.endpoints.lmcache else {}
        body = {k: v for k, v in payload.items() if k != "stream_options"}
        body |= {"stream": False, "max_tokens": 1}
        try:
            resp = self.client.post(f"{base}/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise ResetFailed(f"{name}: probe request: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise ResetFailed(f"{name}: probe request answered HTTP {resp.status_code} {resp.text[:200]!r}")
        usage = resp.json().get("usage") or {}
        after = self._counters(base)
        cache_after = self._counters(self.endpoints.lmcache) if self.endpoints.lmcache else {}

        def delta(now: Mapping[str, float], then: Mapping[str, float], names: Sequence[str]) -> float | None:
            a, b = _first(now, names), _first(then, names)
            return None if a is None else a - (b or 0.0)

        details = usage.get("prompt_tokens_details") or {}
        result: dict[str, Any] = {
            "replica": name,
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": details.get("cached_tokens"),
            "local_hits": delta(after, before, VLLM_LOCAL_HITS),
            "external_hits": delta(after, before, VLLM_EXTERNAL_HITS),
        }
        if self.endpoints.lmcache is not None:
            result["lmcache_hit_tokens"] = delta(cache_after, cache_before, LMCACHE_HIT_TOKENS)
            result["lmcache_lookups"] = delta(cache_after, cache_before, LMCACHE_LOOKUPS)
        result["problems"] = probe_problems(result, offload=self.endpoints.lmcache is not None, first=first)
        return result

    def run(self, probe_payload: Mapping[str, Any] | None) -> ResetRecord:
        """Empty, then probe each replica in turn (emptying again after each); raises ResetFailed."""
        t0 = time.monotonic()
        record = ResetRecord()
        self.empty_all(record)
        if probe_payload is not None:
            # One replica at a time: a probe stores its KV in the shared server, where the next
            # replica's probe would find it.
            for i, (name, base) in enumerate(self.endpoints.replicas.items()):
                result = self.probe(name, base, probe_payload, first=i == 0)
                record.probes.append(result)
                self.empty_all(record)
                if result["problems"]:
                    record.seconds = time.monotonic() - t0
                    raise ResetFailed(f"{name}: not cold after the reset: " + "; ".join(result["problems"]))
        for name, base in self.endpoints.replicas.items():
            running = _first(self._counters(base), VLLM_RUNNING)
            if running:
                raise ResetFailed(f"{name}: {running:.0f} requests still running after the reset")
        record.cold = True
        record.seconds = time.monotonic() - t0
        return record


def probe_problems(result: Mapping[str, Any], *, offload: bool, first: bool = True) -> list[str]:
    """Why a probe's counter deltas say the cell is not cold (empty when it is). A probe after the
    first on an offload tier may find the first probe's KV in the shared server: only its replica's
    own prefix cache is judged then (local hits, and cached tokens beyond the external ones)."""
    problems = []
    if offload and not first:
        local_cached = (result.get("cached_tokens") or 0) - (result.get("external_hits") or 0)
        checks: tuple[tuple[str, Any, str], ...] = (
            ("local_hits", result.get("local_hits"), "local prefix-cache hits"),
            ("cached_tokens", local_cached if local_cached > 0 else 0, "cached prompt tokens beyond the "
             "external hits (the first probe's KV)"),
        )  # fmt: skip
    else:
        checks = tuple(
            (key, result.get(key), what)
            for key, what in (
                ("cached_tokens", "cached prompt tokens"),
                ("local_hits", "local prefix-cache hits"),
                ("external_hits", "external (connector) prefix-cache hits"),
                ("lmcache_hit_tokens", "LMCache lookup hit tokens"),
            )
        )
    for _key, value, what in checks:
        if value:
            problems.append(f"{value:.0f} {what}")
    if not result.get("prompt_tokens"):
        problems.append("the probe reported no prompt tokens (usage missing): nothing was proven")
    if offload and result.get("lmcache_lookups") == 0:
        problems.append("the probe made no LMCache lookup: the connector was not consulted, nothing proven")
    return problems


def _success(resp: httpx.Response) -> bool:
    """vLLM answers {"success": bool}; older builds answered an empty 200."""
    try:
        body = resp.json()
    except ValueError:
        return not resp.content.strip()
    return not isinstance(body, dict) or body.get("success", True) is not False
