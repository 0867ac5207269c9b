"""cell.json and sessions.json: the fields ingest reads, validated, with errors naming file and key.

The orchestrator writes cell.json (DESIGN.md section 5); the replay runner writes sessions.json. Keys
not listed here are ignored, so both writers may add fields without breaking ingest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvoffload.errors import UserError


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class DatasetRef(_Lenient):
    code: str = Field(description="dataset loader code, e.g. sammshen or tau2-bench-v1")
    path: str = Field(description="dataset path on the client host")


class CellConfig(BaseModel):
    # Other keys of the resolved cell (sim_profile, lmcache_l1_size_gb, ...) are kept for the analysis.
    model_config = ConfigDict(extra="allow", frozen=True)

    tier: Literal["gpu", "cpu", "nvme"] = Field(description="KV tier of the cell")
    model: str = Field(description="model id or path (also the tokenizer)")
    concurrency: int = Field(ge=1, description="closed-loop slots of the replay")
    num_rounds: int = Field(ge=1, description="rounds per virtual user")
    isl: int = Field(ge=1, description="max context tokens of a replayed request")
    osl: int | Literal["recorded"] = Field(description="max_tokens, or the recorded output length")
    repeat: int = Field(default=0, ge=0, description="repeat index of an otherwise identical cell")
    dataset: DatasetRef | None = Field(default=None, description="dataset code and path")


class TargetRef(_Lenient):
    kind: Literal["vllm", "lmcache", "node", "caddy", "gpu"] = Field(description="what the target is")
    host: str | None = Field(default=None, description="inventory host the target runs on")
    url: str | None = Field(default=None, description="scrape URL (absent for GPU tools)")


class CellMeta(_Lenient):
    schema_: int = Field(alias="schema", default=1, description="cell.json schema version")
    cell_id: str = Field(description="short hash of the resolved configuration; the folder name")
    campaign: str = Field(default="", description="campaign name")
    status: Literal["done", "interrupted", "failed"] = Field(description="how the cell ended")
    config: CellConfig
    hosts: dict[str, dict[str, Any]] = Field(default_factory=dict, description="host name -> hardware")
    targets: dict[str, TargetRef] = Field(default_factory=dict, description="metric target name -> ref")
    l2_device: str | None = Field(default=None, description="kernel name of the disk behind the L2 path")
    timings: dict[str, float] = Field(default_factory=dict, description="phase -> seconds")
    versions: dict[str, Any] = Field(default_factory=dict, description="controller software versions")
    software: dict[str, Any] = Field(
        default_factory=dict,
        description="host name -> software that ran there (collect role: groups, packages, python, gpu)",
    )
    valid: bool = Field(default=True, description="false when a replica or lmcache-server faulted")
    invalid_reasons: list[str] = Field(
        default_factory=list, description="each fault of the cell: what, when and why"
    )
    profiles: dict[str, Any] = Field(
        default_factory=dict, description="engine, lmcache and caddy profile names (caddy: its lb_policy)"
    )
    units: dict[str, Any] = Field(
        default_factory=dict, description="`<host>--<unit>` -> systemctl show fields (NRestarts, ActiveState)"
    )
    node: str | None = Field(default=None, description="the node (vllm host) the cell ran on")
    cold_start: dict[str, Any] = Field(
        default_factory=dict, description="how the cell started cold: method restart or reset, and the proof"
    )


class SessionCounts(_Lenient):
    schema_: int = Field(alias="schema", default=1, description="sessions.json schema version")
    requested_concurrency: int = Field(ge=0, description="concurrency the cell asked for")
    virtual_users_available: int = Field(ge=0, description="virtual users the dataset yields (ceiling)")
    achieved_sessions: int = Field(ge=0, description="sessions (virtual users) actually started")
    complete: int = Field(ge=0, description="sessions whose every round succeeded")
    incomplete: int = Field(ge=0, description="sessions cut short (duration, interrupt)")
    error: int = Field(ge=0, description="sessions that ended on a failed request")
    failed_requests: int = Field(ge=0, description="requests with status error or timeout")


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        msg = f"{path}: not valid JSON ({exc}); fix or delete the file and re-run the cell"
        raise UserError(msg) from exc


def _explain(path: Path, exc: ValidationError) -> str:
    first = exc.errors()[0]
    key = ".".join(str(p) for p in first["loc"])
    return f"{path}: key {key!r}: {first['msg']} ({len(exc.errors())} problem(s))"


def load_cell_meta(path: Path) -> CellMeta:
    """Read and validate cell.json; UserError names the file and the first bad key."""
    try:
        return CellMeta.model_validate(_load_json(path))
    except ValidationError as exc:
        raise UserError(_explain(path, exc)) from exc


def load_session_counts(path: Path) -> SessionCounts:
    """Read and validate sessions.json; UserError names the file and the first bad key."""
    try:
        return SessionCounts.model_validate(_load_json(path))
    except ValidationError as exc:
        raise UserError(_explain(path, exc)) from exc
