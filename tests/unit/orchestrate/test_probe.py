"""The cold-start check against real vLLM 0.32 metric captures served on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoffload.orchestrate.cell.watch import check_cold, scrape
from tests.support.loopback import serve_pages

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
LMCACHE_WARM = b"# TYPE lmcache_mp_l1_memory_usage_bytes gauge\nlmcache_mp_l1_memory_usage_bytes 4096.0\n"


@pytest.fixture
def server() -> Iterator[str]:
    pages = {
        "/before": (FIXTURES / "metrics-before.txt").read_bytes(),
        "/after": (FIXTURES / "metrics-after.txt").read_bytes(),
        "/lmcache": LMCACHE_WARM,
    }

    with serve_pages(pages) as base:
        yield base


def test_fresh_engine_is_cold_and_used_one_is_not(server: str) -> None:
    assert scrape(f"{server}/after")["vllm:prefix_cache_hits"] == 2176.0
    cold = check_cold([{"name": "vllm-h1-0", "url": f"{server}/before"}])
    assert cold.cold and cold.checked["vllm-h1-0"]["prefix_cache_hits"] == 0.0
    warm = check_cold(
        [{"name": "vllm-h1-0", "url": f"{server}/after"}, {"name": "lmcache", "url": f"{server}/lmcache"}]
    )
    assert not warm.cold
    assert warm.problems == (
        "vllm-h1-0: 2176 prefix-cache hits before any traffic",
        "lmcache: L1 holds 4096 bytes",
    )


def test_unreachable_target_is_reported_not_fatal() -> None:
    result = check_cold(
        [{"name": "vllm-h1-0", "url": "http://127.0.0.1:9/metrics"}, {"name": "node-h1", "url": "x"}]
    )
    assert result.cold and result.unreachable and result.unreachable[0].startswith("vllm-h1-0")


def test_live_figures_from_the_real_captures() -> None:
    from kvoffload.orchestrate.cell.watch import live_figures, parse

    replica, ttft = parse((FIXTURES / "metrics-after.txt").read_text())
    lmcache_dir = FIXTURES.parent / "lmcache-0.5.6-cpu"
    lmcache, _ = parse((lmcache_dir / "metrics-fs_native-after-replay.txt").read_text())
    # two replicas alike: counters add up, KV usage is the fullest replica's
    fuller = {**replica, "vllm:kv_cache_usage_perc": 0.75}
    figures = live_figures([replica, fuller], lmcache)
    assert figures["local_queries"] == 2 * 3069.0 and figures["local_hits"] == 2 * 2176.0
    assert figures["external_queries"] == 0.0 and figures["kv_usage"] == 0.75
    assert figures["lmcache_requested"] == 294656.0 and figures["lmcache_hit_l1"] == 260352.0
    assert figures["lmcache_hit_l2"] == 0.0
    assert figures["l1_bytes"] == 8.51968e06 and figures["l2_bytes"] == 1.2713984e07
    # the capture's 12 requests: 11 within 10 ms, one more by 20 ms
    assert ttft["0.01"] == 11.0 and ttft["0.02"] == 12.0 and ttft["+Inf"] == 12.0
    # before the lmcache-server's first scrape, and on a replica that exposes no such family
    bare = live_figures([{}], None)
    assert bare["local_queries"] is None and bare["l1_bytes"] is None and bare["kv_usage"] is None
