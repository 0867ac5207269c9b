#!/usr/bin/python3
"""Ansible module: the systemd states of a host's kvoffload units, read (or stopped) in one module run.

Of the kvoffload.lab collection, called by its collect role after every cell: the units it names, plus
one `kvoffload-vllm@<n>.service` per replica configured on the host (an `replica-<n>.env` file in the
vllm role's folder), are read with a single `systemctl show`, and those systemd has loaded come back
as a mapping of unit name to properties. It replaces a `find` task, a `command` task and a Jinja parse
of the output (three round trips to the host in every cell, on every host, became one). It only reads:
check mode reports the same states.

`systemctl show` prints one block of KEY=value lines per unit, blocks separated by an empty line, in
the order asked; a unit never installed has `LoadState=not-found` and is left out. A unit caught in
a transition (waiting out its RestartSec after a crash, starting, stopping) is read again, every
0.5 s for at most `settle` seconds, so that a crash just before the collect reads as the restart it
becomes rather than as a unit caught between its death and its restart. Standard library only: it
runs on the host's own python3.

With `stop`, the vllm role's teardown stops those of the units that run in one `systemctl stop` (one
transaction: systemd stops the replicas before the cache server they are ordered after, and all
replicas at once, so their stop times do not add up), then reads their states: a `Result` of
`timeout` names a replica that systemd had to kill. Check mode says what it would stop.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: kvoffload_unit_states
short_description: Read the states of the kvoffload units of a host with one systemctl show
version_added: "0.1.0"
author: kvoffload-lab
description:
  - Asks C(systemctl show) for I(units) and for one I(replica_unit) instance per C(replica-<n>.env)
    file in I(replica_dir), and returns the properties of those systemd has loaded.
options:
  units: {type: list, elements: str, required: true, description: "Units recorded when present."}
  replica_dir: {type: path, default: /etc/kvoffload/vllm, description: "Folder of the replicas' env files."}
  replica_unit:
    {type: str, default: "kvoffload-vllm@{}.service", description: "Instance name, {} the replica number."}
  properties:
    {type: list, elements: str, required: true, description: "Properties asked (and Id, LoadState)."}
  settle:
    {type: float, default: 10, description: "Seconds to read again while a unit is in a transition."}
  stop:
    {type: bool, default: false, description: "Stop the running ones first (one systemctl stop), then read."}
"""

EXAMPLES = r"""
- name: Record the states of the kvoffload units and of every vLLM replica
  kvoffload.lab.kvoffload_unit_states:
    units: [kvoffload-lmcache.service, kvoffload-caddy.service]
    properties: [Result, NRestarts, ExecMainStartTimestamp, ExecMainStatus]
    settle: 10
  register: unit_states

- name: Stop the units, then read how they ended
  kvoffload.lab.kvoffload_unit_states:
    units: [kvoffload-gpu-telemetry.service]
    properties: [Result]
    stop: true
    settle: 0
  register: unit_stop

- name: Name the units that stopped
  ansible.builtin.debug:
    msg: "stopped {{ unit_stop.stopped }}; still changing state: {{ unit_stop.unsettled }}"
"""

RETURN = r"""
units:
  description: Loaded unit name -> its properties (strings as systemctl prints them).
  type: dict
  returned: always
asked:
  description: Every unit name asked, in order.
  type: list
  elements: str
  returned: always
unsettled:
  description: Units still in a transition when the module gave up waiting.
  type: list
  elements: str
  returned: always
stopped:
  description: "With stop: the units that ran and were stopped (would be, in check mode)."
  type: list
  elements: str
  returned: always
"""

_REPLICA_ENV = re.compile(r"^replica-([0-9]+)\.env$")
# States a unit passes through: waiting to restart after a crash, starting, stopping, reloading.
_TRANSIENT_ACTIVE = ("activating", "deactivating", "reloading")
_TRANSIENT_SUB = ("auto-restart",)


def replica_units(names: list[str], template: str) -> list[str]:
    """Instance names of the replicas whose env files are among `names`, by replica number."""
    numbers = sorted(int(m.group(1)) for m in map(_REPLICA_ENV.match, names) if m)
    return [template.format(n) for n in numbers]


def parse_show(text: str) -> dict[str, dict[str, str]]:
    """`systemctl show` output -> the loaded units' properties, keyed by their Id."""
    loaded: dict[str, dict[str, str]] = {}
    for block in text.split("\n\n"):
        props = dict(line.split("=", 1) for line in block.strip().splitlines() if "=" in line)
        if props.get("LoadState") == "loaded" and props.get("Id"):
            loaded[props["Id"]] = props
    return loaded


def running(units: dict[str, dict[str, str]]) -> list[str]:
    """The loaded units that a stop would act on: all but those already inactive or failed."""
    return [name for name, props in units.items() if props.get("ActiveState") not in ("inactive", "failed")]


def in_transition(units: dict[str, dict[str, str]]) -> list[str]:
    """The units caught between two states (those read again until they settle)."""
    return sorted(
        name
        for name, props in units.items()
        if props.get("ActiveState") in _TRANSIENT_ACTIVE or props.get("SubState") in _TRANSIENT_SUB
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "units": {"type": "list", "elements": "str", "required": True},
            "replica_dir": {"type": "path", "default": "/etc/kvoffload/vllm"},
            "replica_unit": {"type": "str", "default": "kvoffload-vllm@{}.service"},
            "properties": {"type": "list", "elements": "str", "required": True},
            "settle": {"type": "float", "default": 10.0},
            "stop": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        present = [entry.name for entry in Path(p["replica_dir"]).iterdir()]
    except FileNotFoundError:
        present = []  # no vllm role on this host (client, load balancer)
    asked = list(p["units"]) + replica_units(present, p["replica_unit"])
    wanted = [x for x in p["properties"] if x not in ("Id", "LoadState", "ActiveState", "SubState")]
    properties = ["Id", "LoadState", "ActiveState", "SubState", *wanted]
    systemctl = module.get_bin_path("systemctl", required=True)
    argv = [systemctl, "show", "--property=" + ",".join(properties), "--", *asked]
    stopped: list[str] = []
    if p["stop"]:
        stopped = running(show(module, argv, asked))
        if stopped and not module.check_mode:
            rc, _out, err = module.run_command([systemctl, "stop", "--", *stopped])
            if rc != 0:
                module.fail_json(
                    msg=f"systemctl stop exited {rc}: {err.strip()}", asked=asked, stopped=stopped
                )
    deadline = time.monotonic() + max(0.0, p["settle"])
    while True:
        units = show(module, argv, asked)
        moving = in_transition(units)
        if not moving or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    module.exit_json(changed=bool(stopped), units=units, asked=asked, unsettled=moving, stopped=stopped)


def show(module: AnsibleModule, argv: list[str], asked: list[str]) -> dict[str, dict[str, str]]:
    """One `systemctl show` of the asked units, parsed (the module fails on a non-zero exit)."""
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg=f"systemctl show exited {rc}: {err.strip()}", asked=asked)
    return parse_show(out)


if __name__ == "__main__":
    main()
