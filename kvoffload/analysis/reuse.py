"""Reuse opportunity from token ids: the share of prompt tokens an unbounded prefix cache could serve.

For prompts in send order, a prompt's reusable tokens are its longest prefix, in whole blocks, that
equals a prefix of any earlier prompt (the same user's history or a prefix shared with other users).
Pure function over token-id sequences; the caller tokenizes (kvoffload.tokenizer) and orders.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def prefix_reuse(prompts: Iterable[Sequence[int]], block_size: int = 1) -> float | None:
    """Reusable tokens / all prompt tokens; None when there are no tokens. block_size >= 1."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    seen: set[int] = set()
    reusable = total = 0
    for tokens in prompts:
        total += len(tokens)
        chain = 0
        matching = True
        full = len(tokens) - len(tokens) % block_size
        for start in range(0, full, block_size):
            chain = hash((chain, tuple(tokens[start : start + block_size])))
            if matching and chain in seen:
                reusable += block_size
            else:
                matching = False
                seen.add(chain)
    return reusable / total if total else None
