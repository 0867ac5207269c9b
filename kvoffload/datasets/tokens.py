"""Input tokens per round of a dataset: what `plan` and `datasets inspect` show next to the ceilings.

Round r is the r-th call of a virtual user (with `num_rounds`) or of a whole session (without); its
input is the full teacher-forced history that call sent, counted with whatever `Tokenizer` the caller
chose (the caller says which one). Pure: no IO beyond what the tokenizer does, no printing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kvoffload.datasets.model import Call, Session
from kvoffload.datasets.users import virtual_users
from kvoffload.tokenizer import ChatCounter, Tokenizer

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class RoundTokens:
    """Input-token percentiles (nearest rank) of the calls at one round."""

    round: int
    calls: int
    p50: int
    p90: int
    p99: int
    max: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def nearest_rank(sorted_values: Sequence[int], pct: float) -> int:
    """The `pct` percentile of ascending `sorted_values` by nearest rank (a value that occurred)."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _rounds(sessions: Sequence[Session], code: str, num_rounds: int | None) -> list[Sequence[Call]]:
    if num_rounds is None:
        return [s.calls for s in sessions]
    return [u.calls for u in virtual_users(sessions, code, num_rounds)]


def round_tokens(
    sessions: Sequence[Session],
    tokenizer: Tokenizer,
    code: str,
    num_rounds: int | None = None,
    max_rounds: int = 50,
) -> list[RoundTokens]:
    """Per-round input-token percentiles for rounds 1..max_rounds that have calls.

    With `num_rounds`, rounds are those of the virtual users the replay would run (chunks of exactly
    num_rounds calls); without, they are the calls of each whole session.
    """
    counter = ChatCounter(tokenizer)
    per_round: dict[int, list[int]] = {}
    for calls in _rounds(sessions, code, num_rounds):
        for r, call in enumerate(calls[:max_rounds], start=1):
            per_round.setdefault(r, []).append(counter.count(call.messages))
    out = []
    for r in sorted(per_round):
        values = sorted(per_round[r])
        p50, p90, p99 = (nearest_rank(values, p) for p in PERCENTILES)
        out.append(RoundTokens(r, len(values), p50, p90, p99, values[-1]))
    return out
