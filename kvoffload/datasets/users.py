"""Virtual users: consecutive chunks of exactly `num_rounds` calls of a session.

The sammshen loader has no floor on chunk length; every other dataset goes through the generic loader,
whose minimum chunk length is 5 (LMCache's `--min-chunk-rounds 5`), so `num_rounds < 5` yields no users
at all. The number of users at a given num_rounds is the dataset's concurrency ceiling. Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.datasets.model import Session, VirtualUser

MIN_CHUNK_ROUNDS = 5
NO_FLOOR_CODES = frozenset({"sammshen"})


def chunk_floor(code: str) -> int:
    """Smallest num_rounds that yields users for a dataset code."""
    return 1 if code in NO_FLOOR_CODES else MIN_CHUNK_ROUNDS


def virtual_users(
    sessions: Sequence[Session], code: str, num_rounds: int, min_chunk_rounds: int | None = None
) -> list[VirtualUser]:
    """Every session, in recorded order, sliced into consecutive chunks of exactly `num_rounds` calls."""
    floor = chunk_floor(code) if min_chunk_rounds is None else min_chunk_rounds
    if num_rounds < max(floor, 1):
        return []
    users: list[VirtualUser] = []
    for session in sessions:
        for chunk in range(len(session.calls) // num_rounds):
            calls = session.calls[chunk * num_rounds : (chunk + 1) * num_rounds]
            users.append(VirtualUser(f"{session.session_id}:{chunk}", session.session_id, chunk, calls))
    return users


def ceiling_table(sessions: Sequence[Session], code: str, max_rounds: int = 50) -> dict[int, int]:
    """Virtual users available for num_rounds 1..max_rounds (no user list built)."""
    floor = chunk_floor(code)
    lengths = [len(s.calls) for s in sessions]
    return {r: (sum(n // r for n in lengths) if r >= floor else 0) for r in range(1, max_rounds + 1)}
