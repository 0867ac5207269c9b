"""The persisted state of a running virtual lab: what `lab up` created, so `lab down` can undo it.

Written after every resource is created (bridge, loop device, each host), so a half-up lab is torn
down just as well. Plain data and JSON IO only; creating or destroying things is elsewhere.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvoffload.atomic import write_text_atomic

STATE_FILE = "state.json"


@dataclass
class LabHost:
    """One nspawn host: its name (machine name and hostname), address, groups and nspawn PID."""

    name: str
    ip: str
    groups: list[str]
    pid: int | None = None
    # the loop device standing in for the node's NVMe drive (nodes only), and its backing file
    loop_device: str | None = None
    loop_backing: str | None = None


@dataclass
class LabState:
    """Everything a lab consists of. Fields left None were not created (yet)."""

    state_dir: str
    bridge: str
    subnet: str
    gateway: str
    rootfs: str
    ssh_key: str
    inventory: str
    bridge_created: bool = False
    hosts: list[LabHost] = field(default_factory=list)

    @property
    def loop_devices(self) -> list[str]:
        return [h.loop_device for h in self.hosts if h.loop_device]

    def save(self) -> None:
        path = Path(self.state_dir) / STATE_FILE
        write_text_atomic(path, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, state_dir: Path) -> LabState | None:
        path = state_dir / STATE_FILE
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        hosts = [LabHost(**host) for host in raw.pop("hosts", [])]
        return cls(**raw, hosts=hosts)
