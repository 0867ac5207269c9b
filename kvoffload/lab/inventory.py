"""Render the Ansible inventory of a running virtual lab (`inventories/local/hosts.yml`).

Host 1 is the client (the first `--clients` hosts are client hosts, one by default); the next hosts are
the nodes (one by default; docs/architecture.md section 3: a run is node-local, because LMCache's MP
server shares KV with the replicas through CUDA IPC inside one host):
each runs two vLLM replicas, its own lmcache-server with its own loop device as its NVMe device, and
its own Caddy. Further hosts are spare, in no kvoffload group. The hosts have no GPU, so real vLLM runs
its CPU build there (`kvoffload_engine_build: cpu`); the simulator ignores the setting. Host variables
use the roles' own names (`vllm_replicas`, `nvme_storage_devices`). The ssh options that switch
host-key checking off are inventory vars of these lab hosts only, never global ssh or Ansible
settings. This module renders text; it does not validate it (kvoffload.config does, like any
inventory).
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


REPLICAS_PER_NODE = 2


def shape_problem(hosts: int, nodes: int, clients: int = 1) -> str | None:
    """Why `lab up` cannot give `hosts` hosts this many nodes and client hosts, else None."""
    if hosts == 1:
        if nodes == 1 and clients == 1:
            return None
        return "a one-host lab is its own client and node: give more --hosts for more --nodes or --clients"
    if clients < 1 or nodes < 1 or clients + nodes > hosts:
        return (
            f"--nodes {nodes} --clients {clients}: choose at least 1 of each and at most {hosts} "
            "together (the first --clients hosts replay, the next --nodes are nodes; give more --hosts "
            "for more)"
        )
    return None


def assign_groups(names: list[str], nodes: int = 1, clients: int = 1) -> dict[str, list[str]]:
    """Groups of each host: the first `clients` are client hosts, the next `nodes` are nodes (vllm,
    lmcache, lb: a run is node-local), the rest spare. A one-host lab is client and node at once."""
    groups: dict[str, list[str]] = {name: [] for name in names}
    if len(names) == 1:
        groups[names[0]] = ["client", "vllm", "lmcache", "lb"]
        return groups
    for name in names[:clients]:
        groups[name] = ["client"]
    for name in names[clients : clients + nodes]:
        groups[name] = ["vllm", "lmcache", "lb"]
    return groups


def _host_vars(state: LabState, host: LabHost) -> dict[str, Any]:
    host_vars: dict[str, Any] = {"ansible_host": host.ip}
    if "vllm" in host.groups:
        # The hosts have no GPU: vLLM's CPU build and the simulator ignore the ids.
        host_vars["vllm_replicas"] = [{"index": i, "gpus": str(i)} for i in range(REPLICAS_PER_NODE)]
    if "lmcache" in host.groups and host.loop_device:
        host_vars["nvme_storage_devices"] = [{"device": host.loop_device, "mount": NVME_MOUNT}]
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
                "kvoffload_engine_build": "cpu",
                "ansible_ssh_private_key_file": state.ssh_key,
                # Throwaway containers with fresh host keys on every `lab up`: no host key check, for
                # these hosts only (the project's ansible.cfg keeps Ansible's default, checking).
                "ansible_host_key_checking": False,
                "ansible_ssh_common_args": (
                    "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes"
                ),
            },
            "hosts": {host.name: _host_vars(state, host) for host in state.hosts},
            "children": children,
        }
    }
    return HEADER + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
