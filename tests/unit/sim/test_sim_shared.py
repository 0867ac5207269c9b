"""What the simulated engine and cache server share (http_common, metrics_common, args_common).

Each piece is checked through the servers that use it where it shapes their answers: both apps
answer an unknown path or method as FastAPI does (the engine's with its replica header), both serve
prometheus text on `/metrics`; the shared buckets expose what prometheus-client's own Histogram
exposes for the same observations; the shared argparse types keep argparse's messages.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Iterable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kvoffload.errors import UserError
from kvoffload.sim.args_common import checked_type, json_number
from kvoffload.sim.cache_args import parse_cache_args
from kvoffload.sim.cache_metrics import CacheMetrics, OtelHistogram
from kvoffload.sim.cache_server import CacheServer, CacheStore
from kvoffload.sim.engine_args import derive_capacity, parse_engine_args
from kvoffload.sim.engine_metrics import BatchHistogram
from kvoffload.sim.engine_server import REPLICA_HEADER, EngineServer
from kvoffload.sim.metrics_common import Buckets
from kvoffload.sim.profile import load_profile

Answer = tuple[int, dict[str, str], str]


def _answers(app: web.Application, requests: list[tuple[str, str]]) -> list[Answer]:
    """Status, headers and body of each (method, path) against `app` on a loopback port."""

    async def scenario() -> list[Answer]:
        async with TestClient(TestServer(app)) as client:
            out = []
            for method, path in requests:
                resp = await client.request(method, path)
                out.append((resp.status, dict(resp.headers), await resp.text()))
            return out

    return asyncio.run(scenario())


def _engine_app() -> tuple[EngineServer, web.Application]:
    args = parse_engine_args(["sim-llama", "--host", "127.0.0.1", "--port", "8123", "--max-model-len", "512"])
    profile = load_profile("tiny")
    server = EngineServer(args, profile, derive_capacity(args, profile))
    return server, server.app()


def _cache_app() -> web.Application:
    args = parse_cache_args(["--l1-size-gb", "0.01", "--eviction-policy", "LRU"])
    metrics = CacheMetrics()
    return CacheServer(args, CacheStore(args, load_profile("tiny").disk, metrics), metrics).http_app()


FASTAPI_ERRORS = [
    ("GET", "/no/such/path", 404, '{"detail": "Not Found"}'),
    ("PUT", "/metrics", 405, '{"detail": "Method Not Allowed"}'),
]


def _against(answers: list[Answer]) -> list[tuple[Answer, tuple[str, str, int, str]]]:
    return list(zip(answers, FASTAPI_ERRORS, strict=True))


def test_engine_answers_unknown_paths_and_methods_as_fastapi_with_its_replica_header() -> None:
    server, app = _engine_app()
    try:
        answers = _answers(app, [(m, p) for m, p, _s, _b in FASTAPI_ERRORS])
    finally:
        server.engine.close()
    for (status, headers, body), (_m, _p, want_status, want_body) in _against(answers):
        assert (status, body) == (want_status, want_body)
        assert headers["Content-Type"].startswith("application/json")
        assert headers[REPLICA_HEADER] == "127.0.0.1:8123"


def test_cache_http_api_answers_unknown_paths_and_methods_as_fastapi() -> None:
    answers = _answers(_cache_app(), [(m, p) for m, p, _s, _b in FASTAPI_ERRORS])
    for (status, headers, body), (_m, _p, want_status, want_body) in _against(answers):
        assert (status, body) == (want_status, want_body)
        assert REPLICA_HEADER not in headers


def test_both_servers_serve_their_registry_as_prometheus_text() -> None:
    server, engine_app = _engine_app()
    try:
        [(status, headers, text)] = _answers(engine_app, [("GET", "/metrics")])
    finally:
        server.engine.close()
    assert status == 200 and headers["Content-Type"] == CONTENT_TYPE_LATEST
    assert "vllm:num_requests_running" in {f.name for f in text_string_to_metric_families(text)}
    [(status, headers, text)] = _answers(_cache_app(), [("GET", "/metrics")])
    assert status == 200 and headers["Content-Type"] == CONTENT_TYPE_LATEST
    # An LMCache gauge set at start-up; counters appear only at their first update, as in OTel.
    assert "lmcache_mp_active_prefetch_jobs" in {f.name for f in text_string_to_metric_families(text)}


# Values on a bound, between bounds, below the first and past the last.
OBSERVED = [0.0, 0.001, 0.003, 0.01, 0.05, 2.5, 7.0, 1e6]
BOUNDS = (0.001, 0.01, 0.1, 1.0, 2.5, 10.0)


def _samples(registry: CollectorRegistry, name: str) -> list[tuple[str, dict[str, str], float]]:
    text = generate_latest(registry).decode()
    return [
        (s.name, s.labels, s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if f.name == name and not s.name.endswith("_created")
    ]


def test_shared_buckets_expose_what_prometheus_client_exposes() -> None:
    real = CollectorRegistry()
    hist = Histogram("h", "doc", ["model_name"], buckets=BOUNDS, registry=real).labels(model_name="m")
    for v in OBSERVED:
        hist.observe(v)
    batch_registry = CollectorRegistry()
    batch = BatchHistogram("h", "doc", BOUNDS, {"model_name": "m"}, batch_registry)
    for v in OBSERVED:
        batch.observe_n(v, 1)
    otel = OtelHistogram("h", "doc", BOUNDS)
    for v in OBSERVED:
        otel.record(v, model_name="m")
    otel_registry = CollectorRegistry()

    class _One(Collector):
        def collect(self) -> Iterable[Metric]:
            metric = otel.metric()
            return [metric] if metric is not None else []

    otel_registry.register(_One())
    expected = _samples(real, "h")
    assert len(expected) == len(BOUNDS) + 3  # buckets with +Inf, _count, _sum
    assert _samples(batch_registry, "h") == expected
    assert _samples(otel_registry, "h") == expected


def test_buckets_count_a_batch_once_per_observation() -> None:
    one_by_one, batched = Buckets(BOUNDS), Buckets(BOUNDS)
    for _ in range(5):
        one_by_one.observe(0.02)
    batched.observe(0.02, 5)
    assert batched.cumulative() == one_by_one.cumulative()
    assert math.isclose(batched.sum, one_by_one.sum)
    assert batched.cumulative()[-1] == ("+Inf", 5.0)
    assert [le for le, _n in batched.cumulative()] == ["0.001", "0.01", "0.1", "1.0", "2.5", "10.0", "+Inf"]


def _argparse_error(kind: Any, text: str, capsys: pytest.CaptureFixture[str]) -> str:
    p = argparse.ArgumentParser(prog="x")
    p.add_argument("--v", type=kind)
    with pytest.raises(SystemExit) as exc:
        p.parse_args(["--v", text])
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_checked_type_keeps_argparse_messages(capsys: pytest.CaptureFixture[str]) -> None:
    unit = checked_type("_unit", float, lambda v: not 0.0 <= v <= 1.0, "must be in [0, 1], got {}")
    assert unit("0.5") == 0.5
    assert _argparse_error(unit, "1.5", capsys) == "x: error: argument --v: must be in [0, 1], got 1.5"
    # Unreadable text: argparse names the type, as it named the hand-written function before.
    assert _argparse_error(unit, "abc", capsys) == "x: error: argument --v: invalid _unit value: 'abc'"


def test_json_number_converts_defaults_and_names_the_keys() -> None:
    bad = "--flag: a and b must be numbers"
    assert json_number({"a": "7"}, "a", 5, int, bad) == 7
    assert json_number({}, "a", 5, int, bad) == 5
    assert json_number({"a": 2}, "a", 0.5, float, bad) == 2.0
    for value in ("x", None, [1]):
        with pytest.raises(UserError, match="a and b must be numbers"):
            json_number({"a": value}, "a", 5, int, bad)
