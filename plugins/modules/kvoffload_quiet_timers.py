#!/usr/bin/python3
"""Ansible module: keep periodic disk jobs from starting during a run of cells, and give them back after.

Of the kvoffload.lab collection, called by the nvme_storage role (quiet.yml when a node's first cell
deploys, unquiet.yml when its last one is torn down). Thirteen tasks, a loop of one round trip per
timer among them, cost about 12 s on each host; this module does the same in one.

`state: quiet`: the installed timers of `timers` that are not masked already (an administrator's mask
is left alone) are recorded in `record` (JSON: `masked`, those that ran, `active`, and the jobs they
start, `jobs`), stopped with one `systemctl stop`, runtime-masked as `systemctl mask --runtime` does
(`<runtime_dir>/<timer>` -> /dev/null, gone at the next boot) and systemd reloaded; then the module
waits, up to `wait` seconds, for every job such a timer had already started to finish (never killing
it). The record is written before any mask, so a failure half-way leaves unquiet what to undo; an
earlier record wins over a new reading (a second quiet re-asserts what the first one did).

`state: unquiet`: from the record, removes only the masks that are still links to /dev/null (whatever
else is there now is not ours), reloads systemd, starts again the timers that ran (a Persistent= timer
that missed its time runs its job now, between cells) and removes the record. Without a record there
is nothing to undo.

Check mode reports what it would mask or unmask and changes nothing. Standard library only: it runs on
the host's own python3.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: kvoffload_quiet_timers
short_description: Stop and runtime-mask periodic-job timers for a run of cells, and restore them
version_added: "0.1.0"
author: kvoffload-lab
description:
  - With I(state=quiet), stops and runtime-masks the installed, unmasked I(timers), records what it did
    in I(record) and waits for the jobs they had started; with I(state=unquiet), undoes that record.
options:
  state: {type: str, required: true, choices: [quiet, unquiet], description: "Mask, or undo the record."}
  timers: {type: list, elements: str, default: [], description: "Timers to consider (state=quiet)."}
  record: {type: path, default: /run/kvoffload/quiet-timers.json, description: "What quiet did, for unquiet."}
  runtime_dir: {type: path, default: /run/systemd/system, description: "Where runtime masks live."}
  wait: {type: float, default: 600, description: "Seconds to wait for running jobs of the timers (quiet)."}
  interval: {type: float, default: 5, description: "Seconds between two looks at those jobs."}
"""

EXAMPLES = r"""
- name: Keep fstrim and the package timers from running during the cells
  kvoffload.lab.kvoffload_quiet_timers:
    state: quiet
    timers: [fstrim.timer, apt-daily.timer, apt-daily-upgrade.timer, man-db.timer]
    record: /run/kvoffload/quiet-timers.json
    wait: 600
  register: quiet_timers

- name: Say what was masked
  ansible.builtin.debug:
    msg: "masked {{ quiet_timers.masked }}, waited {{ quiet_timers.waited_s }} s for {{ quiet_timers.jobs }}"

- name: Restore the timers after the run
  kvoffload.lab.kvoffload_quiet_timers:
    state: unquiet
    record: /run/kvoffload/quiet-timers.json
"""

RETURN = r"""
masked:
  description: The timers masked by quiet (or whose masks unquiet removed).
  type: list
  elements: str
  returned: always
active:
  description: The timers that ran before quiet (those unquiet starts again).
  type: list
  elements: str
  returned: always
jobs:
  description: The units those timers start.
  type: list
  elements: str
  returned: always
waited_s:
  description: Seconds spent waiting for those jobs.
  type: float
  returned: when state=quiet
"""

_RUNNING = ("active", "activating", "reloading", "deactivating")


def candidates(list_unit_files: str, timers: list[str]) -> list[str]:
    """The timers of `timers` (in that order) that `systemctl list-unit-files --plain` lists and that
    are not masked (`masked` or `masked-runtime`: an administrator's, or an earlier quiet's)."""
    states: dict[str, str] = {}
    for line in list_unit_files.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            states[fields[0]] = fields[1]
    return [t for t in timers if t in states and not states[t].startswith("masked")]


def jobs_of(show: str) -> dict[str, str]:
    """Timer -> the unit it starts, from `systemctl show --property=Id,Unit` of the timers: one block
    per unit, blank-line separated, its properties in systemd's order (a timer's Unit= comes before
    Id=). A masked unit has no Unit=, so this is read before the mask."""
    jobs: dict[str, str] = {}
    for block in show.split("\n\n"):
        props = {key: value for key, _, value in (line.partition("=") for line in block.splitlines())}
        if props.get("Id") and props.get("Unit"):
            jobs[props["Id"]] = props["Unit"]
    return jobs


def plan_record(masked: list[str], active: list[str], jobs: dict[str, str]) -> dict[str, list[str]]:
    """What quiet records: the timers it masks, those of them that ran, and the jobs they start."""
    return {
        "masked": masked,
        "active": [t for t in masked if t in active],
        "jobs": [jobs[t] for t in masked if t in jobs],
    }


def read_record(module: AnsibleModule, path: str) -> dict[str, list[str]]:
    """The record an earlier quiet wrote; a damaged one fails the module, naming the file and the fix."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        if not all(isinstance(record.get(k), list) for k in ("masked", "active", "jobs")):
            raise ValueError("masked, active and jobs must be lists")
    except (OSError, ValueError, AttributeError) as exc:
        module.fail_json(
            msg=f"{path}: not a record of kvoffload_quiet_timers ({exc}); undo its masks by hand "
            "(`systemctl unmask --runtime <timer>`) and remove the file"
        )
    return {k: [str(x) for x in record[k]] for k in ("masked", "active", "jobs")}


def is_mask(path: str) -> bool:
    return Path(path).is_symlink() and str(Path(path).readlink()) == "/dev/null"


class Systemd:
    """The module's calls of systemctl; a non-zero exit fails the module (but that of `is-active`)."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.bin = module.get_bin_path("systemctl", required=True)

    def run(self, *args: str) -> str:
        rc, out, err = self.module.run_command([self.bin, *args])
        if rc != 0:
            self.module.fail_json(msg=f"systemctl {args[0]} exited {rc}: {err.strip()}")
        return str(out)

    def active_states(self, units: list[str]) -> list[str]:
        """Each unit's `systemctl is-active` answer, in order ("unknown" where it gave none); it exits
        non-zero when one is not active, which is not a failure here."""
        if not units:
            return []
        _rc, out, _err = self.module.run_command([self.bin, "is-active", "--", *units])
        answers = str(out).split()
        return [answers[i] if i < len(answers) else "unknown" for i in range(len(units))]

    def running(self, units: list[str]) -> list[str]:
        """Those of `units` that run (or are starting or stopping)."""
        return [u for u, state in zip(units, self.active_states(units), strict=True) if state in _RUNNING]


def quiet(module: AnsibleModule, systemd: Systemd) -> dict[str, object]:
    p = module.params
    record_path = p["record"]
    if Path(record_path).exists():
        record = read_record(module, record_path)
        wrote = False
    else:
        listed = systemd.run("list-unit-files", "--type=timer", "--no-legend", "--no-pager", "--plain")
        masked = candidates(listed, list(p["timers"]))
        active = [t for t, a in zip(masked, systemd.active_states(masked), strict=True) if a == "active"]
        jobs = jobs_of(systemd.run("show", "--property=Id,Unit", "--", *masked)) if masked else {}
        record = plan_record(masked, active, jobs)
        wrote = True
    masks = [str(Path(p["runtime_dir"], t)) for t in record["masked"]]
    to_mask = [m for m in masks if not os.path.lexists(m)]
    foreign = [m for m in masks if os.path.lexists(m) and not is_mask(m)]
    if foreign:
        module.fail_json(
            msg=f"not a runtime mask, left alone: {', '.join(foreign)}; remove it or drop its timer "
            "from nvme_storage_quiet_timers",
            **record,
        )
    running = systemd.running(record["masked"])
    changed = wrote or bool(to_mask or running)
    if module.check_mode:
        return {"changed": changed, **record, "waited_s": 0.0}
    if wrote:
        Path(record_path).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = Path(record_path + ".tmp")
        tmp.write_text(json.dumps(record, indent=4) + "\n", encoding="utf-8")
        tmp.chmod(0o644)
        tmp.replace(record_path)
    # Stopped before the mask: a timer stopped once masked ends up "failed" (the host would read degraded).
    if running:
        systemd.run("stop", "--", *running)
    for mask in to_mask:
        Path(mask).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        Path(mask).symlink_to("/dev/null")
    if to_mask:
        systemd.run("daemon-reload")
    t0 = time.monotonic()
    jobs = list(record["jobs"])
    while jobs:
        busy = systemd.running(jobs)
        if not busy:
            break
        if time.monotonic() - t0 >= p["wait"]:
            module.fail_json(
                msg=f"periodic disk jobs still run after {p['wait']:g} s ({', '.join(busy)}); they would "
                "disturb the cell: let them finish, or raise nvme_storage_quiet_wait",
                changed=changed,
                **record,
            )
        time.sleep(max(0.0, p["interval"]))
    return {"changed": changed, **record, "waited_s": round(time.monotonic() - t0, 3)}


def unquiet(module: AnsibleModule, systemd: Systemd) -> dict[str, object]:
    p = module.params
    record_path = p["record"]
    if not Path(record_path).exists():
        return {"changed": False, "masked": [], "active": [], "jobs": []}
    record = read_record(module, record_path)
    # Only a link to /dev/null is a mask; whatever else is there now is not ours to remove.
    ours = [t for t in record["masked"] if is_mask(str(Path(p["runtime_dir"], t)))]
    result = {"changed": True, "masked": ours, "active": list(record["active"]), "jobs": list(record["jobs"])}
    if module.check_mode:
        return result
    for timer in ours:
        Path(p["runtime_dir"], timer).unlink()
    if ours:
        systemd.run("daemon-reload")
    if record["active"]:
        systemd.run("start", "--", *record["active"])
    Path(record_path).unlink()
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["quiet", "unquiet"]},
            "timers": {"type": "list", "elements": "str", "default": []},
            "record": {"type": "path", "default": "/run/kvoffload/quiet-timers.json"},
            "runtime_dir": {"type": "path", "default": "/run/systemd/system"},
            "wait": {"type": "float", "default": 600.0},
            "interval": {"type": "float", "default": 5.0},
        },
        supports_check_mode=True,
    )
    systemd = Systemd(module)
    state = module.params["state"]
    module.exit_json(**(quiet(module, systemd) if state == "quiet" else unquiet(module, systemd)))


if __name__ == "__main__":
    main()
