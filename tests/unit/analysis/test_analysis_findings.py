"""The first screen's statements: numbers with CIs, validity, offload exercise, routing."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from kvoffload.analysis.compare import tier_comparison, warnings_table
from kvoffload.analysis.findings import findings
from kvoffload.analysis.routing import routing_figures
from tests.unit.analysis.analysis_frames import summary_row


def _row(cell_id: str, tier: str, repeat: int = 0, **over: Any) -> dict[str, Any]:
    offload = tier != "gpu"
    return summary_row(
        cell_id,
        tier,
        **{
            "repeat": repeat,
            "achieved_sessions": 2,
            "sessions_complete": 2,
            "sessions_error": 0,
            "gpu_prefix_token_share": 0.3,
            "lmcache_token_share": 0.48 if offload else None,
            "lmcache_l1_hit_tokens": 750.0 if offload else None,
            "lmcache_l2_hit_tokens": 250.0 if offload else None,
            "caddy_policy": "least_conn" if offload else "header X-User-Id",
            **over,
        },
    )


def _requests(later: dict[str, float]) -> pd.DataFrame:
    rows = []
    for user, ttft in later.items():
        rows.append({"user_id": user, "round": 1, "status": "ok", "ttft_s": 5.0})
        rows.append({"user_id": user, "round": 2, "status": "ok", "ttft_s": ttft})
    return pd.DataFrame(rows)


def _findings(
    rows: list[dict[str, Any]], requests: dict[str, pd.DataFrame], min_sessions: int = 1
) -> dict[str, Any]:
    """Findings by tier; the session floor is lowered to 1 where a test works an interval out by hand."""
    summary = pd.DataFrame(rows)
    out = findings(
        tier_comparison(summary),
        warnings_table(summary),
        requests,
        replicates=2000,
        min_sessions=min_sessions,
    )
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
    assert cpu.statement.endswith(
        "30 % from the GPU prefix cache; history was retained beyond the GPU cache (KV usage reached 99 %); "
        "routing least_conn."
    )
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


def test_a_faulted_repeat_without_its_gpu_cell_still_makes_the_finding_not_comparable() -> None:
    """Repeat 1 has only a cpu cell, faulted and with failed requests: no group warning can name it
    (its group has one cell), yet it pools into the cpu finding."""
    f = _findings(
        [
            _row("g0", "gpu", 0),
            _row("c0", "cpu", 0),
            _row("c1", "cpu", 1, valid=False, invalid_reasons="vllm-1 unreachable", failed_requests=3),
        ],
        {"g0": _requests({"a": 1.0}), "c0": _requests({"a": 0.5}), "c1": _requests({"a": 0.5})},
    )
    assert f["cpu"].cells == ["c0", "c1"]
    assert not f["cpu"].comparable and not f["gpu"].comparable
    assert f["cpu"].not_comparable_reasons == [
        "cpu c1 did not run clean (a fault (vllm-1 unreachable), 3 failed request(s))"
    ]
    assert f["cpu"].statement.startswith("NOT A VALID COMPARISON (cpu c1 did not run clean (a fault")


def test_a_cell_without_sessions_json_is_named_not_assumed_equal() -> None:
    """In its own group, and alone in a pooled repeat's group (named once)."""
    missing = {"virtual_users_available": None, "achieved_sessions": None}
    missing |= {"sessions_complete": None, "sessions_error": None}
    f = _findings(
        [_row("g", "gpu"), _row("c", "cpu", **missing), _row("c1", "cpu", 1, **missing)],
        {"g": _requests({"a": 1.0}), "c": _requests({"a": 0.5}), "c1": _requests({"a": 0.5})},
    )
    assert not f["cpu"].comparable
    assert f["cpu"].not_comparable_reasons == [
        "sessions.json is missing for cpu c: session counts unknown, so whether the tiers replayed the "
        "same sessions cannot be told",
        "sessions.json is missing for cpu c1: session counts unknown, so whether the tiers replayed the "
        "same sessions cannot be told",
    ]


def _routed(users: dict[str, list[str]]) -> pd.DataFrame:
    """Requests whose rounds 1, 2, ... of each user were answered by the given replicas."""
    rows = [
        {"user_id": u, "round": k, "status": "ok", "ttft_s": 5.0 if k == 1 else 1.0, "replica": r}
        for u, replicas in users.items()
        for k, r in enumerate(replicas, start=1)
    ]
    return pd.DataFrame(rows)


TWO = {"vllm-0": {"kind": "vllm"}, "vllm-1": {"kind": "vllm"}, "lmcache": {"kind": "lmcache"}}


def test_routing_is_checked_from_the_records() -> None:
    """gpu: user b moved to the other replica (sticky routing broke); cpu: every request went to one of
    two replicas (least_conn did not spread). Both make the group not comparable."""
    gpu = _routed({"a": ["r0", "r0"], "b": ["r1", "r0"]})
    cpu = _routed({"a": ["r0", "r0"], "b": ["r0", "r0"]})
    f = _findings(
        [_row("g", "gpu", **routing_figures(gpu, TWO)), _row("c", "cpu", **routing_figures(cpu, TWO))],
        {"g": gpu, "c": cpu},
    )
    reasons = f["cpu"].not_comparable_reasons
    assert not f["cpu"].comparable
    assert (
        "routing breached in gpu g: 1 of 2 users' rounds came from more than one of its 2 replicas "
        "(the gpu tier needs each user's rounds from one replica (sticky by X-User-Id): a user's history "
        "sits in one replica's prefix cache)"
    ) in reasons
    assert (
        "routing breached in cpu c: every request went to one of its 2 replicas (the cpu tier needs "
        "traffic on more than one replica (least_conn))"
    ) in reasons
    held_gpu = _routed({"a": ["r0", "r0"], "b": ["r1", "r1"]})
    held_cpu = _routed({"a": ["r0", "r1"], "b": ["r1", "r0"]})
    f = _findings(
        [
            _row("g", "gpu", **routing_figures(held_gpu, TWO)),
            _row("c", "cpu", **routing_figures(held_cpu, TWO)),
        ],
        {"g": held_gpu, "c": held_cpu},
    )
    assert f["cpu"].comparable
    assert "routing sticky by X-User-Id (held: each of 2 users' rounds came from one replica of 2)" in (
        f["gpu"].statement
    )
    assert "routing least_conn (held: traffic reached 2 of 2 replicas)" in f["cpu"].statement


def test_offload_evidence_separates_sharing_from_retained_history() -> None:
    """KV usage at 50 % and users moving between two replicas: the external hits are cross-replica
    sharing and the GPU capacity was never exceeded. One replica with the same hits: the replica's own
    history came back from LMCache. A history larger than the GPU cache counts even at 50 % usage."""
    idle = {"kv_usage_max_pct": 50.0, "lmcache_evicted_chunks": 0.0, "external_hit_tokens": 500.0}
    moved = _routed({"a": ["r0", "r1"], "b": ["r1", "r1"]})
    f = _findings(
        [_row("g", "gpu"), _row("c", "cpu", **idle, **routing_figures(moved, TWO))],
        {"g": _requests({"a": 1.0}), "c": moved},
    )
    assert f["cpu"].offload_exercised is True
    assert f["cpu"].gpu_capacity_exceeded is False and f["cpu"].cross_replica_sharing is True
    assert (
        "GPU capacity was never exceeded (KV usage peaked at 50 %, below 90 %), so its external hits came "
        "from cross-replica sharing (1 of 2 users' rounds moved between the 2 replicas that share one "
        "LMCache server)"
    ) in f["cpu"].statement
    one = {"vllm-0": {"kind": "vllm"}}
    alone = _routed({"a": ["r0", "r0"], "b": ["r0", "r0"]})
    f = _findings(
        [_row("g", "gpu"), _row("c", "cpu", **idle, **routing_figures(alone, one))],
        {"g": _requests({"a": 1.0}), "c": alone},
    )
    assert f["cpu"].gpu_capacity_exceeded is True and f["cpu"].cross_replica_sharing is False
    assert (
        "history was retained beyond the GPU cache (external hits came while every user stayed on one "
        "replica)"
    ) in f["cpu"].statement
    big = {"sessions_replayed": 4, "live_context_mean_tokens": 5000.0, "gpu_cache_tokens": 16384.0}
    f = _findings(
        [_row("g", "gpu"), _row("c", "cpu", **idle, **big, **routing_figures(moved, TWO))],
        {"g": _requests({"a": 1.0}), "c": moved},
    )
    assert "history was retained beyond the GPU cache (the live history (20000 tokens) exceeds the GPU " in (
        f["cpu"].statement
    )
    assert "external hits include cross-replica sharing" in f["cpu"].statement
    # users moved but no external hit came: nothing is said of sharing
    f = _findings(
        [_row("g", "gpu"), _row("c", "cpu", external_hit_tokens=0.0, **routing_figures(moved, TWO))],
        {"g": _requests({"a": 1.0}), "c": moved},
    )
    assert f["cpu"].cross_replica_sharing is True and "cross-replica" not in f["cpu"].statement


def test_too_few_sessions_give_no_interval() -> None:
    f = _findings(
        [_row("g", "gpu"), _row("c", "cpu")],
        {"g": _requests({"a": 1.0, "b": 1.0}), "c": _requests({"a": 0.4, "b": 0.6})},
        min_sessions=10,
    )
    cpu = f["cpu"]
    assert cpu.p50_change_vs_gpu_pct == pytest.approx(-50.0) and cpu.p50_change_ci_pct is None
    assert cpu.later_p50_ci_s is None and f["gpu"].later_p50_ci_s is None
    assert cpu.statement.startswith(
        "cpu changes later-round p50 TTFT by -50 % (too few sessions for an interval: 2 against 2, at least "
        "10 per side) against gpu"
    )
    assert "(p95: -41 %, no interval)" in cpu.statement
    assert "p50 TTFT 1 s (too few sessions for an interval: 2, at least 10 per side)" in f["gpu"].statement


def test_a_tier_whose_l2_loads_failed_for_lack_of_l1_room_says_so_in_its_finding() -> None:
    """Issue 53: the nvme finding names the 68 of 136 L2 loads (50 %) that found no room in its
    0.125 GiB L1, and the fix; its flag is set, cpu's (no failure) is not, gpu's is unknown."""
    oom = {
        "lmcache_l1_size_gb": 0.125,
        "lmcache_l2_loaded_chunks": 68.0,
        "lmcache_l2_prefetch_failed_chunks": 68.0,
        "lmcache_l2_prefetch_failed_l1_oom_chunks": 68.0,
        "lmcache_l2_prefetch_l1_oom": True,
    }
    fine = {"lmcache_l2_prefetch_failed_l1_oom_chunks": 0.0, "lmcache_l2_prefetch_l1_oom": False}
    same = {"a": 0.5, "b": 0.5}
    f = _findings(
        [_row("g", "gpu"), _row("c", "cpu", **fine), _row("n", "nvme", **oom)],
        {"g": _requests(same), "c": _requests(same), "n": _requests(same)},
    )
    nvme = f["nvme"]
    assert nvme.l2_prefetch_l1_oom is True and nvme.l2_prefetch_failed_l1_oom_chunks == 68.0
    assert (
        "; warning: 68 of 136 (50 %) L2 chunk loads failed for lack of room in the 0.125 GiB L1 pool"
        in nvme.statement
    )
    assert (
        "give it a larger L1 (the campaign's lmcache_l1_size_gb.nvme); routing least_conn." in nvme.statement
    )
    assert f["cpu"].l2_prefetch_l1_oom is False and "lack of room" not in f["cpu"].statement
    assert f["gpu"].l2_prefetch_l1_oom is None
    assert any("lack of room" in c for c in nvme.caveats)
