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

from kvoffload.config import Cell, LabConfig
from kvoffload.contracts.layout import CellPaths
from kvoffload.errors import UserError
from kvoffload.orchestrate.cell.faults import unit_faults
from kvoffload.orchestrate.cell.plan import CellPlan
from kvoffload.orchestrate.cell.record import (
    CellRecord,
    CellStatus,
    host_software,
    tool_versions,
    unit_states,
)
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from kvoffload.orchestrate.results import CampaignResults

PLAIN_METHOD = "plain"


@dataclass(frozen=True)
class Finished:
    """What `finish_cell` wrote: the cell's folder, its status and, when not done, why."""

    cell_dir: Path
    status: str
    error: str | None
    valid: bool


def _node(lab: LabConfig, paths: CellPaths) -> str:
    """The node the playbooks ran the cell on: the one node whose unit states were collected (a plain
    run of several nodes is limited to one, roles/preflight/tasks/cell_hosts.yml)."""
    if not lab.multi_node:
        return lab.nodes[0].name
    names = {n.name for n in lab.nodes}
    found = sorted({key.split("--", 1)[0] for key in unit_states(paths)} & names)
    if len(found) != 1:
        raise UserError(
            f"{paths.root}: cannot tell which node ran the cell (unit states collected from nodes "
            f"{', '.join(found) or 'none'}); the run's collect, limited to the cell's node, writes units/"
        )
    return found[0]


def _mtime(path: Path) -> float | None:
    return path.stat().st_mtime if path.is_file() else None


def finish_cell(lab: LabConfig, cell: Cell, results: Path) -> Finished:
    """Write cell.json (and DONE when the results are whole) for `cell`'s plain run under `results`."""
    campaign = CampaignResults(results.resolve() / lab.campaign.name)
    files = campaign.cell_paths(cell)
    cell_dir = files.root
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
    record = _record(lab, cell, files, _node(lab, files))
    if not record.error:
        campaign.mark_done(cell)
    return Finished(cell_dir=cell_dir, status=str(record.status), error=record.error, valid=not record.faults)


def _record(lab: LabConfig, cell: Cell, files: CellPaths, node: str) -> CellRecord:
    """The plain run's cell.json, written: what `run` records, less what only `run` measures."""
    # The wheels change only which files the hosts installed from, not what the record says.
    plan = CellPlan.build(lab, cell, files, Wheels(package=Path("kvoffload.whl"), wheelhouse=None), node)
    missing = [p.name for p in (files.requests, files.sessions) if not p.is_file()]
    error = f"failed: collected results lack {', '.join(missing)}" if missing else None
    record = CellRecord(
        cell_id=cell.id,
        campaign=lab.campaign.name,
        status=CellStatus.FAILED if error else CellStatus.DONE,
        config={**cell.config, "id": cell.id},
        node=node,
        client=lab.client_of(lab.node(node)).name,
        profiles=plan.profiles,
        targets=plan.target_hosts,
        l2_device=plan.l2_device,
        replay_argv=list(plan.replay_argv),
        cold_start={
            "method": PLAIN_METHOD,
            "reason": "deployed by plain Ansible (playbooks/site.yml); no cold check ran",
            "cold": None,
        },
        versions=tool_versions(),
        units=unit_states(files),
        software=host_software(files.software_dir),
        started_at=_mtime(files.snapshot_before),
        finished_at=_mtime(files.sessions) or time.time(),
        error=error,
    )
    units = unit_faults(record.units, list(plan.units), {}) if record.units else []
    record.judge([], units, files.requests)
    record.write(files)
    return record
