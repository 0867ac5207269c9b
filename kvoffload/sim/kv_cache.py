"""The engine's paged KV cache: fixed-size blocks, prefix caching by chained hashes, LRU of free blocks.

Mirrors vLLM's block pool closely enough for the metrics to mean the same thing:
- a request holds `ceil(tokens / block_size)` blocks; full prompt blocks are registered under their
  chained hash once computed, so a later request with the same prefix reuses them (a local hit);
- a freed block keeps its content and hash while it sits in the free queue; it is evicted (its hash
  forgotten) only when the queue hands it out again, least recently freed first; a request's blocks
  are freed tail first, so the end of a conversation is evicted before its shared beginning;
- usage is `1 - free / total`, where cached-but-unreferenced blocks count as free (as in vLLM).
Pure bookkeeping: no timing, no asyncio, no IO.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class Block:
    """One KV block."""

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


@dataclass
class Allocation:
    """The blocks one request holds, in order."""

    blocks: list[Block] = field(default_factory=list)


class KVCache:
    """Block pool with prefix caching (see module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order (front = evicted first); dict keeps O(1) removal on a hit.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[bytes, Block] = {}
        self.evicted_blocks = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def count_hits(self, block_hashes: list[bytes], max_blocks: int) -> int:
        """How many leading blocks of a prompt are cached now (at most `max_blocks`)."""
        if not self.enable_prefix_caching:
            return 0
        n = 0
        for h in block_hashes[:max_blocks]:
            if h not in self._cached:
                break
            n += 1
        return n

    def can_allocate(self, hit_blocks: int, total_blocks: int, block_hashes: list[bytes]) -> bool:
        """Whether `total_blocks` can be held with the first `hit_blocks` reused from the cache."""
        # Hit blocks that sit in the free queue stop being free once touched.
        free_hits = sum(1 for h in block_hashes[:hit_blocks] if self._cached[h].ref_cnt == 0)
        return self.num_free - free_hits >= total_blocks - hit_blocks

    def allocate(self, hit_blocks: int, total_blocks: int, block_hashes: list[bytes]) -> Allocation:
        """Take the hit blocks from the cache and fresh blocks for the rest (caller checked capacity)."""
        alloc = Allocation()
        for h in block_hashes[:hit_blocks]:
            block = self._cached[h]
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1
            alloc.blocks.append(block)
        self.grow(alloc, total_blocks - hit_blocks)
        return alloc

    def grow(self, alloc: Allocation, n: int) -> bool:
        """Append `n` fresh blocks (evicting cached free blocks LRU-first); False if too few are free."""
        if n > len(self._free):
            return False
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self._blocks[block_id]
            if block.block_hash is not None:
                if self._cached.get(block.block_hash) is block:
                    del self._cached[block.block_hash]
                block.block_hash = None
                self.evicted_blocks += 1
            block.ref_cnt = 1
            alloc.blocks.append(block)
        return True

    def register(self, alloc: Allocation, block_hashes: list[bytes], upto_blocks: int) -> int:
        """Record the hashes of the first `upto_blocks` computed blocks; returns how many were new."""
        if not self.enable_prefix_caching:
            return 0
        new = 0
        for block, h in zip(alloc.blocks[:upto_blocks], block_hashes[:upto_blocks], strict=False):
            if block.block_hash is not None:
                continue
            if h in self._cached:
                continue  # another request computed the same block first; keep theirs
            block.block_hash = h
            self._cached[h] = block
            new += 1
        return new

    def free(self, alloc: Allocation) -> None:
        """Release a request's blocks, tail first, so tails are evicted before shared prefixes."""
        for block in reversed(alloc.blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = None
        alloc.blocks = []

    def reset(self) -> bool:
        """Forget every cached hash (POST /reset_prefix_cache); refused while blocks are in use."""
        if len(self._free) != self.num_blocks:
            return False
        for block in self._blocks:
            block.block_hash = None
        self._cached.clear()
        return True
