"""Choosing the virtual users a replay runs: chunking, the `--isl` depth filter and `--max-sessions`.

The depth filter counts a user's deepest context (its last round: inputs only grow within a session)
with the model's own tokenizer when it is available locally, the deterministic fallback otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvoffload.datasets import Session, VirtualUser, virtual_users
from kvoffload.tokenizer import Tokenizer, render_chat


@dataclass(frozen=True)
class UserPool:
    users: tuple[VirtualUser, ...]
    available: int  # chunks at this num_rounds, before the depth filter
    dropped_by_isl: int


def select_users(
    sessions: Sequence[Session],
    code: str,
    num_rounds: int,
    *,
    min_chunk_rounds: int | None = None,
    isl: int | None = None,
    tokenizer: Tokenizer | None = None,
    max_sessions: int | None = None,
) -> UserPool:
    users = virtual_users(sessions, code, num_rounds, min_chunk_rounds)
    kept = users
    if isl is not None and tokenizer is not None:
        kept = [u for u in users if tokenizer.count(render_chat(u.calls[-1].messages)) <= isl]
    dropped = len(users) - len(kept)
    if max_sessions is not None:
        kept = kept[:max_sessions]
    return UserPool(tuple(kept), len(users), dropped)
