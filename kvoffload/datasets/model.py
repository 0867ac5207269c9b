"""Dataset records shared by every loader: calls, sessions and virtual users.

Pure data; no IO. A `Call` is one recorded LLM call: the full `messages` list the model saw (teacher-forced
history, OpenAI shape) plus the recorded output length and the think/tool gap before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]


@dataclass(frozen=True)
class Call:
    """One recorded LLM call."""

    session_id: str
    index: int
    messages: tuple[Message, ...]
    output_length: int | None = None
    pre_gap: float = 0.0
    source: str = ""


@dataclass(frozen=True)
class Session:
    """Calls of one conversation whose inputs extend each other, in recorded order."""

    session_id: str
    calls: tuple[Call, ...]


@dataclass(frozen=True)
class VirtualUser:
    """A chunk of exactly `num_rounds` consecutive calls of one session, replayed as one user."""

    user_id: str
    session_id: str
    chunk: int
    calls: tuple[Call, ...]
