"""Per-request attribution worked out by hand on small record sets: sources, reconciliation, costs."""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd
import pytest

from kvoffload.analysis import attribution as A
from tests.unit.analysis.analysis_frames import samples_frame


def _req(rnd: int, prompt: int, ttft: float, **fields: Any) -> dict[str, Any]:
    return {"cell_id": "c", "status": "ok", "round": rnd, "prompt_tokens": prompt, "ttft_s": ttft, **fields}


def _counters(**increases: float) -> pd.DataFrame:
    """Before/after snapshots of one target whose counters rise by `increases` over the run."""
    rows = []
    for name, inc in increases.items():
        rows.append(("before", 0.0, "t", name, {}, 100.0))
        rows.append(("after", 60.0, "t", name, {}, 100.0 + inc))
    return samples_frame(rows)


# A cpu cell of three requests, chunks of 256 tokens:
#  r1: 1000 prompt, nothing cached                       -> recomputed 1000
#  r2: 1200 prompt, GPU 512, LMCache loaded 512 (its lookup: 4 L1 chunks, 0 L2) -> L1 512, recomputed 176
#  r3: 1400 prompt, GPU 0,  LMCache loaded 1024 (lookup: 2 L1, 2 L2)            -> L2 512, L1 512, rec. 376
CPU = pd.DataFrame(
    [
        _req(1, 1000, 0.05, vllm_cached_tokens=0, lmcache_loaded_tokens=0,
             lmcache_l1_hit_chunks=0, lmcache_l2_hit_chunks=0),
        _req(2, 1200, 0.03, vllm_cached_tokens=512, lmcache_loaded_tokens=512,
             lmcache_l1_hit_chunks=4, lmcache_l2_hit_chunks=0),
        _req(2, 1400, 0.04, vllm_cached_tokens=0, lmcache_loaded_tokens=1024,
             lmcache_l1_hit_chunks=2, lmcache_l2_hit_chunks=2),
    ]
)  # fmt: skip


def test_sources_per_request_by_hand() -> None:
    s = A.token_sources(CPU, connector=True, chunk=256.0)
    assert s["gpu"].tolist() == [0, 512, 0]
    assert s["l1"].tolist() == [0, 512, 512]
    assert s["l2"].tolist() == [0, 0, 512]
    assert s["recomputed"].tolist() == [1000, 176, 376]
    # Every prompt token has exactly one source.
    assert (s[list(A.SOURCES)].sum(axis=1) == s["prompt"]).all()


def test_l2_counts_at_most_the_loaded_tokens() -> None:
    # 4 L2 chunks found (1024 tokens), but the engine held the first 512 itself and loaded only 512.
    one = pd.DataFrame([_req(2, 1100, 0.1, vllm_cached_tokens=512, lmcache_loaded_tokens=512,
                             lmcache_l1_hit_chunks=0, lmcache_l2_hit_chunks=4)])  # fmt: skip
    s = A.token_sources(one, connector=True, chunk=256.0)
    assert (s["l2"].iloc[0], s["l1"].iloc[0], s["recomputed"].iloc[0]) == (512, 0, 76)


def test_what_the_server_did_not_say_stays_unknown() -> None:
    s = A.token_sources(pd.DataFrame([_req(1, 1000, 0.05, cached_tokens=512)]), connector=True)
    assert s[["gpu", "l1", "l2", "recomputed"]].isna().all(axis=None)
    # Without a chunk size the L1/L2 split is unknown, the GPU part is not.
    s = A.token_sources(CPU, connector=True, chunk=None)
    assert s["gpu"].tolist() == [0, 512, 0] and s["l2"].isna().all()
    # A gpu-tier cell has no connector: every cached token is the engine's own.
    g = A.token_sources(pd.DataFrame([_req(1, 1000, 0.05, cached_tokens=512)]), connector=False)
    assert (g["gpu"].iloc[0], g["l1"].iloc[0], g["l2"].iloc[0], g["recomputed"].iloc[0]) == (512, 0, 0, 488)


def test_chunk_size_is_the_servers_own_ratio() -> None:
    smp = _counters(
        lmcache_mp_lookup_hit_l1_tokens_total=1536,
        lmcache_mp_lookup_hit_l2_tokens_total=512,
        lmcache_mp_lookup_hit_l1_keys_total=6,
        lmcache_mp_lookup_hit_l2_keys_total=2,
    )
    assert A.chunk_size(smp) == 256.0
    assert A.chunk_size(_counters(lmcache_mp_lookup_hit_l1_tokens_total=0)) is None


def test_reconciliation_by_hand() -> None:
    s = A.token_sources(CPU, connector=True, chunk=256.0)
    # Per request: GPU 512, loaded 1536, L1 chunks 6, L2 chunks 2.
    agree = _counters(
        **{
            "vllm:prefix_cache_hits_total": 512,
            "vllm:external_prefix_cache_hits_total": 1536 + 64,  # 64 tokens off: within one chunk
            "lmcache_mp_lookup_hit_l1_keys_total": 6,
            "lmcache_mp_lookup_hit_l2_keys_total": 3,  # one chunk off: within the 1-chunk floor
        }
    )
    checks = A.reconcile(s, agree)
    assert checks["gpu"] == {"requests": 512.0, "counter": 512.0, "diff": 0.0, "within": True}
    assert checks["lmcache"]["diff"] == -64.0 and checks["lmcache"]["within"] is True
    assert checks["l2_chunks"]["diff"] == -1.0 and checks["l2_chunks"]["within"] is True
    figures = A.reconcile_figures(s, agree)
    assert figures["attrib_mismatch"] == ""
    assert figures["attrib_l1_share"] == pytest.approx(1024 / 3600)
    # 2000 external hits in the counter: 464 more than the records say, beyond max(5 %, 256).
    apart = _counters(**{"vllm:external_prefix_cache_hits_total": 2000})
    figures = A.reconcile_figures(s, apart)
    assert figures["attrib_mismatch"] == "lmcache" and figures["attrib_lmcache_diff"] == -464.0
    assert A.reconcile_figures(s, _counters())["attrib_mismatch"] is None  # nothing to check against


def _summary(cell_id: str, tier: str, concurrency: int = 2, **over: Any) -> dict[str, Any]:
    """A summary row of a cell that ran clean (analysis/summary.py columns the validity rules read)."""
    row = {"cell_id": cell_id, "tier": tier, "model": "m", "concurrency": concurrency, "num_rounds": 3,
           "isl": 8192, "osl": "32", "repeat": 0, "node": "n1", "status": "done", "done": True,
           "valid": True, "achieved_sessions": 2, "failed_requests": 0, "attrib_mismatch": ""}  # fmt: skip
    return {**row, **over}


# 12 requests of a gpu cell from 12 users, nothing cached: TTFT against recomputed 1K tokens
# x = 1,1,2,2,3,3 (twice), y = .05,.07,.09,.11,.13,.15 (twice): mean x 2, mean y .10, Sxx 8, Sxy .32 ->
# slope .04 s per 1K, base .02 (both above zero, so the constrained fit is the ordinary one).
XS = [1000, 1000, 2000, 2000, 3000, 3000] * 2
YS = [0.05, 0.07, 0.09, 0.11, 0.13, 0.15] * 2
LINE = pd.DataFrame(
    [
        _req(1 + i % 2, x, y, cached_tokens=0, user_id=f"u{i}")
        for i, (x, y) in enumerate(zip(XS, YS, strict=True))
    ]
)


def test_costs_by_hand() -> None:
    costs = A.source_costs(A.token_sources(LINE, connector=False))
    assert (costs["requests"], costs["sessions"]) == (12, 12) and costs["base_s"] == pytest.approx(0.02)
    assert costs["basis"] == "client" and costs["method"] == "non-negative least squares"
    rec = costs["recomputed"]
    assert rec.verdict is A.Verdict.COST and rec.s_per_1k == pytest.approx(0.04)
    # residuals of +-10 ms against a 40 ms slope: the 95 % interval of 12 sessions is well above zero
    assert 0 < rec.low < 0.04 < rec.high < 0.06
    # no request had a token from the GPU prefix cache or LMCache: no cost, and why
    assert costs["gpu"] == A.Cost(
        A.Verdict.NOT_ESTIMABLE, why="no request had tokens from the GPU prefix cache"
    )
    assert costs["l1"].verdict is A.Verdict.NOT_ESTIMABLE and costs["l1"].s_per_1k is None
    # With the server's own TTFT on every request, the fit uses it (queue and network left out): here
    # the client saw 10 ms more each time, which only the base takes up.
    served = LINE.assign(server_ttft_s=LINE["ttft_s"] - 0.01)
    costs = A.source_costs(A.token_sources(served, connector=False))
    assert costs["basis"] == "server" and costs["base_s"] == pytest.approx(0.01)
    assert costs["recomputed"].s_per_1k == pytest.approx(0.04)


def test_a_cost_needs_requests_and_sessions() -> None:
    # Too few requests carrying the source: not estimable, the number said.
    few = A.source_costs(A.token_sources(LINE.iloc[:5], connector=False))["recomputed"]
    assert few == A.Cost(
        A.Verdict.NOT_ESTIMABLE, why="only 5 request(s) had recomputed tokens (a cost needs 10)"
    )
    # The same 12 requests from 2 users: the fit stands, but 2 sessions give no interval, so the cost is
    # not told from zero and says so.
    two = A.source_costs(A.token_sources(LINE.assign(user_id=["a", "b"] * 6), connector=False))
    rec = two["recomputed"]
    assert (rec.verdict, rec.low, rec.high) == (A.Verdict.NO_INTERVAL, None, None)
    assert rec.s_per_1k == pytest.approx(0.04) and two["sessions"] == 2
    assert A.cost_words(rec) == "40 ms (too few sessions for an interval: not told from zero)"


def _hits(gpu_cost: float, noise: float) -> pd.DataFrame:
    """24 requests of a gpu cell, one user each: recomputed r and GPU-cached g (in 1K tokens) in the four
    combinations (1,0), (1,2), (2,0), (2,2), six requests each; TTFT = .01 + .04 r + gpu_cost g, plus
    +noise / -noise alternately within each combination (so the noise sums to zero in each: orthogonal
    to every column, and the ordinary fit recovers .01, .04 and gpu_cost exactly)."""
    rows = []
    for i in range(24):
        r, g = ((1, 0), (1, 2), (2, 0), (2, 2))[i % 4]
        e = noise if (i // 4) % 2 == 0 else -noise
        rows.append(_req(2, 1000 * (r + g), 0.01 + 0.04 * r + gpu_cost * g + e, cached_tokens=1000 * g,
                         user_id=f"u{i}"))  # fmt: skip
    return pd.DataFrame(rows)


def test_a_fit_that_puts_a_cost_below_zero_gives_no_negative_cost() -> None:
    # Ordinary least squares: base .01, recomputed .04, GPU -.005 s per 1K (a hit making TTFT shorter).
    # Constrained to b >= 0: GPU at 0, and the rest refitted without it; g is balanced against r, so
    # the recomputed slope stays .04 and the base takes the mean of -.005 g: .01 - .005 x 1 = .005.
    # (KKT: the GPU column's gradient sum g (.005 (g - 1)) = 12 x 2 x .005 = .12 > 0 at the bound.)
    # Noise-free, every resample gives the same: the unconstrained GPU cost is below zero beyond any
    # noise, so the verdict is "below zero" and no cost is given at all.
    costs = A.source_costs(A.token_sources(_hits(-0.005, 0.0), connector=False))
    assert costs["base_s"] == pytest.approx(0.005)
    assert costs["recomputed"].verdict is A.Verdict.COST
    assert costs["recomputed"].s_per_1k == pytest.approx(0.04)
    gpu = costs["gpu"]
    assert (gpu.verdict, gpu.s_per_1k) == (A.Verdict.BELOW_ZERO, None)
    assert gpu.why is not None and gpu.why.startswith(
        "unconstrained least squares puts it below zero, its whole"
    )
    shares = {"gpu": 0.5, "l1": 0.0, "l2": 0.0, "recomputed": 0.5}
    said = A.statement("gpu", shares, costs) or ""
    assert "from the GPU prefix cache no cost: the data put it below zero" in said, said
    assert not re.search(r"(^|[\s(])-\d", said), said  # no negative number anywhere in the sentence


def test_a_cost_the_data_cannot_tell_from_zero_is_said_so() -> None:
    # Ordinary least squares: GPU -.0005 s per 1K (-0.5 ms), with +-10 ms of noise: its standard error
    # is about .01 / sqrt(24) = 2 ms per 1K, so the data cannot tell it from zero (the demo's
    # "-1.49 +- 1.3 ms"). Constrained: GPU 0, base .01 - .0005 = .0095, recomputed .04.
    costs = A.source_costs(A.token_sources(_hits(-0.0005, 0.01), connector=False))
    assert costs["base_s"] == pytest.approx(0.0095)
    assert costs["recomputed"].s_per_1k == pytest.approx(0.04)
    gpu = costs["gpu"]
    assert (gpu.verdict, gpu.s_per_1k, gpu.low) == (A.Verdict.ZERO, 0.0, 0.0)
    assert gpu.high is not None and 0.0 < gpu.high < 0.01
    said = A.statement("gpu", {"gpu": 0.5, "l1": 0.0, "l2": 0.0, "recomputed": 0.5}, costs) or ""
    assert f"from the GPU prefix cache not told from zero (at most {gpu.high * 1000:.3g} ms)" in said, said
    assert not re.search(r"(^|[\s(])-\d", said), said


def _nvme(l2_chunks: list[int]) -> pd.DataFrame:
    """24 streamed nvme requests (no cached_token_stats: the coarse split), one user each: prompt
    1000 + 100 i, cached 256 (i % 8), LMCache L2 lookup chunks as given; TTFT exactly
    .01 + .002 per 1K other cached + .02 per 1K L2 lookup hits + .05 per 1K recomputed."""
    rows = []
    for i, chunks in enumerate(l2_chunks):
        prompt, cached = 1000 + 100 * i, 256 * (i % 8)
        l2 = min(256 * chunks, cached)
        ttft = 0.01 + 0.002 * (cached - l2) / 1000 + 0.02 * l2 / 1000 + 0.05 * (prompt - cached) / 1000
        said = {"cached_tokens": cached, "lmcache_l2_hit_chunks": chunks, "lmcache_l1_hit_chunks": 0}
        rows.append(_req(1 + i % 3, prompt, ttft, user_id=f"u{i}", t_start=float(i), latency_s=0.5, **said))
    return pd.DataFrame(rows)


def test_the_coarse_split_where_the_server_does_not_split_the_caches() -> None:
    # An nvme cell streamed by vLLM 0.32: no cached_token_stats, so the GPU/LMCache split is unknown;
    # cached_tokens and the L2 lines are known. The TTFTs are exact, so the fit recovers the three costs
    # and every resample gives them again.
    chunks = [i % 3 for i in range(24)]
    s = A.token_sources(_nvme(chunks), connector=True, chunk=256.0)
    assert s["gpu"].isna().all() and s["recomputed"].isna().all()  # the fine split is unknown
    # request 2: cached 512, 2 L2 chunks -> 512 L2 lookup hits, 0 other; request 4: cached 1024, 1 chunk
    assert (s["l2_hit"].iloc[2], s["cached_other"].iloc[2], s["missed"].iloc[2]) == (512, 0, 688)
    assert (s["l2_hit"].iloc[4], s["cached_other"].iloc[4]) == (256, 768)
    assert s["l2_hit"].iloc[1] == 256 and s["cached_other"].iloc[1] == 0  # L2 hits capped at the cached
    assert A.source_costs(s)["gpu"].verdict is A.Verdict.NOT_ESTIMABLE
    costs = A.source_costs(s, A.COARSE)
    assert costs["requests"] == 24 and costs["base_s"] == pytest.approx(0.01)
    for name, value in (("cached_other", 0.002), ("l2_hit", 0.02), ("missed", 0.05)):
        assert costs[name].verdict is A.Verdict.COST, name
        assert costs[name].s_per_1k == pytest.approx(value) and costs[name].low == pytest.approx(value)
    smp = _counters(lmcache_mp_lookup_hit_l2_tokens_total=4096, lmcache_mp_lookup_hit_l2_keys_total=16)
    smp["cell_id"] = "c"
    [nvme] = A.tier_attribution(pd.DataFrame([_summary("c", "nvme")]), _nvme(chunks), smp)
    assert nvme.split == "coarse" and nvme.costs["split"] == "coarse"
    assert set(nvme.shares_later) == set(A.COARSE)
    said = nvme.statement or ""
    assert said.startswith("nvme at concurrency 2, num_rounds 3 on n1: from round 2 on, "), said
    assert "from LMCache L2 lookup hits 20 ms (95 % CI 20-20)" in said, said
    assert "TTFT per 1K prompt tokens: recomputed 50 ms (95 % CI 50-50)" in said, said


def test_a_source_few_requests_carry_has_no_cost() -> None:
    # The same nvme cell where two requests had L2 lookup hits (a later-round share that rounds to
    # "0 %"), then none: no L2 cost, and why; the other two are still fitted.
    two = A.source_costs(A.token_sources(_nvme([0] * 22 + [2, 3]), connector=True, chunk=256.0), A.COARSE)
    why = "only 2 request(s) had tokens from LMCache L2 lookup hits (a cost needs 10)"
    assert two["l2_hit"] == A.Cost(A.Verdict.NOT_ESTIMABLE, why=why)
    assert two["missed"].verdict is A.Verdict.COST
    none = A.source_costs(A.token_sources(_nvme([0] * 24), connector=True, chunk=256.0), A.COARSE)
    assert none["l2_hit"].why == "no request had tokens from LMCache L2 lookup hits"
    said = A.statement("nvme", {"cached_other": 0.3, "l2_hit": 0.0, "missed": 0.7}, none) or ""
    assert "L2" not in said and "recomputed 50 ms" in said, said


def test_rounds_and_statement_by_hand() -> None:
    smp = _counters(lmcache_mp_lookup_hit_l1_tokens_total=1536, lmcache_mp_lookup_hit_l1_keys_total=6)
    view = A.tier_attribution(pd.DataFrame([_summary("c", "cpu")]), CPU, smp)[0]
    r = view.rounds.set_index("round")
    assert r.loc[1, "recomputed_tokens"] == 1000 and r.loc[1, "requests"] == 1
    assert (r.loc[2, "gpu_tokens"], r.loc[2, "l1_tokens"], r.loc[2, "l2_tokens"]) == (512, 1024, 512)
    assert r.loc[2, "ttft_p50_s"] == pytest.approx(0.035)
    # Rounds 2+: 2600 prompt tokens, L1 1024 (39 %), GPU 512 (20 %), L2 512 (20 %), recomputed 552 (21 %).
    assert view.shares_later["l1"] == pytest.approx(1024 / 2600)
    assert view.statement is not None and view.split == "fine"
    head = "cpu at concurrency 2, num_rounds 3 on n1: from round 2 on, 39 % of prompt tokens came from"
    assert view.statement.startswith(head + " LMCache L1")
    assert "recomputed 21 %" in view.statement
    # 3 requests: too few to fit, and the sentence says so instead of a cost
    assert view.costs["requests"] == 3 and view.costs["base_s"] is None
    assert view.statement.endswith("do not give the cost of any source (the cost table says why).")
    assert view.as_dict()["rounds"][0]["round"] == 1 and view.as_dict()["concurrency"] == 2


def test_the_coarse_rounds_say_what_every_request_says() -> None:
    # A cpu cell streamed by vLLM 0.32 (no cached_token_stats), chunks of 256 tokens:
    #  round 1: 1000 prompt, nothing cached, no lookup hit
    #  round 2: 1200 prompt, 1024 cached, 4 L1 lookup chunks; 1400 prompt, 1024 cached, 4 L1 chunks
    # -> round 2: cached 2048, recomputed 176 + 376 = 552, L1 lookup hits 8 x 256 = 2048, L2 0 (known).
    streamed = pd.DataFrame(
        [
            _req(1, 1000, 0.05, cached_tokens=0, lmcache_l1_hit_chunks=0, lmcache_l2_hit_chunks=0),
            _req(2, 1200, 0.03, cached_tokens=1024, lmcache_l1_hit_chunks=4, lmcache_l2_hit_chunks=0),
            _req(2, 1400, 0.05, cached_tokens=1024, lmcache_l1_hit_chunks=4, lmcache_l2_hit_chunks=0),
        ]
    )
    smp = _counters(lmcache_mp_lookup_hit_l1_tokens_total=2048, lmcache_mp_lookup_hit_l1_keys_total=8)
    [view] = A.tier_attribution(pd.DataFrame([_summary("c", "cpu")]), streamed, smp)
    assert view.split == "coarse"
    r = view.rounds.set_index("round")
    assert r.loc[1, ["cached_tokens", "missed_tokens", "l1_lookup_tokens", "l2_lookup_tokens"]].tolist() == [
        0, 1000, 0, 0]  # fmt: skip
    assert r.loc[2, ["cached_tokens", "missed_tokens", "l1_lookup_tokens", "l2_lookup_tokens"]].tolist() == [
        2048, 552, 2048, 0]  # fmt: skip
    assert (r.loc[2, "said_cached"], r.loc[2, "looked_up"], r.loc[2, "attributed"]) == (2, 2, 0)


# --- per comparison group and valid cell (issue 43) ---
# A cpu cell "f" of the same group that failed: three requests, everything recomputed.
FAILED = pd.DataFrame(
    [{**_req(k, 1000, 0.5, vllm_cached_tokens=0, lmcache_loaded_tokens=0, lmcache_l1_hit_chunks=0,
             lmcache_l2_hit_chunks=0), "cell_id": "f"} for k in (1, 2, 2)]
)  # fmt: skip


def test_a_failed_cell_does_not_change_the_attribution_of_the_valid_ones() -> None:
    smp = _counters(lmcache_mp_lookup_hit_l1_tokens_total=1536, lmcache_mp_lookup_hit_l1_keys_total=6)
    alone = A.tier_attribution(pd.DataFrame([_summary("c", "cpu")]), CPU, smp)
    both = pd.DataFrame([_summary("c", "cpu"), _summary("f", "cpu", status="failed", failed_requests=2)])
    [view] = A.tier_attribution(both, pd.concat([CPU, FAILED], ignore_index=True), smp)
    assert view.cells == ["c"]
    assert view.excluded == [{"cell_id": "f", "reason": "status 'failed': a partial run"}]
    pd.testing.assert_frame_equal(view.rounds, alone[0].rounds)
    assert view.statement == alone[0].statement and view.shares_later == alone[0].shares_later
    # pooled, round 2 would be 5600 prompt tokens with 3552 recomputed (63 %), not L1's 39 %
    assert view.shares_later["l1"] == pytest.approx(1024 / 2600)


def test_cells_the_validity_rules_exclude_are_left_out_with_why() -> None:
    smp = _counters(lmcache_mp_lookup_hit_l1_tokens_total=1536, lmcache_mp_lookup_hit_l1_keys_total=6)
    rows = [
        _summary("c", "cpu"),
        _summary("f", "cpu", failed_requests=2),  # done, but not clean
        _summary("x", "cpu", attrib_mismatch="lmcache", attrib_lmcache_diff=-464.0),
        _summary("i", "cpu", done=False),  # interrupted before DONE
    ]
    requests = pd.concat([CPU, *(FAILED.assign(cell_id=c) for c in "fxi")], ignore_index=True)
    [view] = A.tier_attribution(pd.DataFrame(rows), requests, smp)
    assert view.cells == ["c"]
    reasons = {e["cell_id"]: e["reason"] for e in view.excluded}
    assert reasons["f"] == "cpu f did not run clean (2 failed request(s))"
    assert reasons["x"].startswith("the per-request token sources disagree with the counters")
    assert reasons["i"] == "status 'done' without DONE: a partial run"


def test_each_comparison_group_and_node_has_its_own_attribution() -> None:
    # c (concurrency 2) and c8 (concurrency 8, all recomputed) are two groups; r1 is c's repeat on the
    # same node (pooled with it, as the findings pool repeats); n2 is the same group on another node.
    smp = _counters(lmcache_mp_lookup_hit_l1_tokens_total=1536, lmcache_mp_lookup_hit_l1_keys_total=6)
    rows = [
        _summary("c", "cpu"),
        _summary("c8", "cpu", concurrency=8),
        _summary("r1", "cpu", repeat=1),
        _summary("n2", "cpu", node="n2"),
        _summary("g", "gpu"),
    ]
    requests = pd.concat(
        [CPU, FAILED.assign(cell_id="c8"), CPU.assign(cell_id="r1"), CPU.assign(cell_id="n2"),
         FAILED.assign(cell_id="g").drop(columns=["vllm_cached_tokens"]).assign(cached_tokens=0)],
        ignore_index=True,
    )  # fmt: skip
    smp = pd.concat([smp.assign(cell_id=c) for c in ("c", "c8", "r1", "n2")], ignore_index=True)
    views = A.tier_attribution(pd.DataFrame(rows), requests, smp)
    assert [(v.group, v.tier, v.cells) for v in views] == [
        ("m c=2 rounds=3 isl=8192 osl=32 on n1", "gpu", ["g"]),
        ("m c=2 rounds=3 isl=8192 osl=32 on n1", "cpu", ["c", "r1"]),
        ("m c=8 rounds=3 isl=8192 osl=32 on n1", "cpu", ["c8"]),
        ("m c=2 rounds=3 isl=8192 osl=32 on n2", "cpu", ["n2"]),
    ]
    # the repeat doubles every round-2 figure of c; c8's requests stay out of it
    assert views[1].rounds.set_index("round").loc[2, "l1_tokens"] == 2048
    assert views[2].shares_later["recomputed"] == 1.0


# Two users of a gpu cell. u1: round 1 sent at t=100 took 1.5 s (ended 101.5); round 2 sent at 102.5
# (age 1.0 s) ended 103.5; round 3 failed once at 110 (age 6.5 s) and was retried at 140 (age 36.5 s).
# u2: round 1 sent at 100 ended 100.5; round 2 sent at 105.5 (age 5.0 s) ended 106.5; round 3 sent at
# 306.5 (age 200 s).
AGED = pd.DataFrame(
    [
        _req(1, 1000, 0.1, user_id="u1", t_start=100.0, latency_s=1.5, cached_tokens=0),
        _req(2, 1200, 0.1, user_id="u1", t_start=102.5, latency_s=1.0, cached_tokens=900),
        {**_req(3, 1400, None, user_id="u1", t_start=110.0, latency_s=None), "status": "error"},
        _req(3, 1400, 0.1, user_id="u1", t_start=140.0, latency_s=1.0, cached_tokens=700),
        _req(1, 1000, 0.1, user_id="u2", t_start=100.0, latency_s=0.5, cached_tokens=0),
        _req(2, 1000, 0.1, user_id="u2", t_start=105.5, latency_s=1.0, cached_tokens=800),
        _req(3, 1000, 0.1, user_id="u2", t_start=306.5, latency_s=1.0, cached_tokens=100),
    ]
)  # fmt: skip


def test_turn_age_is_the_time_since_the_users_previous_round_ended() -> None:
    ages = A.turn_age(AGED)
    assert math.isnan(ages.iloc[0]) and math.isnan(ages.iloc[4])  # first rounds have no previous turn
    assert ages.iloc[1] == pytest.approx(1.0) and ages.iloc[5] == pytest.approx(5.0)
    assert ages.iloc[2] == pytest.approx(6.5)  # the failed attempt has an age too
    assert ages.iloc[3] == pytest.approx(36.5)
    assert ages.iloc[6] == pytest.approx(200.0)


def test_hit_share_by_age_bucket_by_hand() -> None:
    table = A.by_age(A.token_sources(AGED, connector=False)).set_index("age")
    # ok requests only: < 2 s: u1 r2 (900 of 1200); 2-10 s: u2 r2 (800 of 1000);
    # 30-120 s: u1 r3 (700 of 1400); >= 120 s: u2 r3 (100 of 1000); 10-30 s: nobody (no row).
    assert list(table.index) == ["< 2 s", "2-10 s", "30-120 s", ">= 120 s"]
    assert table["requests"].tolist() == [1, 1, 1, 1]
    assert table["hit_share"].tolist() == pytest.approx([0.75, 0.8, 0.5, 0.1])
    assert table["median_age_s"].tolist() == pytest.approx([1.0, 5.0, 36.5, 200.0])
    # on a gpu cell LMCache loads nothing: its share is 0 wherever the engine said its cached tokens
    assert table["lmcache_share"].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0])
    # without the record fields that make an age, no row (older results still report)
    assert A.by_age(A.token_sources(AGED.drop(columns=["t_start"]), connector=False)).empty
