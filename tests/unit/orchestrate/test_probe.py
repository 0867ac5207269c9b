"""The cold-start check against real vLLM 0.32 metric captures served on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from kvoffload.orchestrate.probe import check_cold, scrape

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
LMCACHE_WARM = b"# TYPE lmcache_mp_l1_memory_usage_bytes gauge\nlmcache_mp_l1_memory_usage_bytes 4096.0\n"


@pytest.fixture
def server() -> Iterator[str]:
    pages = {
        "/before": (FIXTURES / "metrics-before.txt").read_bytes(),
        "/after": (FIXTURES / "metrics-after.txt").read_bytes(),
        "/lmcache": LMCACHE_WARM,
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


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
