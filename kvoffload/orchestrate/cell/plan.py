"""A cell's plan on one node: everything about the cell that its lifecycle reads and that does not change
while it runs, computed once.

Joins kvoffload/orchestrate/cell/deployment.py (extravars, engine identity, targets, units, L2 device) with
the cell's folder (`CellPaths`, the one paths object of the cell). Built once per (cell, node) by the
campaign (`CampaignRunner.plan_of`) and read by kvoffload/orchestrate/cell/run.py, by the doctor's
smoke check and by a plain run's `finish_cell`. Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kvoffload.config import Cell, LabConfig
from kvoffload.contracts.layout import CellPaths
from kvoffload.orchestrate.cell.deployment import (
    cell_extravars,
    cell_units,
    deployment,
    engine_key,
    l2_device,
    replay_command,
    target_hosts,
)
from kvoffload.orchestrate.cell.extravar_keys import check_declared
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from kvoffload.profiles.resolve import caddy_profile


@dataclass(frozen=True)
class CellPlan:
    """One cell on one node, as planned (its extravars read-only)."""

    cell: Cell
    node: str
    paths: CellPaths
    extravars: Mapping[str, Any]
    engine_key: str
    targets: tuple[Mapping[str, str], ...]  # the sampler's metric targets (`{name, url}`)
    target_hosts: dict[str, dict[str, str | None]]  # cell.json `targets`
    units: tuple[str, ...]  # `<host>--<unit>` of every engine unit (the keys of the collected units/)
    l2_device: str | None
    caddy_policy: str | None  # Caddy's lb_policy with 2+ replicas, else None
    replay_argv: tuple[str, ...]

    @classmethod
    def build(cls, lab: LabConfig, cell: Cell, paths: CellPaths, wheels: Wheels, node: str) -> CellPlan:
        extravars = cell_extravars(lab, cell, paths.root, wheels, node)
        check_declared(extravars)
        targets = extravars["replay_metrics_targets"]
        replicas = len(deployment(lab, cell, node).replicas)
        return cls(
            cell=cell,
            node=node,
            paths=paths,
            extravars=MappingProxyType(extravars),
            engine_key=engine_key(extravars),
            targets=tuple(MappingProxyType(t) for t in targets),
            target_hosts=target_hosts(lab, cell, targets, node),
            units=tuple(cell_units(lab, cell, node)),
            l2_device=l2_device(lab, cell, node),
            caddy_policy=caddy_profile(cell.tier).lb_policy if replicas >= 2 else None,
            replay_argv=tuple(replay_command(extravars)),
        )

    @property
    def has_l2(self) -> bool:
        """The cell's lmcache-server has an L2 (the nvme tier): its playbooks may empty it."""
        return bool(self.extravars.get("lmcache_server_l2_path"))

    @property
    def profiles(self) -> dict[str, Any]:
        """cell.json `profiles`: engine and lmcache profile names, Caddy's lb_policy, and the engine set
        the node installed (kvoffload/engines: name, build, requirements, source; absent for the
        simulator)."""
        out: dict[str, Any] = {
            "engine": self.cell.engine_profile,
            "lmcache": self.cell.lmcache_profile,
            "caddy": self.caddy_policy,
        }
        if self.extravars.get("kvoffload_engine_set"):
            out["engine_set"] = self.extravars["kvoffload_engine_set"]
        return out

    def extravars_with(self, more: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The cell's extravars plus a run's own switches (checked: each must be declared)."""
        out = {**self.extravars, **(more or {})}
        check_declared(out)
        return out
