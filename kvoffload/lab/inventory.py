"""Render the Ansible inventory of a running virtual lab (`inventories/local/hosts.yml`).

Host 1 is client + lb, every other host runs one simulated vLLM replica, and the second host also runs
the lmcache-server with the lab's loop device as its NVMe device. Host variables use the roles' own
names (`vllm_replicas`, `nvme_storage_devices`). The ssh options that switch host-key checking off
are inventory vars of these lab hosts only, never global ssh or Ansible settings. This module renders
text; it does not validate it (kvoffload.config does, like any inventory).
"""

from __future__ import annotations

from typing import Any

import yaml

from kvoffload.lab.state import LabHost, LabState

NVME_MOUNT = "/mnt/kvoffload-nvme"
# The node_exporter role's default device filter without `loop`.
DISKSTATS_EXCLUDE_KEEP_LOOP = r"^(ram|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$"
HEADER = (
    "# Written by `kvoffload-lab lab up` for the virtual lab on this machine; rewritten on every\n"
    "# `lab up`, removed by `lab down`. Do not edit: pass a campaign with --campaign instead.\n"
)


def assign_groups(names: list[str]) -> dict[str, list[str]]:
    """Groups of each host: first = client + lb; the others vllm; the second also lmcache."""
    groups: dict[str, list[str]] = {}
    for i, name in enumerate(names):
        if i == 0:
            groups[name] = ["client", "lb"]
        elif i == 1:
            groups[name] = ["vllm", "lmcache"]
        else:
            groups[name] = ["vllm"]
    if len(names) == 1:
        groups[names[0]] = ["client", "lb", "vllm", "lmcache"]
    return groups


def _host_vars(state: LabState, host: LabHost) -> dict[str, Any]:
    host_vars: dict[str, Any] = {"ansible_host": host.ip}
    if "vllm" in host.groups:
        # One simulated replica per host; the simulator ignores the GPU id it is given.
        host_vars["vllm_replicas"] = [{"index": 0, "gpus": "0"}]
    if host.name == state.lmcache_host and state.loop_device:
        host_vars["nvme_storage_devices"] = [{"device": state.loop_device, "mount": NVME_MOUNT}]
        # node-exporter skips loop devices by default; here one stands in for the NVMe drive.
        host_vars["node_exporter_diskstats_device_exclude"] = DISKSTATS_EXCLUDE_KEEP_LOOP
    return host_vars


def render(state: LabState) -> str:
    children: dict[str, Any] = {}
    for group in ("vllm", "lmcache", "lb", "client"):
        members = {host.name: None for host in state.hosts if group in host.groups}
        if members:
            children[group] = {"hosts": members}
    doc = {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_ssh_private_key_file": state.ssh_key,
                "ansible_ssh_common_args": (
                    "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes"
                ),
            },
            "hosts": {host.name: _host_vars(state, host) for host in state.hosts},
            "children": children,
        }
    }
    return HEADER + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
