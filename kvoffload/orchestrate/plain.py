"""A cell run by plain Ansible (`plan --emit-extravars`, then `ansible-playbook playbooks/site.yml`),
made a cell the other commands read: cell.json and DONE, as `run` writes them.

The playbooks leave the cell's folder as `run`'s replay and collect do (requests.jsonl, sessions.json,
metrics/, units/, software/, logs/) but no cell.json: `run` writes it from what only the orchestrator
knows. `finish_cell` builds that record from the lab (the same functions `run` uses) and from the
collected files: faults from the unit states, software from the collect role's files. What a plain
run does not measure is said, not guessed: no cold check (`cold_start.method` is `plain`), no host
facts, no phase timings. DONE is written only when the replay's results are whole, as `run` does.
Never overwrites: a folder with cell.json was written by `run` (which judges its own cells) or is
finished already; a DONE cell is never touched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvoffload.config import Cell, LabConfig
from kvoffload.contracts.cell import CELL_SCHEMA
from kvoffload.contracts.layout import CellPaths
from kvoffload.errors import UserError
from kvoffload.orchestrate.campaign import (
    CampaignRunner,
    _unit_states,
    _write_cell,
    host_software,
    tool_versions,
)
from kvoffload.orchestrate.deployment import (
    cell_extravars,
    cell_units,
    deployment,
    l2_device,
    replay_command,
    target_hosts,
)
from kvoffload.orchestrate.results import CampaignResults
from kvoffload.orchestrate.wheelhouse import Wheels
from kvoffload.profiles.resolve import caddy_profile

PLAIN_METHOD = "plain"


@dataclass(frozen=True)
class Finished:
    """What `finish_cell` wrote: the cell's folder, its status and, when not done, why."""

    cell_dir: Path
    status: str
    error: str | None
    valid: bool


def _node(lab: LabConfig, cell_dir: Path) -> str:
    """The node the playbooks ran the cell on: the one node whose unit states were collected (a plain
    run of several nodes is limited to one, roles/preflight/tasks/cell_hosts.yml)."""
    if not lab.multi_node:
        return lab.nodes[0].name
    names = {n.name for n in lab.nodes}
    found = sorted({key.split("--", 1)[0] for key in _unit_states(cell_dir)} & names)
    if len(found) != 1:
        raise UserError(
            f"{cell_dir}: cannot tell which node ran the cell (unit states collected from nodes "
            f"{', '.join(found) or 'none'}); the run's collect, limited to the cell's node, writes units/"
        )
    return found[0]


def _mtime(path: Path) -> float | None:
    return path.stat().st_mtime if path.is_file() else None


def finish_cell(lab: LabConfig, cell: Cell, results: Path) -> Finished:
    """Write cell.json (and DONE when the results are whole) for `cell`'s plain run under `results`."""
    campaign = CampaignResults(results.resolve() / lab.campaign.name)
    cell_dir = campaign.cell_dir(cell)
    files = CellPaths(cell_dir)
    if not cell_dir.is_dir():
        raise UserError(
            f"{cell_dir}: no results of cell {cell.id} (run its playbooks first: `plan --emit-extravars "
            f"{cell.id}` then `ansible-playbook playbooks/site.yml -e @cell.yml`)"
        )
    if files.done.is_file():
        raise UserError(f"{cell_dir}: cell {cell.id} is DONE; it is never overwritten")
    if files.cell_json.is_file():
        raise UserError(
            f"{files.cell_json}: exists: `run` wrote this folder (it judges its own cells: run it again "
            "to finish it) or the cell was finished already; a plain run of the playbooks moves it under "
            "attempts/ and starts afresh"
        )
    node = _node(lab, cell_dir)
    # The wheels change only which files the hosts installed from, not what the record says.
    placeholder = Wheels(package=Path("kvoffload.whl"), wheelhouse=None)
    extravars = cell_extravars(lab, cell, cell_dir, placeholder, node)
    missing = [p.name for p in (files.requests, files.sessions) if not p.is_file()]
    error = f"failed: collected results lack {', '.join(missing)}" if missing else None
    record: dict[str, Any] = {
        "schema": CELL_SCHEMA,
        "cell_id": cell.id,
        "campaign": lab.campaign.name,
        "status": "failed" if error else "done",
        "config": {**cell.config, "id": cell.id},
        "node": node,
        "profiles": {
            "engine": cell.engine_profile,
            "lmcache": cell.lmcache_profile,
            "caddy": caddy_profile(cell.tier).lb_policy
            if len(deployment(lab, cell, node).replicas) >= 2
            else None,
        },
        "targets": target_hosts(lab, cell, extravars["replay_metrics_targets"], node),
        "l2_device": l2_device(lab, cell, node),
        "replay_argv": replay_command(extravars),
        "cold_start": {
            "method": PLAIN_METHOD,
            "reason": "deployed by plain Ansible (playbooks/site.yml); no cold check ran",
            "cold": None,
        },
        "versions": tool_versions(),
        "units": _unit_states(cell_dir),
        "software": host_software(files.software_dir),
        "started_at": _mtime(files.snapshot_before),
        "finished_at": _mtime(files.sessions) or time.time(),
    }
    if error:
        record["error"] = error
    CampaignRunner._record_faults(record, [], cell_units(lab, cell, node), cell_dir)
    _write_cell(cell_dir, record)
    if not error:
        campaign.mark_done(cell)
    return Finished(cell_dir=cell_dir, status=record["status"], error=error, valid=record["valid"])
