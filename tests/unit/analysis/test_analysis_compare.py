"""Comparison rules and validity warnings over hand-made summary rows."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from kvoffload.analysis.client import request_figures
from kvoffload.analysis.compare import cell_warnings as cell_warnings_of
from kvoffload.analysis.compare import compare_campaigns, offload_exercised, tier_comparison, warnings_table
from kvoffload.analysis.findings import findings
from kvoffload.report import views
from tests.unit.analysis.analysis_frames import summary_row


def _row(cell_id: str, tier: str, **over: Any) -> dict[str, Any]:
    return summary_row(cell_id, tier, **{"scrape_failed_targets": None, **over})


def _kinds(w: pd.DataFrame) -> list[tuple[str, str | None]]:
    pairs = [(k, None if pd.isna(c) else c) for k, c in zip(w["kind"], w["cell_id"], strict=True)]
    return sorted(pairs, key=lambda p: (p[0], p[1] or ""))


def test_clean_group_has_no_warnings() -> None:
    s = pd.DataFrame(
        [_row("g", "gpu", lmcache_evicted_chunks=None, external_hit_tokens=0.0), _row("c", "cpu")]
    )
    assert warnings_table(s).empty


def test_concurrency_above_ceiling_and_zero_users() -> None:
    s = pd.DataFrame(
        [
            _row("g", "gpu", concurrency=128, virtual_users_available=40, achieved_sessions=40),
            _row("z", "gpu", num_rounds=3, virtual_users_available=0, achieved_sessions=0),
        ]
    )
    w = warnings_table(s)
    assert _kinds(w) == [("concurrency_above_ceiling", "g"), ("no_virtual_users", "z")]
    msg = w.loc[w["kind"] == "concurrency_above_ceiling", "message"].iloc[0]
    assert "128" in msg and "40 virtual users" in msg


def test_session_counts_that_differ_make_a_group_not_comparable() -> None:
    s = pd.DataFrame([_row("g", "gpu"), _row("c", "cpu", achieved_sessions=97), _row("n", "nvme")])
    w = warnings_table(s)
    assert _kinds(w) == [("sessions_differ", None)]
    assert "gpu: 100 achieved; cpu: 97 achieved; nvme: 100 achieved" in w["message"].iloc[0]
    assert not tier_comparison(s)["comparable"].any()


def test_sessions_that_ended_in_error_make_a_group_not_comparable() -> None:
    """The demo's old case: every tier started 32 sessions, but 6 of gpu's ended in error."""
    ok = {"achieved_sessions": 32, "sessions_complete": 32, "sessions_error": 0}
    s = pd.DataFrame(
        [
            _row("g", "gpu", achieved_sessions=32, sessions_complete=26, sessions_error=6, failed_requests=6),
            _row("c", "cpu", **ok),
            _row("n", "nvme", **ok),
        ]
    )
    w = warnings_table(s)
    assert _kinds(w) == [("cells_not_clean", None), ("failed_requests", "g"), ("sessions_differ", None)]
    assert (
        "gpu: 32 achieved, 26 complete, 6 error" in w.loc[w["kind"] == "sessions_differ", "message"].iloc[0]
    )
    assert "the gpu cell(s)" in w.loc[w["kind"] == "cells_not_clean", "message"].iloc[0]
    assert not tier_comparison(s)["comparable"].any()


def test_a_faulted_cell_is_named_and_breaks_its_group() -> None:
    reason = "vllm-kve2-1 unreachable at 12:00:03 for 20.0 s: ConnectError"
    s = pd.DataFrame(
        [
            _row("g", "gpu"),
            _row("c", "cpu", valid=False, invalid_reasons=reason),
            _row("n", "nvme", valid=True),
        ]
    )
    w = warnings_table(s)
    assert _kinds(w) == [("cell_faulted", "c"), ("cells_not_clean", None)]
    assert reason in w["message"].iloc[0]
    assert not tier_comparison(s)["comparable"].any()
    # the same group without the fault is comparable
    s.loc[1, "valid"] = True
    assert tier_comparison(s)["comparable"].all()


def test_offload_never_exercised() -> None:
    idle = {"kv_usage_max_pct": 45.0, "lmcache_evicted_chunks": 0.0, "external_hit_tokens": 0.0}
    s = pd.DataFrame([_row("g", "gpu", **idle), _row("c", "cpu", **idle), _row("n", "nvme")])
    w = warnings_table(s)
    assert _kinds(w) == [("offload_not_exercised", "c")]
    assert "45%" in w["message"].iloc[0]
    assert offload_exercised(pd.Series(_row("n", "nvme", kv_usage_max_pct=10.0, external_hit_tokens=0.0)))
    unknown = _row("u", "cpu", kv_usage_max_pct=None, lmcache_evicted_chunks=None, external_hit_tokens=None)
    assert offload_exercised(pd.Series(unknown)) is None


def test_cell_level_warnings() -> None:
    row = _row(
        "x",
        "gpu",
        status="interrupted",
        done=False,
        failed_requests=3,
        scrape_failures=2,
        scrape_failed_targets="vllm-1",
        local_hit_rate_source="snapshots",
    )
    w = warnings_table(pd.DataFrame([row]), skipped=[{"cell_id": "y", "reason": "cell.json is missing"}])
    assert _kinds(w) == [
        ("cell_not_done", "x"),
        ("failed_requests", "x"),
        ("fallback_before_after", "x"),
        ("scrape_gaps", "x"),
        ("skipped_cell", "y"),
    ]


def test_tier_comparison_change_vs_gpu() -> None:
    s = pd.DataFrame(
        [
            _row("g", "gpu", ttft_later_p50_s=2.0, ttft_later_p95_s=4.0),
            _row("c", "cpu", ttft_later_p50_s=1.5, ttft_later_p95_s=5.0),
            _row("other", "cpu", concurrency=32, ttft_later_p50_s=1.0),  # another group, no gpu cell
        ]
    )
    t = tier_comparison(s).set_index("cell_id")
    assert t.loc["c", "ttft_later_p50_vs_gpu_pct"] == pytest.approx(-25.0)
    assert t.loc["c", "ttft_later_p95_vs_gpu_pct"] == pytest.approx(25.0)
    assert t.loc["g", "ttft_later_p50_vs_gpu_pct"] == pytest.approx(0.0)
    assert pd.isna(t.loc["other", "ttft_later_p50_vs_gpu_pct"])
    assert t["comparable"].all()


def _replay(first: float, later: float, users: int = 12) -> pd.DataFrame:
    """Three rounds of `users` sessions: round 1 at `first` s, rounds 2 and 3 at `later` s."""
    rows = [
        {"user_id": f"u{u}", "round": r, "status": "ok", "ttft_s": first if r == 1 else later,
         "t_start": float(10 * r + u), "latency_s": 1.0, "tpot_s": 0.01, "prompt_tokens": 100 * r,
         "completion_tokens": 8, "cached_tokens": None}
        for u in range(users) for r in (1, 2, 3)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_the_tables_change_vs_gpu_is_the_findings_change_over_later_rounds() -> None:
    """Issue 43, defect 6: gpu's later rounds take 0.42 s, cpu's 0.056 s, but cpu's round 1 is slow
    (2 s against 0.1 s): over all rounds cpu's p95 is worse, over later rounds (the columns beside it
    and the findings) 87 % better. The table's change is the later-round one, the findings' figure."""
    requests = {"g": _replay(0.1, 0.420), "c": _replay(2.0, 0.056)}
    counts = {"achieved_sessions": 12, "sessions_complete": 12, "sessions_error": 0}
    rows = [
        _row(cid, tier, **counts, **request_figures(requests[cid]))
        for cid, tier in (("g", "gpu"), ("c", "cpu"))
    ]
    summary = pd.DataFrame(rows)
    table = tier_comparison(summary).set_index("cell_id")
    all_rounds_p95 = 100.0 * (summary.loc[1, "ttft_p95_s"] / summary.loc[0, "ttft_p95_s"] - 1.0)
    assert all_rounds_p95 > 0  # the old column's figure: cpu worse over all rounds
    later_p95 = 100.0 * (0.056 / 0.420 - 1.0)  # -86.7 %
    found = {
        f.tier: f for f in findings(table.reset_index(), warnings_table(summary), requests, replicates=200)
    }
    assert found["cpu"].p95_change_vs_gpu_pct is not None
    assert table.loc["c", "ttft_later_p95_vs_gpu_pct"] == pytest.approx(found["cpu"].p95_change_vs_gpu_pct)
    assert table.loc["c", "ttft_later_p50_vs_gpu_pct"] == pytest.approx(found["cpu"].p50_change_vs_gpu_pct)
    assert table.loc["c", "ttft_later_p95_vs_gpu_pct"] == pytest.approx(later_p95, abs=0.05)
    shown = views.table("Tier comparison", table.reset_index(), views.COMPARISON_COLUMNS)
    at = shown.headers.index("later-round TTFT p95 vs gpu (%)")
    assert shown.rows[1][at] == f"{later_p95:+.1f}"
    # every TTFT header of the table names its scope
    assert all("later-round" in h or "later rounds" in h for h in shown.headers if "TTFT" in h)


def test_compare_campaigns_matches_cells_on_config() -> None:
    a = pd.DataFrame([_row("g1", "gpu", ttft_p50_s=2.0), _row("c1", "cpu", ttft_p50_s=1.0)])
    b = pd.DataFrame([_row("g2", "gpu", ttft_p50_s=3.0), _row("n2", "nvme", ttft_p50_s=1.0)])
    t = compare_campaigns([("A", a), ("B", b)], ["ttft_p50_s"]).set_index("tier")
    assert t.loc["gpu", "A"] == 2.0 and t.loc["gpu", "B"] == 3.0
    assert t.loc["gpu", "change_pct_B"] == pytest.approx(50.0)
    assert pd.isna(t.loc["cpu", "B"]) and pd.isna(t.loc["nvme", "A"])
    assert len(t) == 3  # gpu, cpu, nvme: no invented combinations


def test_late_and_read_stamped_requests_are_flagged_per_cell() -> None:
    s = pd.DataFrame(
        [
            _row("g", "gpu", requests_ok=50, requests_late=3, requests_read_stamped=0),
            _row("c", "cpu", requests_ok=40, requests_late=0, requests_read_stamped=40),
            _row("n", "nvme", requests_ok=40, requests_late=float("nan")),
        ]
    )
    w = warnings_table(s)
    assert _kinds(w) == [("client_late", "g"), ("read_stamped", "c")]
    late = w.loc[w["kind"] == "client_late", "message"].iloc[0]
    assert late.startswith("3 of 50 ok requests") and "late_s" in late
    assert w.loc[w["kind"] == "read_stamped", "message"].iloc[0].startswith("40 of 40 ok requests")


def test_a_cell_without_session_counts_makes_its_group_not_comparable() -> None:
    """No sessions.json: the counts are unknown, never taken as the group's."""
    s = pd.DataFrame(
        [_row("g", "gpu"), _row("c", "cpu", virtual_users_available=None, achieved_sessions=None)]
    )
    assert not tier_comparison(s)["comparable"].any()
    w = warnings_table(s)
    missing = w[w["kind"] == "sessions_missing"]
    assert list(missing["message"]) == [
        "not comparable: sessions.json is missing for cpu c: session counts unknown, so whether the tiers "
        "replayed the same sessions cannot be told"
    ]


def test_a_routing_breach_makes_its_group_not_comparable() -> None:
    routed = {"replicas_configured": 2, "replicas_answering": 2, "routed_users": 100}
    s = pd.DataFrame(
        [
            _row("g", "gpu", **routed, users_on_several_replicas=3),
            _row("c", "cpu", **routed, users_on_several_replicas=40),
        ]
    )
    assert not tier_comparison(s)["comparable"].any()
    w = warnings_table(s)
    assert _kinds(w[w["kind"].str.startswith("routing")]) == [("routing_breach", "g")]
    # One replica answering every cpu request of two is a breach too; records naming no replica are
    # a caveat (routing unchecked), not a breach.
    s = pd.DataFrame(
        [
            _row("g", "gpu", **routed, users_on_several_replicas=0),
            _row("c", "cpu", **(routed | {"replicas_answering": 1}), users_on_several_replicas=0),
            _row("n", "nvme", **(routed | {"replicas_answering": 0, "routed_users": 0})),
        ]
    )
    w = warnings_table(s)
    assert _kinds(w[w["kind"].str.startswith("routing")]) == [
        ("routing_breach", "c"),
        ("routing_unchecked", "n"),
    ]
    assert not tier_comparison(s)["comparable"].any()
    s = s[s["cell_id"] != "c"]
    assert tier_comparison(s)["comparable"].all()


def test_compare_campaigns_applies_the_validity_rules() -> None:
    """A faulted cell, a missing sessions.json, a routing breach, differing session counts and a cell
    present in one campaign only each make the match not comparable, with the reason."""
    a = pd.DataFrame(
        [
            _row("g1", "gpu"),
            _row("c1", "cpu"),
            _row("n1", "nvme", achieved_sessions=90),
            _row("x1", "gpu", concurrency=16),
        ]
    )
    b = pd.DataFrame(
        [
            _row("g2", "gpu", valid=False, invalid_reasons="vllm-0 down"),
            _row("c2", "cpu", replicas_configured=2, replicas_answering=1, routed_users=100),
            _row("n2", "nvme", achieved_sessions=None, virtual_users_available=None),
        ]
    )
    t = compare_campaigns([("A", a), ("B", b)], ["ttft_p50_s"])
    by = {(r["tier"], r["concurrency"]): r for _, r in t.iterrows()}
    assert not any(t["comparable"])
    assert by["gpu", 8]["not_comparable_reasons"] == "B: gpu g2 did not run clean (a fault (vllm-0 down))"
    assert by["cpu", 8]["not_comparable_reasons"].startswith("B: routing breached in cpu c2: every request")
    assert by["nvme", 8]["not_comparable_reasons"] == (
        "B: nvme n2 has no sessions.json: its session counts are unknown; "
        "session counts differ (A: 90 achieved; B: unknown)"
    )
    assert by["gpu", 16]["not_comparable_reasons"] == "no matching cell in B"
    clean = compare_campaigns([("A", a), ("B", a.assign(cell_id=a["cell_id"] + "b"))], ["ttft_p50_s"])
    assert clean["comparable"].all() and (clean["not_comparable_reasons"] == "").all()


@pytest.mark.parametrize(
    ("tier", "units", "held"),
    [
        ("cpu", "kvoffload-vllm@1 on gpu1 x1", True),
        ("nvme", "kvoffload-vllm@0 on gpu1 x2", True),
        ("gpu", "kvoffload-vllm@1 on gpu1 x1", False),  # no lmcache-server holds anything
        ("cpu", "kvoffload-lmcache on gpu1 x1", False),  # the server itself: its cache went cold instead
    ],
)
def test_a_restarted_replica_on_an_offload_tier_says_lmcache_may_hold_its_old_kv_pool(
    tier: str, units: str, held: bool
) -> None:
    """LMCache 0.5.6 keeps a worker that registered and never pinged for the registration grace (issue 41):
    a replica that died and restarted mid-cell may leave its old KV pool mapped in lmcache-server."""
    row = pd.Series(_row("c1", tier, unit_restarts=1, service_restarts=1, restarted_units=units))
    [restart] = [
        w for w in warnings_table(pd.DataFrame([row])).to_dict("records") if w["kind"] == "unit_restarted"
    ]
    assert ("holding its KV pool in lmcache-server for up to 2100 s" in restart["message"]) is held


def test_the_snapshot_fallback_says_what_the_replay_measured() -> None:
    """Issue 43, defect 10: the fallback note said "the run was shorter than one sampling interval" of
    replays that were not. It now says what the row measured: the replay and the sampler's interval."""
    row = pd.Series(_row("c", "cpu", kv_usage_source="snapshots", run_s=3.0, sample_interval_s=2.0))
    (w,) = [w for w in cell_warnings_of(row) if w["kind"] == "fallback_before_after"]
    assert w["message"] == (
        "kv_usage comes from the before/after snapshots: the 3.0 s replay lasted less than two sampling "
        "intervals (2 s each), too few sampler rounds for a figure over them"
    )
    one_round = pd.Series(
        _row("c", "cpu", local_hit_rate_source="snapshots", run_s=0.8, sample_interval_s=None)
    )
    (w,) = [w for w in cell_warnings_of(one_round) if w["kind"] == "fallback_before_after"]
    assert w["message"].endswith("snapshots: fewer than two sampler rounds over the 0.8 s replay")


def test_l2_loads_that_failed_for_lack_of_l1_room_are_warned_with_the_fix() -> None:
    """Issue 53: nvme at concurrency 32 loaded 68 chunks back from L2 and failed 68 for lack of room
    in its 0.125 GiB L1: 68 of 136 loads tried, 50 %."""
    oom = {
        "lmcache_l1_size_gb": 0.125,
        "lmcache_l2_loaded_chunks": 68.0,
        "lmcache_l2_prefetch_failed_chunks": 68.0,
        "lmcache_l2_prefetch_failed_l1_oom_chunks": 68.0,
    }
    s = pd.DataFrame([_row("g", "gpu"), _row("n", "nvme", **oom), _row("c", "cpu")])
    w = warnings_table(s)
    assert _kinds(w) == [("l2_prefetch_l1_oom", "n")]
    assert w["message"].iloc[0] == (
        "68 of 136 (50 %) L2 chunk loads failed for lack of room in the 0.125 GiB L1 pool (LMCache's "
        'l2_prefetch_failure_chunks{reason="l1_oom"}): they were not served from the cache, the engine '
        "prefilled them again, so the nvme tier was measured with an L1 too small to stage its L2 loads; "
        "give it a larger L1 (the campaign's lmcache_l1_size_gb.nvme)"
    )
    # none failed for lack of room (or nothing says): no warning
    fine = pd.DataFrame([_row("n", "nvme", **{**oom, "lmcache_l2_prefetch_failed_l1_oom_chunks": 0.0})])
    assert warnings_table(fine).empty
