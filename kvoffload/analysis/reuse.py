"""Reuse opportunity from token ids: the share of prompt tokens an unbounded prefix cache could serve.

For prompts in send order, a prompt's reusable tokens are its longest prefix, in whole blocks, that
equals a prefix of any earlier prompt (the same user's history or a prefix shared with other users).
Pure functions over token-id sequences; the caller tokenizes (kvoffload.tokenizer) and looks prompts up
(kvoffload/report/prompts.py reads the cell's dataset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pandas as pd

# vLLM's default KV block size: a prefix is reusable in whole blocks of this many tokens.
BLOCK_TOKENS = 16


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


def records_prefix_reuse(
    requests: pd.DataFrame,
    prompt_ids: Callable[[str, int, int], Sequence[int] | None],
    block_size: int = BLOCK_TOKENS,
) -> float | None:
    """`prefix_reuse` over one cell's request records in send order (`t_start`), each prompt looked up
    by (session_id, chunk, round); None without records or when any prompt cannot be looked up."""
    if requests.empty:
        return None
    rows = requests.sort_values(["t_start", "request_id"], kind="stable")
    prompts = []
    for session, chunk, rnd in zip(rows["session_id"], rows["chunk"], rows["round"], strict=True):
        ids = prompt_ids(str(session), int(chunk), int(rnd))
        if ids is None:
            return None
        prompts.append(ids)
    return prefix_reuse(prompts, block_size)
