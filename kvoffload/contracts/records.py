"""requests.jsonl and sessions.json: the request record and the session counts (docs/contracts.md).

One model per file, used by the replay that writes it and by ingest that reads it; ingest's column
schema is derived from `RequestRecord` (contracts/arrow.py). Bump `SCHEMA` on any change of fields or
meaning, and keep reading the older versions (`READABLE_SCHEMAS`): fields added later carry a default
that says what an older file meant. Models only; no IO.

Schema history: 1: first version. 2: request records gained `ttft_clock` and `late_s` (older files
read as `ttft_clock: "read"`, `late_s: null`). 3: request records gained the server's own per-request
answer (`response_id`, `server_queue_s`, `server_ttft_s`, `vllm_cached_tokens`, `lmcache_cached_tokens`,
`lmcache_loaded_tokens`; older files read them as null: the server was not asked). sessions.json's
`exceptions`, `stop_reason`, `first_error` and `warmup_errors` were added without a bump: readers ignore
keys they do not know.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = 3
READABLE_SCHEMAS = frozenset({1, 2, 3})
Status = Literal["ok", "error", "timeout"]


class Measurement(BaseModel):
    """What the client measured of one request (times in seconds, `perf_counter` except t_start).

    The replay client returns it; `RequestRecord` adds the replay's context to these same fields.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    t_start: float = Field(description="wall-clock time (Unix seconds) the request was sent")
    ttft_s: float | None = Field(description="time to first token (content or reasoning)")
    latency_s: float | None = Field(description="request sent to the end of the stream ([DONE])")
    tpot_s: float | None = Field(description="mean time per output token after the first")
    prompt_tokens: int | None = Field(description="usage.prompt_tokens of the answer")
    completion_tokens: int | None = Field(description="usage.completion_tokens of the answer")
    cached_tokens: int | None = Field(description="usage.prompt_tokens_details.cached_tokens")
    status: Status = Field(description="ok, error (HTTP or network failure, no token) or timeout")
    http_status: int | None = Field(description="HTTP status of the answer (null: none came)")
    error: str | None = Field(description="what failed, in words (null when ok)")
    replica: str | None = Field(description="replica that answered (Caddy's x-kvoffload-* header)")
    ttft_clock: str = Field(
        default="read",
        description="clock that stamped the first token: kernel (SO_TIMESTAMPNS receive time) or read "
        "(when the client's loop read it); files before schema 2 read as read",
    )
    late_s: float | None = Field(
        default=None,
        description="how late the client's read loop was behind the kernel stamp (null: unknown)",
    )
    # Schema 3: what the server itself said about this request (docs/contracts.md, "Per-request
    # attribution"). Null whenever the server did not say it; nothing here is inferred.
    response_id: str | None = Field(
        default=None,
        description="the answer's `id` (vLLM: chatcmpl-<16 hex>, the request id its engine and LMCache log)",
    )
    server_queue_s: float | None = Field(
        default=None,
        description="the server's own queue time, from the engine queueing the request to scheduling it "
        "(vLLM `metrics.queue_time_ms` / 1000, with --enable-per-request-metrics; null otherwise)",
    )
    server_ttft_s: float | None = Field(
        default=None,
        description="the server's own time to first token, from scheduling the request (after its queue "
        "time) to its first token: loads and prefill (vLLM `metrics.time_to_first_token_ms` / 1000; null "
        "unless the server sent it)",
    )
    vllm_cached_tokens: int | None = Field(
        default=None,
        description="prompt tokens the engine's own prefix cache (GPU) served (LMCache's "
        "`kv_transfer_params.cached_token_stats.num_vllm_cached_tokens`; null unless asked and answered)",
    )
    lmcache_cached_tokens: int | None = Field(
        default=None,
        description="prompt tokens LMCache's lookup found (`num_lmcache_cached_tokens`, a prefix that "
        "includes what the engine already had)",
    )
    lmcache_loaded_tokens: int | None = Field(
        default=None,
        description="prompt tokens loaded from LMCache beyond the engine's own hit "
        "(`num_lmcache_extra_cached_tokens`)",
    )


class RequestRecord(Measurement):
    """One line of requests.jsonl: a replayed request with its measurements."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    schema_: int = Field(default=SCHEMA, alias="schema", description="request record schema version")
    user_id: str = Field(description="virtual user (the x-user-id header; sticky routing key)")
    session_id: str = Field(description="recorded conversation the user replays")
    chunk: int = Field(description="chunk of the conversation (a long one is split into chunks)")
    round: int = Field(description="round (1-based request number) within the user's conversation")
    request_id: str = Field(description="unique id of this attempt")

    def to_json(self) -> str:
        """The record as one compact JSON line (no newline)."""
        return self.model_dump_json(by_alias=True)


# Context first, then the measurements: the column order of the requests table.
REQUEST_FIELDS: tuple[str, ...] = (
    "schema",
    *(
        name
        for name in RequestRecord.model_fields
        if name not in Measurement.model_fields and name != "schema_"
    ),
    *Measurement.model_fields,
)


class SessionCounts(BaseModel):
    """sessions.json: what the replay achieved against what was asked, the basis of every comparison.

    `error` counts sessions that ended on a failed request or on an exception of the replay client
    (`exceptions` counts the latter, each logged with its traceback). `stopped_by` is `pool`,
    `duration`, `interrupt`, `stall` (the stall watchdog) or `warmup` (every warm-up request failed);
    `stop_reason` says why in words for the last two, `first_error` is the first failure seen.
    Mutable: the runner counts into it while the replay runs.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True, validate_assignment=False)

    schema_: int = Field(default=SCHEMA, alias="schema", description="sessions.json schema version")
    requested_concurrency: int = Field(ge=0, description="concurrency the cell asked for")
    num_rounds: int = Field(
        default=0, ge=0, description="rounds per virtual user (0: not recorded, older files)"
    )
    virtual_users_available: int = Field(ge=0, description="virtual users the dataset yields (ceiling)")
    dropped_by_isl: int = Field(default=0, ge=0, description="virtual users dropped by the isl depth filter")
    achieved_sessions: int = Field(default=0, ge=0, description="sessions (virtual users) actually started")
    complete: int = Field(default=0, ge=0, description="sessions whose every round succeeded")
    incomplete: int = Field(default=0, ge=0, description="sessions cut short (duration, interrupt)")
    error: int = Field(default=0, ge=0, description="sessions that ended on a failed request")
    failed_requests: int = Field(default=0, ge=0, description="requests with status error or timeout")
    requests: int = Field(default=0, ge=0, description="requests sent, retries included")
    exceptions: int = Field(default=0, ge=0, description="sessions ended by an exception of the client")
    interrupted: bool = Field(default=False, description="the replay was interrupted (SIGINT/SIGTERM)")
    stopped_by: str = Field(default="pool", description="pool, duration, interrupt, stall or warmup")
    stop_reason: str | None = Field(default=None, description="why, in words, for stall and warmup")
    first_error: str | None = Field(default=None, description="the first failure seen")
    warmup_errors: list[str] = Field(
        default_factory=list,
        description="the first failure of each warm-up round in which every warm-up failed (the round "
        "was repeated; `warmup` in stopped_by when the last one failed too)",
    )
    duration_s: float = Field(default=0.0, ge=0, description="wall time of the replay")

    @property
    def ok_requests(self) -> int:
        return self.requests - self.failed_requests

    def to_json(self) -> str:
        """The counts as indented JSON (no trailing newline)."""
        return self.model_dump_json(by_alias=True, indent=2)
