"""The replay's output records: one `RequestRecord` per request (requests.jsonl) and `SessionCounts`
(sessions.json). DESIGN.md section 6 is the contract; bump `SCHEMA` on any change of fields or meaning.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

SCHEMA = 1
Status = Literal["ok", "error", "timeout"]


@dataclass(frozen=True)
class RequestRecord:
    """One replayed request, as measured by the client (times in seconds, monotonic except t_start)."""

    user_id: str
    session_id: str
    chunk: int
    round: int
    request_id: str
    t_start: float
    ttft_s: float | None
    latency_s: float | None
    tpot_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    status: Status
    http_status: int | None
    error: str | None
    replica: str | None
    schema: int = SCHEMA

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)


@dataclass
class SessionCounts:
    """What the replay achieved against what was asked: the basis of every comparison's validity."""

    requested_concurrency: int
    num_rounds: int
    virtual_users_available: int
    dropped_by_isl: int = 0
    achieved_sessions: int = 0
    complete: int = 0
    incomplete: int = 0
    error: int = 0
    failed_requests: int = 0
    requests: int = 0
    interrupted: bool = False
    stopped_by: str = "pool"
    duration_s: float = 0.0
    schema: int = SCHEMA

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)
