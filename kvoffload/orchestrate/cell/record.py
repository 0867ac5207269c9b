"""One cell's record as it runs, and the cell's files on the controller: cell.json, the collected unit
states and software, the fetched folder.

`CellRecord` is cell.json in typed form (the model that checks it, `kvoffload.contracts.cell.CellMeta`,
stays the contract; `to_json` gives the same keys and values a dict-built record gave, so no schema
moved). Written by `kvoffload.orchestrate.cell.run` (a cell of `run`) and `kvoffload.orchestrate.cell.plain`
(a cell run by plain Ansible); read back only by ingest. Every path comes from the cell's one
`CellPaths`.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

import kvoffload
from kvoffload.atomic import write_text_atomic
from kvoffload.contracts.cell import CELL_SCHEMA, cell_json_text
from kvoffload.contracts.layout import CellPaths
from kvoffload.orchestrate.cell.faults import Fault, fault_effects
from kvoffload.playbook import PlaybookResult, ansible_dir

log = logging.getLogger(__name__)


class CellStatus(StrEnum):
    """cell.json `status`, as written there and to status.json."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class _Absent(Enum):
    ABSENT = "absent"


ABSENT = _Absent.ABSENT  # a key cell.json does not have (as opposed to one whose value is null)


@dataclass
class CellRecord:
    """cell.json while the cell runs and once it ended. Fields left None (or ABSENT) are keys the file
    does not have yet (or, for a cell run by plain Ansible, at all): `to_json` leaves them out."""

    cell_id: str
    campaign: str
    config: dict[str, Any]
    node: str
    profiles: dict[str, Any]
    targets: dict[str, dict[str, str | None]]
    l2_device: str | None
    replay_argv: list[str]
    versions: dict[str, Any]
    started_at: float | None
    client: str | None = None  # the client host that replayed the cell
    status: CellStatus = CellStatus.RUNNING
    engine_key: str | None = None
    hosts: dict[str, dict[str, Any]] | None = None
    timings: dict[str, float] | None = None
    software: dict[str, Any] = field(default_factory=dict)
    cold_start: dict[str, Any] | None = None
    l2_trim: dict[str, Any] | _Absent | None = ABSENT  # a cell with an L2 only
    error: str | None = None
    teardown_error: str | None = None
    engines_kept: bool = False
    units: dict[str, Any] | None = None
    faults: list[Fault] | None = None  # None: not judged yet
    fault_effects: dict[str, Any] | None = None
    finished_at: float | None = None

    def judge(self, watched: list[Fault], unit_faults: list[Fault], requests: Path) -> None:
        """`faults` (each with its reason and time), `valid`, and what the engines did after a fault."""
        self.faults = [*watched, *unit_faults]
        if self.faults:
            self.fault_effects = fault_effects(requests, self.faults)
            for f in self.faults:
                log.warning("cell %s: %s", self.cell_id, f.reason())

    def to_json(self) -> dict[str, Any]:
        """cell.json's object: the keys a dict-built record had at this point of the cell."""
        out: dict[str, Any] = {
            "schema": CELL_SCHEMA,
            "cell_id": self.cell_id,
            "campaign": self.campaign,
            "status": str(self.status),
            "config": self.config,
            "node": self.node,
            "client": self.client,
            "profiles": self.profiles,
            "targets": self.targets,
            "l2_device": self.l2_device,
            "replay_argv": self.replay_argv,
            "versions": self.versions,
            "software": self.software,
            "started_at": self.started_at,
        }
        optional = {
            "engine_key": self.engine_key,
            "hosts": self.hosts,
            "timings": self.timings,
            "cold_start": self.cold_start,
            "error": self.error,
            "teardown_error": self.teardown_error,
            "units": self.units,
            "finished_at": self.finished_at,
        }
        out |= {k: v for k, v in optional.items() if v is not None}
        if self.l2_trim is not ABSENT:
            out["l2_trim"] = self.l2_trim
        if self.engines_kept:
            out["engines_kept"] = True
        if self.faults is not None:
            out["faults"] = [f.to_json() for f in self.faults]
            out["valid"] = not self.faults
            if self.faults:
                out["invalid_reasons"] = [f.reason() for f in self.faults]
                out["fault_effects"] = self.fault_effects
        return out

    def write(self, paths: CellPaths) -> None:
        """cell.json, checked against its model (kvoffload/contracts/cell.py) and written atomically."""
        write_text_atomic(paths.cell_json, cell_json_text(self.to_json()))


def _git_sha() -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(ansible_dir()), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def tool_versions() -> dict[str, str | None]:
    """The controller's tools, for cell.json and campaign.json `versions`."""
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "kvoffload-lab": kvoffload.__version__,
        "git_sha": _git_sha(),
        "python": platform.python_version(),
        "ansible-core": version("ansible-core"),
        "ansible-runner": version("ansible-runner"),
    }


def unit_states(paths: CellPaths) -> dict[str, Any]:
    """`<host>--<unit>` -> the unit's collected state, from the collect role's `units/<host>.json`
    (`{host, units: {unit: {property: value}}}`)."""
    units: dict[str, Any] = {}
    for path in sorted(paths.units_dir.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            for unit, state in data["units"].items():
                units[f"{data['host']}--{unit}"] = {**state, "host": data["host"]}
        except (OSError, json.JSONDecodeError, KeyError, AttributeError, TypeError):
            units[path.stem] = {"error": f"unreadable {path.name}"}
    return units


def host_software(folder: Path) -> dict[str, Any]:
    """host -> the collect role's `software/<host>.json` (groups, packages, python, gpu), for cell.json.

    Empty when the folder is missing (collect did not run); an unreadable file maps to {"error": ...}.
    """
    software: dict[str, Any] = {}
    if not folder.is_dir():
        return software
    for path in sorted(folder.glob("*.json")):
        try:
            software[path.stem] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            software[path.stem] = {"error": f"unreadable {path.name}"}
    return software


def copy_software(source: CellPaths, paths: CellPaths) -> None:
    """An earlier cell's collected software into this cell's folder (nothing when it has none)."""
    if source.software_dir.is_dir():
        shutil.copytree(source.software_dir, paths.software_dir, dirs_exist_ok=True)


def unpack_fetched(paths: CellPaths) -> None:
    """Unpack the cell folder that replay.yml fetched (`replay_unpack_on_controller: false`) into the
    cell's folder, as the role's own tasks would, and remove the tarball; nothing when it fetched none
    (a replay that failed before its fetch)."""
    archive = paths.fetched_archive
    if not archive.is_file():
        return
    # the tarball of our own client: relative members under "."; GNU tar as the role uses it
    argv = ["tar", "--extract", "--gzip", "--no-same-owner", "--no-overwrite-dir", "--file", str(archive)]
    proc = subprocess.run(
        [*argv, "--directory", str(paths.root)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"unpacking {archive} failed: {proc.stderr.strip()[-400:]}")
    archive.unlink()


def write_collected(paths: CellPaths, result: PlaybookResult) -> None:
    """`units/<host>.json` and `software/<host>.json` of every host the run's collect read, as the
    collect role writes them when left to (`collect_units_to_controller`,
    `collect_software_to_controller`)."""
    for host, units in result.unit_states.items():
        paths.units_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"host": host, "units": units}, indent=4, sort_keys=True)
        write_text_atomic(paths.units_dir / f"{host}.json", text + "\n")
    for host, software in result.software.items():
        paths.software_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(software, indent=4, sort_keys=True)
        write_text_atomic(paths.software_dir / f"{host}.json", text + "\n")
