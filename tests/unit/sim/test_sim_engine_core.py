"""The engine core without HTTP: prefix hits at admission, continuous batching, preemption, counters."""

from __future__ import annotations

import asyncio
import itertools
import time

from kvoffload.sim.engine import Engine, Request
from kvoffload.sim.engine_metrics import EngineMetrics
from kvoffload.sim.hashing import chain_hashes
from kvoffload.sim.kv_cache import KVCache
from kvoffload.sim.profile import load_profile
from tests.support.metrics import sample_values

BS = 16


def _request(tokens: list[int], max_tokens: int) -> Request:
    return Request(
        request_id=f"r{tokens[0]}-{len(tokens)}",
        num_prompt=len(tokens),
        block_hashes=chain_hashes(tokens, BS, b"m"),
        chunk_keys=[],
        max_tokens=max_tokens,
        arrival=time.monotonic(),
    )


def _counters(metrics: EngineMetrics) -> dict[str, float]:
    return sample_values(metrics.registry)


def _run(engine: Engine, batches: list[list[Request]]) -> None:
    async def main() -> None:
        task = asyncio.get_running_loop().create_task(engine.run())
        for batch in batches:
            for req in batch:
                engine.add(req)
            for req in batch:
                while not req.finished:
                    await req.notify.wait()
                    req.notify.clear()
        task.cancel()

    asyncio.run(main())


def _engine(num_blocks: int, max_num_seqs: int = 256, budget: int = 8192) -> tuple[Engine, EngineMetrics]:
    metrics = EngineMetrics("m", 32768, {"block_size": str(BS)})
    engine = Engine(load_profile("tiny"), KVCache(num_blocks, BS), metrics, max_num_seqs, budget)
    return engine, metrics


def test_repeat_prompt_hits_all_full_blocks_but_the_last_token() -> None:
    engine, metrics = _engine(num_blocks=200)
    tokens = list(range(1000))
    first, second = _request(tokens, 3), _request(tokens, 3)
    _run(engine, [[first], [second]])
    assert (first.cached_tokens, second.cached_tokens) == (0, (1000 - 1) // BS * BS)
    assert first.created_cache_tokens == 1000 // BS * BS
    assert second.num_output == 3
    c = _counters(metrics)
    assert c["vllm:prompt_tokens_total"] == c["vllm:prefix_cache_queries_total"] == 2000
    assert c["vllm:prefix_cache_hits_total"] == second.cached_tokens
    assert c["vllm:generation_tokens_total"] == 6
    assert c["vllm:request_success_total"] == 2
    assert c["vllm:inter_token_latency_seconds_count"] == 4  # 2 decode steps per request


def test_long_prompt_is_prefilled_in_budget_sized_chunks() -> None:
    engine, metrics = _engine(num_blocks=400, budget=512)
    req = _request(list(range(2000)), 1)
    _run(engine, [[req]])
    c = _counters(metrics)
    # 2000 prompt tokens in steps of at most 512: four prefill steps.
    assert c["vllm:iteration_tokens_total_count"] == 4
    assert c["vllm:iteration_tokens_total_sum"] == 2000


def test_decode_out_of_blocks_preempts_and_recomputes() -> None:
    # 3 requests of 100 prompt tokens, each growing to 100 + 150 tokens: 16 blocks each at the end,
    # 48 in all, in a cache of 30 blocks.
    engine, metrics = _engine(num_blocks=30)
    reqs = [_request([i * 10_000 + t for t in range(100)], 150) for i in range(3)]
    _run(engine, [reqs])
    c = _counters(metrics)
    assert c["vllm:num_preemptions_total"] > 0
    assert all(r.num_output == 150 for r in reqs)
    assert c["vllm:generation_tokens_total"] == 450
    # Recomputation after preemption is not counted as prompt tokens (as in vLLM).
    assert c["vllm:prompt_tokens_total"] == 300
    assert engine.kv.usage() == 0.0


def test_max_num_seqs_bounds_the_running_batch() -> None:
    engine, metrics = _engine(num_blocks=400, max_num_seqs=1)
    reqs = [_request([i * 10_000 + t for t in range(64)], 5) for i in range(3)]
    _run(engine, [reqs])
    # One sequence at a time: every request's first token comes after the previous one finished.
    for a, b in itertools.pairwise(reqs):
        assert a.finish_time is not None and b.first_token_time is not None
        assert b.first_token_time > a.finish_time
    assert _counters(metrics)["vllm:request_queue_time_seconds_count"] == 3
