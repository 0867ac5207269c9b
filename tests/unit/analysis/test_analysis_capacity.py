"""Capacity predictions, the measured knee and the recommendation's bounds, worked out by hand."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from kvoffload.analysis.capacity import (
    GIB,
    HostMemory,
    Stated,
    gpu_cache_figures,
    knees,
    kv_bytes_from_model_config,
    l2_from_hosts,
    lmcache_capacity_figures,
    lmcache_host_memory,
    predict,
    within_host_memory,
)
from kvoffload.analysis.findings import Finding
from kvoffload.analysis.recommend import recommend
from tests.support.models import LLAMA_8B, LLAMA_8B_KV
from tests.unit.analysis.analysis_frames import samples_frame

CACHE_LABELS = {"block_size": "16", "num_gpu_blocks": "1000", "kv_cache_memory_bytes": "65536000"}


def test_gpu_capacity_from_cache_config_info_of_every_replica() -> None:
    labels = {**CACHE_LABELS, "kv_cache_size_tokens": "16000"}
    s = samples_frame(
        [
            ("run", 0, "vllm-0", "vllm:cache_config_info", labels, 1.0),
            ("run", 15, "vllm-0", "vllm:cache_config_info", labels, 1.0),
            ("run", 0, "vllm-1", "vllm:cache_config_info", labels, 1.0),
        ]
    )
    f = gpu_cache_figures(s)
    # 2 replicas x 1000 blocks x 16 tokens; 65536000 B / 16000 tokens = 4096 B per token.
    assert f["gpu_replicas"] == 2 and f["gpu_num_blocks"] == 1000 and f["gpu_block_size"] == 16
    assert f["gpu_cache_tokens"] == 32000.0
    assert f["vllm_kv_bytes_per_token"] == 4096.0
    assert gpu_cache_figures(samples_frame([]))["gpu_cache_tokens"] is None


def test_l1_pool_size_from_usage_bytes_over_ratio() -> None:
    lab = {"backend": "dram", "l1_tag": "_default"}
    s = samples_frame(
        [
            ("run", 0, "lmcache", "lmcache_mp_l1_memory_usage_bytes", lab, 1.0e6),
            ("run", 0, "lmcache", "lmcache_mp_l1_usage_ratio", lab, 0.001),  # below 1 %: too coarse
            ("run", 15, "lmcache", "lmcache_mp_l1_memory_usage_bytes", lab, 5.0e8),
            ("run", 15, "lmcache", "lmcache_mp_l1_usage_ratio", lab, 0.25),
            ("run", 15, "lmcache", "lmcache_mp_l2_usage_bytes", {"l2_name": "fs_native"}, 3.0e9),
            ("run", 30, "lmcache", "lmcache_mp_l2_usage_bytes", {"l2_name": "fs_native"}, 2.0e9),
        ]
    )
    f = lmcache_capacity_figures(s)
    assert f["lmcache_l1_capacity_bytes"] == pytest.approx(2.0e9)  # 5e8 / 0.25
    assert f["lmcache_l2_usage_bytes_max"] == pytest.approx(3.0e9)


def test_kv_bytes_from_a_model_config() -> None:
    cfg = {"num_hidden_layers": 36, "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": "bfloat16"}
    s = kv_bytes_from_model_config(cfg, "/models/qwen3-8b/config.json")
    assert s.value == 2 * 36 * 8 * 128 * 2 == 147456
    assert "/models/qwen3-8b/config.json" in s.source and "36 layers" in s.source
    # head_dim from hidden_size / heads when absent
    llama = {
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_attention_heads": 32,
        "hidden_size": 4096,
    }
    assert kv_bytes_from_model_config({**llama, "torch_dtype": "float16"}, "x").value == 131072
    missing = kv_bytes_from_model_config({"num_hidden_layers": 2}, "y")
    assert missing.value is None and "lacks" in missing.source


def test_tensor_parallel_size_2_on_cuda_gives_the_replicas_kv_bytes() -> None:
    """vLLM 0.32 on CUDA: kv_cache_memory_bytes (given) is per GPU, kv_cache_size_tokens per replica. A
    TP-2 Llama-3.1-8B replica with 8 GiB per GPU: each GPU holds 4 of the 8 KV heads, 65536 B a token, so
    8589934592 B hold 131072 tokens (8192 blocks of 16) on each GPU and in the replica. Bytes per token
    of the replica: 8589934592 x 2 / 131072 = 131072, as the model's config gives; main's
    8589934592 / 131072 = 65536 is half of it, and would double the cpu/nvme capacity predicted."""
    labels = {
        "block_size": "16",
        "num_gpu_blocks": "8192",
        "kv_cache_memory_bytes": "8589934592",
        "kv_cache_size_tokens": "131072",
    }
    s = samples_frame(
        [
            ("run", 0, "vllm-gpu1-0", "vllm:cache_config_info", labels, 1.0),
            ("run", 0, "vllm-gpu1-1", "vllm:cache_config_info", labels, 1.0),
        ]
    )
    targets = {
        "vllm-gpu1-0": {"kind": "vllm", "host": "gpu1", "gpus": "0,1"},
        "vllm-gpu1-1": {"kind": "vllm", "host": "gpu1", "gpus": "2,3"},
        "lmcache": {"kind": "lmcache", "host": "gpu1", "gpus": None},
    }
    f = gpu_cache_figures(s, targets)
    assert f["vllm_kv_bytes_per_token"] == LLAMA_8B_KV
    assert f["vllm_tensor_parallel_size"] == 2
    assert f["gpu_cache_tokens"] == 2 * 8192 * 16  # tokens are per replica already: not scaled
    assert kv_bytes_from_model_config(LLAMA_8B, "cfg", [2]).value == LLAMA_8B_KV  # the two agree
    # An older cell.json names no GPUs: a size of 1 is assumed, the per-GPU quotient
    older = gpu_cache_figures(s, {"vllm-gpu1-0": {"kind": "vllm"}, "vllm-gpu1-1": {"kind": "vllm"}})
    assert older["vllm_kv_bytes_per_token"] == 65536.0 and older["vllm_tensor_parallel_size"] is None
    # The prediction divides the L1 pool by the replica's bytes, and says where the size came from:
    # 2e9 B x 0.8 / 131072 B = 12207 tokens.
    row = _cell(
        "c",
        "cpu",
        8,
        lmcache_l1_capacity_bytes=2.0e9,
        **{k: f[k] for k in ("vllm_kv_bytes_per_token", "vllm_tensor_parallel_size")},
    )
    (p,) = predict(pd.DataFrame([row]))
    assert p.tokens == pytest.approx(2.0e9 * 0.8 / 131072)
    kv = next(i for i in p.inputs if i.name == "KV bytes per token")
    assert "x tensor-parallel size 2" in kv.source and "per GPU" in kv.source
    (old,) = predict(
        pd.DataFrame([{**row, "vllm_kv_bytes_per_token": 65536.0, "vllm_tensor_parallel_size": None}])
    )
    assert "1 where an older file names none" in next(i for i in old.inputs if i.name == kv.name).source


def test_kv_bytes_of_a_model_config_under_tensor_parallelism_and_engine_dtypes() -> None:
    """Per-token KV of the whole replica: the same at TP 1, 2, 4 and 8 (the 8 KV heads split over the
    ranks); at TP 16 vLLM gives each rank one copy of a head, 16 heads: 2 x 32 x 16 x 128 x 2 = 262144."""
    for tp in (1, 2, 4, 8):
        assert kv_bytes_from_model_config(LLAMA_8B, "cfg", [tp]).value == LLAMA_8B_KV
    wide = kv_bytes_from_model_config(LLAMA_8B, "cfg", [16])
    assert wide.value == 262144 and "one on each of 16 tensor-parallel ranks" in wide.source
    mixed = kv_bytes_from_model_config(LLAMA_8B, "cfg", [8, 16])
    assert mixed.value is None and "tensor-parallel sizes 8, 16" in mixed.source
    # a float32 checkpoint runs in bfloat16 under --dtype auto: 2 B, not 4
    f32 = kv_bytes_from_model_config({**LLAMA_8B, "torch_dtype": "float32"}, "cfg")
    assert f32.value == LLAMA_8B_KV and "--dtype auto" in f32.source
    assert (
        kv_bytes_from_model_config(
            {**LLAMA_8B, "torch_dtype": "float32"}, "cfg", (), ["--dtype", "float32"]
        ).value
        == 2 * LLAMA_8B_KV
    )
    # transformers >= 4.56 writes `dtype`
    new = {k: v for k, v in LLAMA_8B.items() if k != "torch_dtype"} | {"dtype": "float16"}
    assert kv_bytes_from_model_config(new, "cfg").value == LLAMA_8B_KV
    # the campaign's --kv-cache-dtype fp8 halves it; a scaled format is not guessed
    assert (
        kv_bytes_from_model_config(LLAMA_8B, "cfg", [2], ["--kv-cache-dtype=fp8"]).value == LLAMA_8B_KV // 2
    )
    nvfp4 = kv_bytes_from_model_config(LLAMA_8B, "cfg", [2], ["--kv_cache_dtype", "nvfp4"])
    assert nvfp4.value is None and "nvfp4" in nvfp4.source
    # a multimodal config keeps the text model's shape in text_config
    assert kv_bytes_from_model_config({"text_config": LLAMA_8B}, "cfg").value == LLAMA_8B_KV
    mla = kv_bytes_from_model_config({**LLAMA_8B, "kv_lora_rank": 512, "qk_rope_head_dim": 64}, "cfg")
    assert mla.value is None and "MLA" in mla.source


def test_l2_capacity_from_the_device_size() -> None:
    hosts = {"gpu1": {"nvme": [{"device": "/dev/nvme0n1", "size_bytes": 4.0e12}]}}
    frac = Stated("L2 capacity fraction", 0.9, "", "nvme.yaml")
    s = l2_from_hosts(hosts, "nvme0n1", frac)
    assert s.value == pytest.approx(3.6e12)
    assert "nvme0n1 on gpu1" in s.source
    assert l2_from_hosts(hosts, "loop3", frac).value is None
    assert l2_from_hosts(hosts, None, frac).source == "unavailable: cell.json names no l2_device"


def _cell(cell_id: str, tier: str, concurrency: int, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "cell_id": cell_id,
        "tier": tier,
        "model": "m",
        "concurrency": concurrency,
        "num_rounds": 10,
        "isl": 32768,
        "osl": "recorded",
        "repeat": 0,
        "virtual_users_available": 1000,
        "sessions_replayed": 100,
        "live_context_mean_tokens": 10000.0,
        "gpu_cache_tokens": None,
        "gpu_num_blocks": None,
        "gpu_block_size": None,
        "gpu_replicas": None,
        "vllm_kv_bytes_per_token": None,
        "lmcache_l1_capacity_bytes": None,
        "lmcache_l2_usage_bytes_max": None,
        "lmcache_l1_size_gb": None,
        "later_round_cached_share": 0.9,
        "ttft_degradation_p50_pct": 10.0,
        "ttft_later_p50_s": 1.0,
        "ttft_later_p95_s": 2.0,
        "comparable": True,
    }
    row.update(over)
    return row


def test_predictions_in_tokens_and_sessions() -> None:
    """gpu: 2 replicas x 25000 blocks x 16 = 800 k tokens; cpu: 4 GiB L1 x LMCache's eviction watermark
    0.8 / 4096 B = 838,861 tokens; nvme: 1e12 B L2 x 0.8 / 4096 B. Mean live context over the three cells:
    (10000 x 100 + 20000 x 300 + 10000 x 100) / 500 = 16000 tokens."""
    gpu = {"gpu_cache_tokens": 800000.0, "gpu_num_blocks": 25000, "gpu_block_size": 16, "gpu_replicas": 2}
    summary = pd.DataFrame(
        [
            _cell("g", "gpu", 8, **gpu),
            _cell(
                "c", "cpu", 8, sessions_replayed=300, live_context_mean_tokens=20000.0, lmcache_l1_size_gb=4.0
            ),
            _cell("n", "nvme", 8),
        ]
    )
    kv = {cid: Stated("KV bytes per token", 4096.0, "B", "profile") for cid in ("c", "n")}
    l2 = {"n": Stated("L2 capacity", 1.0e12, "B", "device")}
    preds = {p.tier: p for p in predict(summary, kv, {}, l2)}
    assert preds["gpu"].tokens == 800000.0
    assert preds["gpu"].sessions == pytest.approx(50.0)
    assert preds["cpu"].tokens == pytest.approx(4 * GIB * 0.8 / 4096)
    assert preds["cpu"].sessions == pytest.approx(4 * GIB * 0.8 / 4096 / 16000)
    assert preds["nvme"].tokens == pytest.approx(1.0e12 * 0.8 / 4096)
    sources = {s.name: s.source for s in preds["cpu"].inputs}
    assert "LMCache 0.5.6 default of L1 --eviction-trigger-watermark" in sources["eviction watermark"]
    assert "lmcache_l1_size_gb = 4 GiB" in sources["L1 pool"]
    assert "mean over 500 sessions" in sources["mean live context per session"]
    # Without an L2 size nothing is predicted for nvme, and the reason says so.
    bare = {p.tier: p for p in predict(summary, kv, {}, {})}
    assert bare["nvme"].tokens is None and bare["nvme"].missing is not None
    assert "L2 capacity" in bare["nvme"].missing


def test_vllm_kv_bytes_is_the_fallback_and_metrics_win_for_l1() -> None:
    summary = pd.DataFrame(
        [
            _cell(
                "c",
                "cpu",
                8,
                vllm_kv_bytes_per_token=2048.0,
                lmcache_l1_capacity_bytes=2.0e9,
                lmcache_l1_size_gb=64,
            )
        ]
    )
    (p,) = predict(summary)
    assert p.tokens == pytest.approx(2.0e9 * 0.8 / 2048)
    assert "lmcache /metrics" in p.inputs[0].source and "cache_config_info" in p.inputs[2].source


def test_an_offload_tier_retains_only_up_to_its_eviction_watermark() -> None:
    """A profile's L1 watermark of 0.5 halves what the cpu tier retains: 2e9 B x 0.5 / 2048 B."""
    summary = pd.DataFrame(
        [_cell("c", "cpu", 8, vllm_kv_bytes_per_token=2048.0, lmcache_l1_capacity_bytes=2.0e9)]
    )
    mark = {"cpu": Stated("eviction watermark", 0.5, "", "kvoffload/profiles/lmcache/cpu.yaml")}
    (p,) = predict(summary, watermarks=mark)
    assert p.tokens == pytest.approx(5.0e8 / 1024)
    assert [s.name for s in p.inputs][:2] == ["L1 pool", "eviction watermark"]


def test_knee_bracket_on_the_hit_rate_collapse() -> None:
    """Hit rates 90, 80, 40, 10 % at concurrency 8, 16, 32, 64: the first below half of 90 % (45 %) is
    at 32, so the knee lies between 16 and 32; live history 16 x 10000 and 32 x 10000 tokens."""
    summary = pd.DataFrame(
        [
            _cell(f"g{c}", "gpu", c, later_round_cached_share=h)
            for c, h in ((8, 0.9), (16, 0.8), (32, 0.4), (64, 0.1))
        ]
        + [_cell(f"c{c}", "cpu", c, later_round_cached_share=0.9) for c in (8, 16, 32, 64)]
    )
    found = {k.tier: k for k in knees(summary)}
    g = found["gpu"]
    assert g.status == "found" and g.axis == "concurrency"
    assert g.bracket == [16, 32]
    assert g.history_bracket_tokens == [160000.0, 320000.0]
    assert "between concurrency 16 (160 k tokens" in g.statement
    c = found["cpu"]
    assert c.status == "not_reached" and "not reached in the measured range" in c.statement


def test_knee_on_degradation_without_hit_rates_and_the_user_ceiling() -> None:
    """No hit rates: degradation +10, +40, +70 %; the limit is +10 + 50 = +60, crossed at 32. Concurrency
    64 with 40 virtual users holds only 40 sessions of live history."""
    rows = [
        _cell(f"g{c}", "gpu", c, later_round_cached_share=None, ttft_degradation_p50_pct=d)
        for c, d in ((8, 10.0), (16, 40.0), (32, 70.0))
    ]
    rows.append(_cell("g64", "gpu", 64, later_round_cached_share=None, virtual_users_available=40))
    (k,) = knees(pd.DataFrame(rows))
    assert k.status == "found" and k.bracket == [16, 32]
    assert "degradation" in k.criterion
    assert k.points[-1].live_history_tokens == 40 * 10000.0


def test_recommendation_bounds_come_from_measured_cells() -> None:
    """gpu fastest at 8 and 16, cpu at 32 and 64, nvme at 128: ranges bounded by those cells' live
    history (x 10000 tokens); gpu's hit rate collapses at 32, so a capacity was crossed."""
    rows = []
    best = {8: "gpu", 16: "gpu", 32: "cpu", 64: "cpu", 128: "nvme"}
    for c, winner in best.items():
        for tier in ("gpu", "cpu", "nvme"):
            hit = 0.1 if tier == "gpu" and c >= 32 else 0.9
            rows.append(
                _cell(
                    f"{tier}{c}",
                    tier,
                    c,
                    ttft_later_p50_s=0.5 if tier == winner else 1.0,
                    later_round_cached_share=hit,
                )
            )
    summary = pd.DataFrame(rows)
    ks = knees(summary)
    (r,) = recommend(summary, predict(summary), ks)
    assert [(s.tier, s.from_concurrency, s.to_concurrency) for s in r.segments] == [
        ("gpu", 8, 16),
        ("cpu", 32, 64),
        ("nvme", 128, 128),
    ]
    assert [(s.from_history_tokens, s.to_history_tokens) for s in r.segments][1] == (320000.0, 640000.0)
    assert r.knee_crossed and r.extend_to_concurrency is None
    assert r.statement.startswith("gpu up to 160 k (concurrency 16) tokens of live history, cpu from 320 k")
    assert "the gpu-to-cpu crossover lies between 160 k and 320 k tokens" in r.statement


def test_recommendation_without_a_knee_says_how_far_to_extend() -> None:
    """No knee; gpu's predicted capacity is 500 k tokens = 50 sessions of 10000: extend to 50."""
    gpu = {"gpu_cache_tokens": 500000.0, "gpu_num_blocks": 31250, "gpu_block_size": 16, "gpu_replicas": 1}
    rows = [_cell(f"g{c}", "gpu", c, **gpu) for c in (8, 16)]
    rows += [_cell(f"c{c}", "cpu", c, ttft_later_p50_s=0.8) for c in (8, 16)]
    rows[1]["comparable"] = rows[3]["comparable"] = False
    summary = pd.DataFrame(rows)
    (r,) = recommend(summary, predict(summary), knees(summary))
    assert not r.knee_crossed and r.extend_to_concurrency == 50
    assert "extend concurrency to 50 (where live history reaches gpu's predicted 500 k tokens)" in r.statement
    assert r.excluded == ["concurrency 16: not comparable"]
    assert r.segments[0].tier == "cpu" and r.segments[0].to_concurrency == 8


def test_a_knee_in_one_isl_sweep_does_not_mark_another_crossed() -> None:
    rows = []
    for isl in (32768, 8192):
        for c in (8, 16, 32):
            hit = 0.1 if isl == 32768 and c == 32 else 0.9  # only the 32 k sweep collapses
            rows += [_cell(f"g{isl}-{c}", "gpu", c, isl=isl, later_round_cached_share=hit),
                     _cell(f"c{isl}-{c}", "cpu", c, isl=isl, ttft_later_p50_s=0.8)]  # fmt: skip
    summary = pd.DataFrame(rows)
    ks = knees(summary)
    assert {(k.fixed["isl"], k.status) for k in ks if k.tier == "gpu"} == {
        (32768, "found"),
        (8192, "not_reached"),
    }
    recs = {r.isl: r for r in recommend(summary, predict(summary), ks)}
    assert recs[32768].knee_crossed and not recs[8192].knee_crossed
    assert "the sweep did not cross a capacity" in recs[8192].statement


def test_live_history_counts_the_sessions_that_ran_and_no_advice_exceeds_the_dataset() -> None:
    """216 users, 116 dropped by the isl filter, max_sessions 32: at concurrency 32 and 64 the same 32
    sessions ran, so both hold 32 x 10000 tokens; gpu's 500 k tokens would need 50 sessions: no advice
    to extend beyond the 32 the cells could replay."""
    gpu = {"gpu_cache_tokens": 500000.0, "gpu_num_blocks": 31250, "gpu_block_size": 16, "gpu_replicas": 1}
    users = {"virtual_users_available": 216, "sessions_dropped_by_isl": 116, "achieved_sessions": 32}
    rows = [_cell(f"g{c}", "gpu", c, **gpu, **users) for c in (8, 32, 64)]
    rows += [_cell(f"c{c}", "cpu", c, ttft_later_p50_s=0.8, **users) for c in (8, 32, 64)]
    summary = pd.DataFrame(rows)
    ks = knees(summary)
    cpu = next(k for k in ks if k.tier == "cpu")
    assert [p.live_history_tokens for p in cpu.points] == [80000.0, 320000.0, 320000.0]
    (r,) = recommend(summary, predict(summary), ks)
    assert r.segments[0].to_history_tokens == 320000.0
    assert r.extend_to_concurrency is None
    assert "the cells replayed at most 32 virtual users at this num_rounds" in r.statement
    assert "which the sweep already reached" in r.statement
    # a sweep below the ceiling: gpu's capacity lies at 50 sessions, beyond the 32 the cells could replay
    low = summary[summary["concurrency"] < 32]
    (r,) = recommend(low, predict(low), knees(low))
    assert r.extend_to_concurrency is None
    assert "only at 50 concurrent sessions, but the cells replayed at most 32 virtual users" in r.statement
    assert "extend concurrency to" not in r.statement


def _finding(tier: str, concurrency: int, ci: list[float] | None, exercised: bool | None = True) -> Finding:
    return Finding(
        group="g", model="m", concurrency=concurrency, num_rounds=10, isl=32768, osl="recorded", tier=tier,
        cells=[], repeats=1, comparable=True, not_comparable_reasons=[], caveats=[],
        offload_exercised=exercised, later_p50_s=None, later_p50_ci_s=None, later_p95_s=None,
        later_p95_ci_s=None, p50_change_vs_gpu_pct=None if ci is None else sum(ci) / 2,
        p50_change_ci_pct=ci, p95_change_vs_gpu_pct=None, p95_change_ci_pct=None, sessions=10,
        gpu_prefix_token_share=None, lmcache_token_share=None, lmcache_l1_hit_share=None,
        lmcache_l2_hit_share=None, routing=None, statement="",
    )  # fmt: skip


def test_an_offload_lead_inside_its_interval_or_without_offload_recommends_the_simpler_tier() -> None:
    """cpu has the lower p50 at 2, 8 and 16; only at 8 is it measurably faster with offload exercised.
    At 2 its CI spans 0 (the demo's -17 %, CI -39 to +8 %), at 16 offload was never exercised: gpu."""
    rows = []
    for c in (2, 8, 16):
        rows += [_cell(f"g{c}", "gpu", c), _cell(f"c{c}", "cpu", c, ttft_later_p50_s=0.8)]
    summary = pd.DataFrame(rows)
    found = [
        _finding("cpu", 2, [-39.0, 8.0]),
        _finding("cpu", 8, [-40.0, -10.0]),
        _finding("cpu", 16, [-40.0, -10.0], exercised=False),
    ]
    (r,) = recommend(summary, predict(summary), knees(summary), found)
    assert [(s.tier, s.from_concurrency, s.to_concurrency) for s in r.segments] == [
        ("gpu", 2, 2), ("cpu", 8, 8), ("gpu", 16, 16)
    ]  # fmt: skip
    assert (
        r.simpler[0]
        == "gpu at concurrency 2: cpu is indistinguishable from gpu (-16 %, 95 % CI -39 to +8 %: the "
        "interval includes 0)"
    )
    assert r.simpler[1].startswith("gpu at concurrency 16: cpu's offload was never exercised")
    assert "the simpler tier where the faster one's lead is not shown" in r.statement
    # without findings the table's p50 alone decides, as before
    (plain,) = recommend(summary, predict(summary), knees(summary))
    assert [s.tier for s in plain.segments] == ["cpu"] and plain.simpler == []


def test_the_lmcache_hosts_memory_comes_from_cell_json() -> None:
    """The lmcache target's host in `targets`, its `ram_gib` in `hosts`: 23.5 GiB = 25232932864 B."""
    hosts = {"kvlab1": {"ram_gib": 64}, "kvlab3": {"ram_gib": 23.5}}
    targets = {
        "vllm-kvlab1-0": {"kind": "vllm", "host": "kvlab1"},
        "lmcache": {"kind": "lmcache", "host": "kvlab3"},
    }
    assert lmcache_host_memory(hosts, targets) == {
        "lmcache_host": "kvlab3",
        "lmcache_host_memory_bytes": 25232932864.0,
    }
    # a gpu cell (no lmcache target) and a host the file does not size: unknown
    assert (
        lmcache_host_memory(hosts, {"vllm-0": {"kind": "vllm", "host": "kvlab1"}})[
            "lmcache_host_memory_bytes"
        ]
        is None
    )
    assert lmcache_host_memory({}, targets) == {"lmcache_host": "kvlab3", "lmcache_host_memory_bytes": None}


def test_an_l1_pool_beyond_the_hosts_memory_is_bounded_by_it() -> None:
    """Issue 53: the cpu profile's 64 GiB L1 on a 23.5 GiB host predicted 64 GiB x 0.8 / 4096 B =
    13.4 M tokens. Bounded by the host: 23.5 GiB x 0.8 / 4096 B = 4,928,307 tokens (492.8 sessions of
    10000 tokens); a campaign's 100 GiB is bounded the same way, a 16 GiB pool is not."""
    kv = {"c": Stated("KV bytes per token", 4096.0, "B", "profile")}
    profile = {"cpu": Stated("L1 pool", 64.0, "GiB", "kvoffload/profiles/lmcache/cpu.yaml l1_size_gb")}
    host = {"lmcache_host": "kvlab3", "lmcache_host_memory_bytes": 23.5 * GIB}

    def cpu(**over: Any) -> Any:
        summary = pd.DataFrame([_cell("c", "cpu", 8, **{**host, **over})])
        return next(p for p in predict(summary, kv, profile) if p.tier == "cpu")

    bounded = cpu()
    assert bounded.tokens == pytest.approx(4928307.2)
    assert bounded.sessions == pytest.approx(492.83072)
    pool = bounded.inputs[0]
    assert pool.name == "L1 pool" and pool.value == 23.5 * GIB
    assert pool.source == (
        "kvoffload/profiles/lmcache/cpu.yaml l1_size_gb = 64 GiB, more than the 23.5 GiB of memory of "
        "kvlab3, the lmcache-server host of cell c (cell.json hosts ram_gib): bounded by that memory (a "
        "real server could pin no more; the simulator counts the configured bytes without allocating "
        "them), at most 23.5 GiB"
    )
    # the report hands the profile's figure in bounded already (report/build.py capacity_inputs): the same
    already = within_host_memory(profile["cpu"], HostMemory(23.5 * GIB, "kvlab3", "c"))
    summary = pd.DataFrame([_cell("c", "cpu", 8, **host)])
    again = next(p for p in predict(summary, kv, {"cpu": already}) if p.tier == "cpu")
    assert again.tokens == bounded.tokens and again.inputs[0] == pool
    campaign = cpu(lmcache_l1_size_gb=100.0)
    assert campaign.tokens == pytest.approx(4928307.2)
    assert campaign.inputs[0].source.startswith(
        "cell.json config.lmcache_l1_size_gb (cell c) = 100 GiB, more than the 23.5 GiB of memory of kvlab3"
    )
    fits = cpu(lmcache_l1_size_gb=16.0)
    assert fits.tokens == pytest.approx(16 * GIB * 0.8 / 4096)
    assert fits.inputs[0].source == "cell.json config.lmcache_l1_size_gb = 16 GiB (cell c)"
    # a host of unknown memory bounds nothing
    assert cpu(lmcache_host_memory_bytes=None).tokens == pytest.approx(64 * GIB * 0.8 / 4096)
