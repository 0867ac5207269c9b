"""cell.json: the model of one cell's record, written by the orchestrator and read by ingest.

The orchestrator builds the record as the cell runs and writes it through `cell_json_text`, which
validates it against `CellMeta` and refuses a key the model does not know, so the writer cannot drift
from the reader. Readers ignore unknown keys (a newer writer's), and every field added after schema 1
has a default that says what an older file meant. Bump `CELL_SCHEMA` on a change of meaning. No IO.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvoffload.tiers import Tier

CELL_SCHEMA = 1


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class DatasetRef(_Lenient):
    code: str = Field(description="dataset loader code, e.g. sammshen or tau2-bench-v1")
    path: str = Field(description="dataset path on the client host")


class CellConfig(BaseModel):
    """The resolved cell (config/cells.py) with its id; the keys ingest types are checked."""

    # Other keys of the resolved cell (sim_profile, lmcache_l1_size_gb, ...) are kept for the analysis.
    model_config = ConfigDict(extra="allow", frozen=True)

    tier: Tier = Field(description="KV tier of the cell")
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
    gpus: str | None = Field(
        default=None,
        description="a vllm target's GPUs (vllm_replicas `gpus`, e.g. 0,1: one tensor-parallel rank each); "
        "null for other targets and in files older than this field",
    )
    compilation_config: dict[str, Any] | None = Field(
        default=None,
        description="a vllm target's compilation config as vLLM parses it from the replica's arguments (the "
        "campaign's --compilation-config merged with the lab's TP > 1 CUDA switch; {}: vLLM's defaults); "
        "null for other targets and in files older than this field",
    )


class CellMeta(_Lenient):
    """cell.json. Fields added after schema 1 carry the default an older file means."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    schema_: int = Field(alias="schema", default=CELL_SCHEMA, description="cell.json schema version")
    cell_id: str = Field(description="short hash of the resolved configuration; the folder name")
    campaign: str = Field(default="", description="campaign name")
    status: Literal["running", "done", "interrupted", "failed"] = Field(
        description="how the cell ended (running: written while it runs, or the run was killed)"
    )
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
    client: str | None = Field(
        default=None, description="the client host that replayed the cell (null: older files, one client)"
    )
    cold_start: dict[str, Any] = Field(
        default_factory=dict, description="how the cell started cold: method restart or reset, and the proof"
    )
    engine_key: str | None = Field(default=None, description="hash of the engine configuration deployed")
    replay_argv: list[str] = Field(default_factory=list, description="the replay command the role ran")
    started_at: float | None = Field(default=None, description="Unix time the cell started")
    finished_at: float | None = Field(default=None, description="Unix time the cell ended")
    error: str | None = Field(default=None, description="why the cell failed")
    teardown_error: str | None = Field(default=None, description="why the teardown after the cell failed")
    engines_kept: bool = Field(default=False, description="engines left running for the next cell")
    faults: list[dict[str, Any]] = Field(default_factory=list, description="faults seen, each with its time")
    fault_effects: dict[str, Any] | None = Field(
        default=None, description="what the requests did after the first fault (orchestrate/cell/faults.py)"
    )
    l2_trim: dict[str, Any] | None = Field(
        default=None,
        description="the fstrim of the L2 file system after the last wipe of L2 before this cell: path, "
        "outcome (trimmed, unsupported or failed) and fstrim's message; null: no wipe trimmed in this "
        "run, a tier without L2, or a cell.json older than this field",
    )


def cell_json_text(record: Mapping[str, Any]) -> str:
    """`record` as cell.json text, after checking it against `CellMeta`.

    Raises ValueError for a key the model lacks, pydantic's ValidationError for a bad value: both
    are bugs of the writer, not of the user's input.
    """
    known = {info.alias or name for name, info in CellMeta.model_fields.items()}
    unknown = sorted(set(record) - known)
    if unknown:
        raise ValueError(f"cell.json keys {unknown} are not in contracts.cell.CellMeta: add them there")
    CellMeta.model_validate(record)
    return json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"
