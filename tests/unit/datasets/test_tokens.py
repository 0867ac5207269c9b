"""kvoffload/datasets/tokens.py: input-token percentiles per round."""

from __future__ import annotations

import pytest

from kvoffload.datasets.model import Call, Session
from kvoffload.datasets.tokens import nearest_rank, round_tokens
from kvoffload.tokenizer import FallbackTokenizer, render_chat


class _Words:
    """Counts words of the rendered chat, so the expected figures are easy to write down."""

    name = "words"

    def encode(self, text: str) -> list[int]:
        return [0] * len(text.split())

    def count(self, text: str) -> int:
        return len(text.split())


def _session(sid: str, words: list[int]) -> Session:
    """A session whose call k carries a user message of words[k] words (on top of the history)."""
    messages: list[dict[str, str]] = []
    calls = []
    for k, n in enumerate(words):
        messages = [*messages, {"role": "user", "content": " ".join(["w"] * n)}]
        calls.append(Call(sid, k, tuple(messages)))
    return Session(sid, tuple(calls))


def test_nearest_rank_returns_a_value_that_occurred() -> None:
    values = list(range(1, 101))
    assert [nearest_rank(values, p) for p in (50, 90, 99, 100)] == [50, 90, 99, 100]
    assert nearest_rank([5, 9], 50) == 5 and nearest_rank([5, 9], 51) == 9
    with pytest.raises(ValueError):
        nearest_rank([], 50)


def test_rounds_of_whole_sessions_count_the_growing_history() -> None:
    # A message of n words renders as "<|user|>\nw ... w<|end|>\n": n + 1 words (the header, and "<|end|>"
    # glued to the last w); the generation prompt adds one more per call.
    short = _session("a", [1, 2])
    long = _session("b", [3, 4, 5])
    rows = round_tokens([short, long], _Words(), "sammshen")
    assert [(r.round, r.calls) for r in rows] == [(1, 2), (2, 2), (3, 1)]
    assert (rows[0].p50, rows[0].max) == (3, 5)  # a: (1+1)+1; b: (3+1)+1
    assert (rows[1].p50, rows[1].p90, rows[1].max) == (6, 10, 10)  # a: 2+3+1; b: 4+5+1
    assert rows[2].p99 == rows[2].max == 3 + 1 + 4 + 1 + 5 + 1 + 1


def test_rounds_of_virtual_users_restart_at_each_chunk() -> None:
    session = _session("s", [1, 1, 1, 1])
    whole = round_tokens([session], _Words(), "sammshen")
    chunks = round_tokens([session], _Words(), "sammshen", num_rounds=2)
    assert len(whole) == 4 and len(chunks) == 2
    # Round 1 of the users of 2 rounds is call 1 and call 3 of the session.
    assert chunks[0].calls == 2
    assert (chunks[0].p50, chunks[0].max) == (whole[0].max, whole[2].max)
    assert round_tokens([session], _Words(), "sammshen", max_rounds=3)[-1].round == 3


def test_counts_match_the_tokenizer_on_the_whole_rendered_chat() -> None:
    session = _session("s", [7, 2, 9])
    rows = round_tokens([session], FallbackTokenizer(), "sammshen")
    assert [r.max for r in rows] == [
        FallbackTokenizer().count(render_chat(c.messages)) for c in session.calls
    ]
