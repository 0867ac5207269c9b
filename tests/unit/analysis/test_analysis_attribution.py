"""Per-request attribution worked out by hand on small record sets: sources, reconciliation, costs."""

from __future__ import annotations

import math
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


def test_costs_by_hand() -> None:
    # gpu tier, nothing cached: TTFT against recomputed 1K tokens x = 1,1,2,2,3,3.
    # y = .05,.07,.09,.11,.13,.15: mean x 2, mean y .10, Sxx 4, Sxy .16 -> slope .04 s per 1K, base .02;
    # residuals +-.01, variance 6e-4 / (6 - 2) = 1.5e-4, slope stderr sqrt(1.5e-4 / 4) = .0061237.
    ys = [0.05, 0.07, 0.09, 0.11, 0.13, 0.15]
    xs = [1000, 1000, 2000, 2000, 3000, 3000]
    req = pd.DataFrame(
        [_req(1 + i % 2, x, y, cached_tokens=0) for i, (x, y) in enumerate(zip(xs, ys, strict=True))]
    )
    costs = A.source_costs(A.token_sources(req, connector=False))
    assert costs["requests"] == 6 and costs["base_s"] == pytest.approx(0.02)
    assert costs["basis"] == "client"  # no server TTFT in these records
    rec = costs["recomputed"]
    assert rec.s_per_1k == pytest.approx(0.04) and rec.stderr == pytest.approx(math.sqrt(1.5e-4 / 4))
    assert costs["gpu"] is None and costs["l1"] is None  # never a source here: no cost
    # With the server's own TTFT on every request, the fit uses it (queue and network left out): here
    # the client saw 10 ms more each time, which only the base takes up.
    served = req.assign(server_ttft_s=req["ttft_s"] - 0.01)
    costs = A.source_costs(A.token_sources(served, connector=False))
    assert costs["basis"] == "server" and costs["base_s"] == pytest.approx(0.01)
    assert costs["recomputed"].s_per_1k == pytest.approx(0.04)
    # Too few requests for the coefficients: no fit at all.
    assert A.source_costs(A.token_sources(req.iloc[:5], connector=False))["recomputed"] is None


def test_rounds_and_statement_by_hand() -> None:
    cells = pd.DataFrame([{"cell_id": "c", "tier": "cpu"}])
    smp = _counters(lmcache_mp_lookup_hit_l1_tokens_total=1536, lmcache_mp_lookup_hit_l1_keys_total=6)
    view = A.tier_attribution(cells, CPU, smp)[0]
    r = view.rounds.set_index("round")
    assert r.loc[1, "recomputed_tokens"] == 1000 and r.loc[1, "requests"] == 1
    assert (r.loc[2, "gpu_tokens"], r.loc[2, "l1_tokens"], r.loc[2, "l2_tokens"]) == (512, 1024, 512)
    assert r.loc[2, "ttft_p50_s"] == pytest.approx(0.035)
    # Rounds 2+: 2600 prompt tokens, L1 1024 (39 %), GPU 512 (20 %), L2 512 (20 %), recomputed 552 (21 %).
    assert view.shares_later["l1"] == pytest.approx(1024 / 2600)
    assert view.statement is not None
    assert view.statement.startswith("cpu: from round 2 on, 39 % of prompt tokens came from LMCache L1")
    assert "recomputed 21 %" in view.statement
    assert view.costs["requests"] == 3 and view.costs["base_s"] is None  # 3 requests: too few to fit
    assert view.as_dict()["rounds"][0]["round"] == 1


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


def test_the_coarse_split_where_the_server_does_not_split_the_caches() -> None:
    # An nvme cell streamed by vLLM 0.32: no cached_token_stats, so the GPU/LMCache split is unknown;
    # cached_tokens and the L2 lines are known. TTFT = 0.01 + 0.002 s/1K (GPU or L1) + 0.02 s/1K (L2)
    # + 0.05 s/1K recomputed, exactly, so the fit recovers the three costs.
    rows = []
    for i, (cached, l2_chunks, prompt) in enumerate(
        [(0, 0, 1000), (512, 0, 1500), (1024, 2, 2000), (2048, 4, 2600), (768, 1, 1800), (1536, 3, 2400),
         (256, 0, 900), (2048, 0, 3000), (1280, 5, 1900), (512, 2, 800), (1792, 2, 2200), (0, 0, 700)]
    ):  # fmt: skip
        l2 = min(l2_chunks * 256, cached)
        ttft = 0.01 + 0.002 * (cached - l2) / 1000 + 0.02 * l2 / 1000 + 0.05 * (prompt - cached) / 1000
        said = {"cached_tokens": cached, "lmcache_l2_hit_chunks": l2_chunks, "lmcache_l1_hit_chunks": 0}
        rows.append(_req(1 + i % 3, prompt, ttft, user_id=f"u{i}", t_start=float(i), latency_s=0.5, **said))
    s = A.token_sources(pd.DataFrame(rows), connector=True, chunk=256.0)
    assert s["gpu"].isna().all() and s["recomputed"].isna().all()  # the fine split is unknown
    assert s["l2_hit"].tolist()[:4] == [0, 0, 512, 1024] and s["missed"].tolist()[:2] == [1000, 988]
    assert s["l2_hit"].iloc[9] == 512 and s["cached_other"].iloc[9] == 0  # L2 hits capped at the cached
    assert A.source_costs(s)["requests"] == 0
    costs = A.source_costs(s, A.COARSE)
    assert costs["requests"] == 12 and costs["base_s"] == pytest.approx(0.01)
    assert costs["cached_other"].s_per_1k == pytest.approx(0.002)
    assert costs["l2_hit"].s_per_1k == pytest.approx(0.02)
    assert costs["missed"].s_per_1k == pytest.approx(0.05)
    smp = _counters(lmcache_mp_lookup_hit_l2_tokens_total=4096, lmcache_mp_lookup_hit_l2_keys_total=16)
    smp["cell_id"] = "c"
    views = A.tier_attribution(pd.DataFrame({"tier": ["nvme"], "cell_id": ["c"]}), pd.DataFrame(rows), smp)
    [nvme] = views
    assert nvme.costs["split"] == "coarse" and set(nvme.shares_later) == set(A.COARSE)
    said = nvme.statement or ""
    assert said.startswith("nvme: from round 2 on, 42 % of prompt tokens were recomputed"), said
    assert "from LMCache L2 20 ± " in said and "against 50 ± " in said, said
    assert "(the GPU prefix cache or LMCache L1 36 %, LMCache L2 21 %)" in said, said
