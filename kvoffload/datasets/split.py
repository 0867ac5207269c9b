"""Split recorded calls into sessions where a call's input does not extend the previous one.

Real traces hold interleaved runs under one id and histories rewritten mid-session; treating those as one
session would make the replay claim prefix reuse that never existed. Pure functions, no IO.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from kvoffload.datasets.model import Call, Session


def extends(previous: Call, current: Call) -> bool:
    """True when `current.messages` starts with every message of `previous.messages`."""
    prev, cur = previous.messages, current.messages
    return len(cur) >= len(prev) and cur[: len(prev)] == prev


def split_sessions(calls: Iterable[Call]) -> list[Session]:
    """Group calls by recorded session id (first-seen order) and split at non-extensions.

    Sub-sessions after the first get the id `<session_id>/<k>` (k = 1, 2, ...); call indexes restart at 0.
    """
    by_id: dict[str, list[Call]] = {}
    for call in calls:
        by_id.setdefault(call.session_id, []).append(call)
    sessions: list[Session] = []
    for session_id, group in by_id.items():
        parts: list[list[Call]] = [[group[0]]]
        for call in group[1:]:
            if extends(parts[-1][-1], call):
                parts[-1].append(call)
            else:
                parts.append([call])
        for k, part in enumerate(parts):
            sid = session_id if k == 0 else f"{session_id}/{k}"
            sessions.append(
                Session(sid, tuple(replace(c, session_id=sid, index=i) for i, c in enumerate(part)))
            )
    return sessions
