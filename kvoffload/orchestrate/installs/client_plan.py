"""What `plan` says about the client pool: which client host replays which nodes, the streams each
must drive at once, the cores that takes, and what to do when a host is short.

Part of the orchestrator's planning side (kvoffload/cli/plan.py prints it). The assignment and the
per-core budget are kvoffload/config/clients.py's; this module adds what only earlier results know:
a client host's vCPUs, from the host facts every cell.json records (`hosts`), so a campaign planned
again (a resume, a second run) is checked against the hardware it found. Before any run the cores
are unknown and `plan` gives the cores each client host needs instead. Reads cell.json files; writes
nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvoffload.config import Cell, LabConfig
from kvoffload.config.clients import STREAMS_PER_CORE, ClientLoad, client_loads, clients_needed
from kvoffload.contracts.layout import CampaignPaths


def known_vcpus(results: CampaignPaths) -> dict[str, int]:
    """host name -> vCPUs, from the cell.json files under `results` (the latest cell's word wins)."""
    found: dict[str, tuple[str, int]] = {}
    if not results.cells_dir.is_dir():
        return {}
    for path in sorted(results.cells_dir.glob("*/cell.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # `report` names unreadable cells; planning goes on without them
        hosts = data.get("hosts") if isinstance(data, dict) else None
        stamp = str(data.get("finished_at") or "") if isinstance(data, dict) else ""
        for name, facts in (hosts or {}).items():
            vcpus = facts.get("vcpus") if isinstance(facts, dict) else None
            if not isinstance(vcpus, int) or isinstance(vcpus, bool) or vcpus <= 0:
                continue
            if name not in found or stamp >= found[name][0]:
                found[name] = (stamp, vcpus)
    return {name: vcpus for name, (_stamp, vcpus) in found.items()}


@dataclass(frozen=True)
class ClientPlan:
    """The pool's loads and the warnings `plan` prints about them."""

    loads: list[ClientLoad]
    warnings: list[str]

    def lines(self) -> list[str]:
        """One line per client host: its nodes, peak streams and cores (known or needed)."""
        out = []
        for load in self.loads:
            nodes = ", ".join(load.nodes) or "none in this run"
            cores = f"{load.cores} vCPUs" if load.cores is not None else "vCPUs not known yet"
            out.append(
                f"client {load.client}: replays node(s) {nodes}; up to {load.peak_streams} streams at "
                f"once, needs {load.cores_needed} cores for sub-millisecond TTFT error "
                f"({STREAMS_PER_CORE} streams a core, one core spare); {cores}"
            )
        return out


def client_plan(
    lab: LabConfig, where: Mapping[str, str], cells: Sequence[Cell], results: CampaignPaths
) -> ClientPlan:
    """The plan of the client pool for the cells `where` places (cell id -> node)."""
    by_id = {c.id: c for c in cells}
    concurrency: dict[str, int] = {}
    for cell_id, node in where.items():
        cell = by_id.get(cell_id)
        if cell is not None:
            concurrency[node] = max(concurrency.get(node, 0), cell.concurrency)
    vcpus = known_vcpus(results)
    names = [c.name for c in lab.clients]
    loads = client_loads(lab.client_assignment, names, concurrency, vcpus)
    warnings = []
    for load in loads:
        if load.short:
            assert load.cores is not None
            per_core = load.peak_streams / max(1, load.cores - 1)
            warnings.append(
                f"client host {load.client}: {load.peak_streams} streams at once on {load.cores} vCPUs "
                f"({per_core:.0f} a core with one spare) is more than the {STREAMS_PER_CORE} a core the "
                "replay client drives with sub-millisecond TTFT error: the run would measure its own "
                "client; " + _advice(loads, load.cores)
            )
    return ClientPlan(loads, warnings)


def _advice(loads: Sequence[ClientLoad], cores: int) -> str:
    needed = clients_needed(loads, cores)
    if needed > len(loads):
        return (
            f"the run needs about {needed} client hosts of {cores} vCPUs: add hosts to group client "
            "(the nodes are shared out evenly, or set kvoffload_client per node)"
        )
    return "spread the nodes differently (kvoffload_client per node) or lower the concurrency"
