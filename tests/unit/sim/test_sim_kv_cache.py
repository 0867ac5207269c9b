"""The engine's block pool: prefix hits, LRU eviction of free blocks, tail-first freeing, usage."""

from __future__ import annotations

from kvoffload.sim.hashing import chain_hashes
from kvoffload.sim.kv_cache import KVCache


def _hashes(tokens: list[int]) -> list[bytes]:
    return chain_hashes(tokens, 4, b"m")


def _run(kv: KVCache, tokens: list[int]) -> int:
    """Admit, compute, register and free one prompt; return its hit blocks."""
    hs = _hashes(tokens)
    hits = kv.count_hits(hs, (len(tokens) - 1) // 4)
    need = kv.blocks_needed(len(tokens) + 1)
    assert kv.can_allocate(hits, need, hs)
    alloc = kv.allocate(hits, need, hs)
    kv.register(alloc, hs, len(tokens) // 4)
    kv.free(alloc)
    return hits


def test_chain_hashes_are_prefix_stable_and_seeded() -> None:
    a = chain_hashes(list(range(12)), 4, b"m")
    b = chain_hashes([*range(8), 99, 9, 10, 11], 4, b"m")
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert chain_hashes(list(range(12)), 4, b"other")[0] != a[0]
    assert chain_hashes(list(range(11)), 4, b"m") == a[:2]  # partial block has no hash


def test_second_request_hits_the_prefix_but_not_the_last_token() -> None:
    kv = KVCache(num_blocks=10, block_size=4)
    tokens = list(range(16))
    assert _run(kv, tokens) == 0
    # 16 tokens = 4 full blocks, but one token must be computed: at most 3 blocks hit.
    assert _run(kv, tokens) == 3
    assert _run(kv, [*tokens, 16, 17, 18, 19, 20]) == 4


def test_free_blocks_are_evicted_least_recent_first_and_tails_first() -> None:
    kv = KVCache(num_blocks=8, block_size=4)
    # Three prompts of 8 tokens: 2 full blocks each (cached) plus 1 for the next token, freed in the
    # order a, b, c. The free queue then holds, front first: a's 2nd block, a's 1st, b's spare, b's
    # 2nd, b's 1st, then c's (a's spare was handed to c; never-used blocks went first).
    a, b, c = ([base + i for i in range(8)] for base in (1000, 2000, 3000))
    for prompt in (a, b, c):
        assert _run(kv, prompt) == 0
    assert kv.evicted_blocks == 0  # nothing cached was needed yet
    hits = {name: kv.count_hits(_hashes(t), 2) for name, t in (("a", a), ("b", b), ("c", c))}
    assert hits == {"a": 2, "b": 2, "c": 2}

    # One fresh block: the least recently freed prompt (a) loses its tail block, not its first.
    _run(kv, [9000, 9001])
    assert kv.evicted_blocks == 1
    assert [kv.count_hits(_hashes(t), 2) for t in (a, b, c)] == [1, 2, 2]

    # Three more: a's first block, b's spare (empty, no eviction), then b's tail; c, freed last, stays.
    _run(kv, [8000 + i for i in range(8)])
    assert kv.evicted_blocks == 3
    assert [kv.count_hits(_hashes(t), 2) for t in (a, b, c)] == [0, 1, 2]
    assert kv.usage() == 0.0


def test_usage_counts_held_blocks_only() -> None:
    kv = KVCache(num_blocks=8, block_size=4)
    hs = _hashes(list(range(8)))
    alloc = kv.allocate(0, 3, hs)
    assert kv.usage() == 3 / 8
    kv.free(alloc)
    assert kv.usage() == 0.0


def test_reset_forgets_hashes_only_when_idle() -> None:
    kv = KVCache(num_blocks=8, block_size=4)
    tokens = list(range(9))
    _run(kv, tokens)
    alloc = kv.allocate(0, 1, [])
    assert kv.reset() is False
    kv.free(alloc)
    assert kv.reset() is True
    assert _run(kv, tokens) == 0


def test_prefix_caching_off_never_hits() -> None:
    kv = KVCache(num_blocks=8, block_size=4, enable_prefix_caching=False)
    tokens = list(range(9))
    _run(kv, tokens)
    assert _run(kv, tokens) == 0
