"""The in-place reset and its probe, against a scripted replica and cache server (httpx MockTransport)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from kvoffload.orchestrate.cell.coldstart import CacheReset, Endpoints, ResetFailed, probe_problems

TARGETS = [
    {"name": "vllm-n1-0", "url": "http://10.0.0.2:8000/metrics"},
    {"name": "lmcache", "url": "http://10.0.0.2:8080/metrics"},
    {"name": "node-n1", "url": "http://10.0.0.2:9100/metrics"},
]
PAYLOAD = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
           "stream_options": {"include_usage": True}, "max_tokens": 64}  # fmt: skip


class FakeLab:
    """One replica and one cache server whose counters move as a warm or a cold cache would."""

    def __init__(
        self, *, warm_after_reset: bool = False, busy_resets: int = 0, dev_mode: bool = True
    ) -> None:
        self.warm = True  # the previous cell left the caches full
        self.warm_after_reset = warm_after_reset
        self.busy_resets = busy_resets
        self.dev_mode = dev_mode
        self.hits = 100.0
        self.external = 50.0
        self.lookup_hits = 400.0
        self.lookups = 10.0
        self.calls: list[str] = []
        self.bodies: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls.append(
            f"{request.method} {request.url.host}:{request.url.port}{path}?{request.url.query.decode()}"
        )
        if path == "/reset_prefix_cache":
            if not self.dev_mode:
                return httpx.Response(404, json={"detail": "Not Found"})
            if self.busy_resets:
                self.busy_resets -= 1
                return httpx.Response(200, json={"success": False})
            self.warm = self.warm_after_reset
            return httpx.Response(200, json={"success": True})
        if path == "/cache/clear":
            return httpx.Response(200, json={"status": "ok", "cleared": {"tier": "l1"}})
        if path == "/v1/chat/completions":
            self.bodies.append(json.loads(request.content))
            cached = 96 if self.warm else 0
            self.lookups += 1
            if self.warm:
                self.hits += 64
                self.external += 32
                self.lookup_hits += 256
            self.warm = True  # the probe itself fills the caches
            usage = {"prompt_tokens": 128, "prompt_tokens_details": {"cached_tokens": cached}}
            return httpx.Response(200, json={"choices": [], "usage": usage})
        if path == "/metrics" and request.url.port == 8000:
            text = (
                "# TYPE vllm:prefix_cache_hits_total counter\n"
                f'vllm:prefix_cache_hits_total{{engine="0"}} {self.hits}\n'
                "# TYPE vllm:external_prefix_cache_hits_total counter\n"
                f'vllm:external_prefix_cache_hits_total{{engine="0"}} {self.external}\n'
                "# TYPE vllm:num_requests_running gauge\n"
                'vllm:num_requests_running{engine="0"} 0\n'
            )
            return httpx.Response(200, text=text)
        if path == "/metrics" and request.url.port == 8080:
            text = (
                "# TYPE lmcache_mp_lookup_hit_tokens_total counter\n"
                f"lmcache_mp_lookup_hit_tokens_total {self.lookup_hits}\n"
                "# TYPE lmcache_mp_lookups_requests_total counter\n"
                f"lmcache_mp_lookups_requests_total {self.lookups}\n"
            )
            return httpx.Response(200, text=text)
        return httpx.Response(404)


def _reset(lab: FakeLab, **kwargs: Any) -> CacheReset:
    client = httpx.Client(transport=httpx.MockTransport(lab.handler))
    return CacheReset(
        Endpoints.from_targets(TARGETS), external=True, client=client, sleep=lambda _s: None, **kwargs
    )


def test_endpoints_come_from_the_cells_metric_targets() -> None:
    ends = Endpoints.from_targets(TARGETS)
    assert ends.replicas == {"vllm-n1-0": "http://10.0.0.2:8000"}
    assert ends.lmcache == "http://10.0.0.2:8080"
    assert Endpoints.from_targets(TARGETS[:1]).lmcache is None


def test_a_reset_that_empties_the_caches_is_proven_cold_and_reset_again_after_the_probe() -> None:
    lab = FakeLab(busy_resets=2)
    record = _reset(lab).run(PAYLOAD)
    assert record.cold
    # two {"success": false} answers (blocks still held), then success; once more after the probe
    assert record.resets == {"vllm-n1-0": 4}
    assert record.lmcache_cleared == 2
    (probe,) = record.probes
    assert probe["cached_tokens"] == 0 and probe["local_hits"] == 0 and probe["external_hits"] == 0
    assert probe["lmcache_hit_tokens"] == 0 and probe["lmcache_lookups"] == 1 and probe["problems"] == []
    resets = [c for c in lab.calls if "/reset_prefix_cache" in c]
    assert all(c.endswith("?reset_external=true") for c in resets)
    # the probe goes to the replica itself, not through Caddy, asks for one token and does not stream
    assert lab.bodies == [{"model": "m", "messages": PAYLOAD["messages"], "stream": False, "max_tokens": 1}]
    assert lab.warm is False  # the probe's own KV was dropped again


def test_a_cache_still_warm_after_the_reset_fails_with_the_counters_that_show_it() -> None:
    lab = FakeLab(warm_after_reset=True)
    with pytest.raises(ResetFailed) as info:
        _reset(lab).run(PAYLOAD)
    text = str(info.value)
    assert text.startswith("vllm-n1-0: not cold after the reset: ")
    for part in ("96 cached prompt tokens", "64 local prefix-cache hits", "32 external (connector)",
                 "256 LMCache lookup hit tokens"):  # fmt: skip
        assert part in text


def test_a_replica_without_dev_mode_is_named() -> None:
    with pytest.raises(ResetFailed, match="without VLLM_SERVER_DEV_MODE=1"):
        _reset(FakeLab(dev_mode=False)).run(PAYLOAD)


def test_a_reset_refused_past_its_bound_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000, 1))
    monkeypatch.setattr("kvoffload.orchestrate.cell.coldstart.time.monotonic", lambda: float(next(clock)))
    with pytest.raises(ResetFailed, match=r"did not succeed within 5 s \(\d+ attempts, last HTTP 200"):
        _reset(FakeLab(busy_resets=10**6), bound_s=5, retry_s=1).run(PAYLOAD)


def test_probe_problems_say_when_nothing_was_proven() -> None:
    cold = {"prompt_tokens": 10, "cached_tokens": 0, "local_hits": 0, "external_hits": 0,
            "lmcache_hit_tokens": 0, "lmcache_lookups": 1}  # fmt: skip
    assert probe_problems(cold, offload=True) == []
    assert probe_problems({**cold, "lmcache_lookups": 0}, offload=True) == [
        "the probe made no LMCache lookup: the connector was not consulted, nothing proven"
    ]
    assert probe_problems({**cold, "lmcache_lookups": 0}, offload=False) == []
    assert probe_problems({**cold, "prompt_tokens": None}, offload=False) == [
        "the probe reported no prompt tokens (usage missing): nothing was proven"
    ]
    # a counter the server does not export (None) is no evidence either way, and no problem
    assert probe_problems({**cold, "external_hits": None}, offload=False) == []


def test_a_later_probe_may_load_the_first_probes_kv_but_must_miss_its_own_gpu_cache() -> None:
    later = {"prompt_tokens": 128, "cached_tokens": 96, "local_hits": 0, "external_hits": 96,
             "lmcache_hit_tokens": 96, "lmcache_lookups": 1}  # fmt: skip
    assert probe_problems(later, offload=True, first=False) == []
    assert probe_problems(later, offload=True, first=True) == [
        "96 cached prompt tokens", "96 external (connector) prefix-cache hits", "96 LMCache lookup hit tokens"
    ]  # fmt: skip
    own = {**later, "cached_tokens": 128, "local_hits": 32}
    assert probe_problems(own, offload=True, first=False) == [
        "32 local prefix-cache hits",
        "32 cached prompt tokens beyond the external hits (the first probe's KV)",
    ]
    # without a shared server every probe is judged in full
    assert probe_problems({**later, "lmcache_lookups": None}, offload=False, first=False) != []


def test_without_a_probe_prompt_the_reset_still_empties_everything() -> None:
    lab = FakeLab()
    record = _reset(lab).run(None)
    assert record.cold and record.probes == [] and record.resets == {"vllm-n1-0": 1}
    assert lab.warm is False
