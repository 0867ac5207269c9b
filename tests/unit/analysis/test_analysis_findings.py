"""The first screen's statements: numbers with CIs, validity, offload exercise, routing."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from kvoffload.analysis.compare import tier_comparison, warnings_table
from kvoffload.analysis.findings import findings


def _row(cell_id: str, tier: str, repeat: int = 0, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "cell_id": cell_id,
        "tier": tier,
        "model": "m",
        "concurrency": 8,
        "num_rounds": 10,
        "isl": 32768,
        "osl": "recorded",
        "repeat": repeat,
        "status": "done",
        "done": True,
        "virtual_users_available": 100,
        "achieved_sessions": 2,
        "sessions_complete": 2,
        "sessions_error": 0,
        "failed_requests": 0,
        "scrapes": 10,
        "scrape_failures": 0,
        "local_hit_rate_source": "samples",
        "external_hit_rate_source": "samples",
        "kv_usage_source": "samples",
        "kv_usage_max_pct": 99.0,
        "lmcache_evicted_chunks": 10.0,
        "external_hit_tokens": 1000.0,
        "ttft_p50_s": 1.0,
        "ttft_p95_s": 2.0,
        "gpu_prefix_token_share": 0.3,
        "lmcache_token_share": 0.48 if tier != "gpu" else None,
        "lmcache_l1_hit_tokens": 750.0 if tier != "gpu" else None,
        "lmcache_l2_hit_tokens": 250.0 if tier != "gpu" else None,
        "caddy_policy": "header X-User-Id" if tier == "gpu" else "least_conn",
    }
    row.update(over)
    return row


def _requests(later: dict[str, float]) -> pd.DataFrame:
    rows = []
    for user, ttft in later.items():
        rows.append({"user_id": user, "round": 1, "status": "ok", "ttft_s": 5.0})
        rows.append({"user_id": user, "round": 2, "status": "ok", "ttft_s": ttft})
    return pd.DataFrame(rows)


def _findings(rows: list[dict[str, Any]], requests: dict[str, pd.DataFrame]) -> dict[str, Any]:
    summary = pd.DataFrame(rows)
    out = findings(tier_comparison(summary), warnings_table(summary), requests, replicates=2000)
    return {f.tier: f for f in out}


def test_a_valid_comparison_with_its_interval_and_sources() -> None:
    """gpu: two sessions at 1.0 s; cpu: 0.4 s and 0.6 s, so -60/-50/-40 % as in the bootstrap test."""
    f = _findings(
        [_row("g", "gpu"), _row("c", "cpu")],
        {"g": _requests({"a": 1.0, "b": 1.0}), "c": _requests({"a": 0.4, "b": 0.6})},
    )
    cpu = f["cpu"]
    assert cpu.comparable and cpu.offload_exercised is True
    assert cpu.p50_change_vs_gpu_pct == pytest.approx(-50.0)
    assert cpu.p50_change_ci_pct == [pytest.approx(-60.0), pytest.approx(-40.0)]
    assert cpu.statement.startswith(
        "cpu cuts later-round p50 TTFT by 50 % (95 % CI 40-60 %) against gpu at concurrency 8, num_rounds 10"
    )
    assert (
        "offload was exercised: 48 % of prompt tokens came from LMCache (L1 75 %, L2 25 % of its hits)"
        in (cpu.statement)
    )
    assert cpu.statement.endswith("30 % from the GPU prefix cache; routing least_conn.")
    assert "routing sticky by X-User-Id" in f["gpu"].statement
    assert f["gpu"].later_p50_s == pytest.approx(1.0) and f["gpu"].later_p50_ci_s == [1.0, 1.0]


def test_an_invalid_comparison_says_why_and_an_idle_offload_says_so() -> None:
    f = _findings(
        [
            _row("g", "gpu", failed_requests=1, sessions_error=1, sessions_complete=1),
            _row("c", "cpu", kv_usage_max_pct=40.0, lmcache_evicted_chunks=0.0, external_hit_tokens=0.0),
        ],
        {"g": _requests({"a": 1.0, "b": 1.0}), "c": _requests({"a": 1.0, "b": 1.0})},
    )
    cpu = f["cpu"]
    assert not cpu.comparable and not f["gpu"].comparable
    assert cpu.statement.startswith(
        "NOT A VALID COMPARISON (session counts differ (gpu: 2 achieved, 1 complete"
    )
    assert "the gpu cell(s) did not run clean (gpu g: 1 failed request(s))" in cpu.statement
    assert "offload was never exercised: KV usage peaked at 40 % (below 90 %)" in cpu.statement
    assert cpu.offload_exercised is False
    assert "does not change later-round p50 TTFT measurably: +0 %" in cpu.statement


def test_caddy_flaps_make_the_group_not_comparable() -> None:
    f = _findings(
        [_row("g", "gpu"), _row("c", "cpu", caddy_upstream_flaps=2, caddy_flapped_upstreams="h:8001")],
        {"g": _requests({"a": 1.0}), "c": _requests({"a": 1.0})},
    )
    assert "the cpu cell(s) did not run clean (cpu c: 2 Caddy upstream flap(s))" in f["cpu"].statement


def test_repeats_pool_into_one_finding_per_tier() -> None:
    f = _findings(
        [_row("g0", "gpu", 0), _row("c0", "cpu", 0), _row("g1", "gpu", 1), _row("c1", "cpu", 1)],
        {
            "g0": _requests({"a": 1.0}),
            "g1": _requests({"a": 1.0}),
            "c0": _requests({"a": 0.5}),
            "c1": _requests({"a": 0.5}),
        },
    )
    assert set(f) == {"gpu", "cpu"}
    assert f["cpu"].repeats == 2 and f["cpu"].cells == ["c0", "c1"]
    assert f["cpu"].p50_change_vs_gpu_pct == pytest.approx(-50.0)
    assert f["cpu"].group == "m c=8 rounds=10 isl=32768 osl=recorded"
