#!/usr/bin/python3
"""Ansible module: enable and start a host's units, restart those named, and wait for their health.

Of the kvoffload.lab collection, called in every cell's deploy by the vllm role (its replicas),
lmcache_server (one unit, two ports) and caddy: a loop of one `systemd_service` task per replica, then a
loop of one `uri` task per replica, cost two round trips to the host per replica (four for two replicas,
sixteen for eight); this module does the same in one. One `systemctl show` reads the units; those
not enabled are enabled with one `systemctl enable`, those named in `restart` (their configuration
changed) restarted with one `systemctl restart`, and those not running started with one
`systemctl start`: each call is one systemd transaction, so the replicas start together
(`daemon_reload` first, when a unit file changed). Then every `wait` URL is polled (no proxy: they
are the host's own or its lab network's addresses) until it answers 200, or a
`tcp://host:port` target until it accepts a connection, all within `timeout` seconds; a unit that failed
meanwhile ends the wait at once, and the error names the unit, its URL, the last answer and the
journalctl command to read. Whenever a unit fails to (re)start, the error ends with the last lines of
its journal: a cell's error then says why (a port taken, a configuration refused) without a second
look at the host, which a lab torn down after its run no longer allows. A `systemctl start` fails
when a unit's first try fails in a control process or before its main process runs, even where systemd
starts it again itself (`Restart=on-failure` and its `RestartSec`, as every kvoffload unit has); such a
unit, when it has a `wait` URL, is waited for like the others, its failure and journal kept in
`restarting` and said as a warning: the wait decides. A unit that comes back answers; one that
systemd restarted three times (RESTARTS_GIVEN_UP) during the wait without an answer is given up then,
not at the timeout (with RestartSec=2, systemd's start limit never stops it).

With `one_first`, the first unit that would (re)start does so alone and is waited for before the others
(re)start in one transaction: vLLM replicas of one host share one torch.compile cache (the engine
user's state folder), so on a first start eight replicas would each compile the same graphs and race
to write them; started after one, the others load them from the cache.

Check mode says what it would enable, restart and start (a unit not installed yet too: the run would
have installed it), and waits for nothing. Standard library
only: it runs on the host's own python3.
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: kvoffload_start_units
short_description: Enable and start systemd units in one transaction each and wait for their health
version_added: "0.1.0"
author: kvoffload-lab
description:
  - Enables the I(units) that are not enabled, restarts those named in I(restart), starts those not
    running, then polls each I(wait) URL until it answers 200 (a tcp://host:port one until it connects).
options:
  units: {type: list, elements: str, required: true, description: "Units to have enabled and running."}
  restart: {type: list, elements: str, default: [], description: "Those of the units to restart."}
  wait: {type: dict, default: {}, description: "Unit -> its health URL, or a list of them, waited for."}
  daemon_reload: {type: bool, default: false, description: "Reload systemd first (a unit file changed)."}
  timeout: {type: float, default: 300, description: "Seconds for every URL to answer 200 (per wait)."}
  one_first:
    type: bool
    default: false
    description: >-
      (Re)start the first unit that needs it alone and wait for its URLs, then the rest: units that
      share a compile cache then fill it once.
  interval: {type: float, default: 1, description: "Seconds between two polls of a URL."}
"""

EXAMPLES = r"""
- name: Start the LMCache server and wait for its port and health check
  kvoffload.lab.kvoffload_start_units:
    units: [kvoffload-lmcache.service]
    restart: [kvoffload-lmcache.service]
    daemon_reload: true
    wait:
      kvoffload-lmcache.service:
        - tcp://127.0.0.1:5555
        - http://127.0.0.1:8080/healthcheck
    timeout: 120
    interval: 0.25
  register: lmcache_start

- name: Start two vLLM replicas, the first alone so that it fills the compile cache
  kvoffload.lab.kvoffload_start_units:
    units: [kvoffload-vllm@0.service, kvoffload-vllm@1.service]
    wait:
      kvoffload-vllm@0.service: http://127.0.0.1:8000/health
      kvoffload-vllm@1.service: http://127.0.0.1:8001/health
    timeout: 900
    one_first: true
  register: vllm_start

- name: Say how long the replicas took
  ansible.builtin.debug:
    msg: "{{ vllm_start.first }} first; all healthy after {{ vllm_start.waited_s }} s"
"""

RETURN = r"""
nrestarts:
  description: >-
    Unit -> systemd's automatic restarts so far (NRestarts), for the units of I(restarting) once they
    answered: the restarts of this start, which the orchestrator does not count as the cell's.
  type: dict
  returned: always
restarting:
  description: >-
    Each systemctl start or restart that failed where systemd starts the units again itself (Restart=),
    with those units and the error (its journal lines); the wait then decides.
  type: list
  elements: dict
  returned: always
enabled:
  description: The units that were enabled (would be, in check mode).
  type: list
  elements: str
  returned: always
restarted:
  description: The units that were restarted.
  type: list
  elements: str
  returned: always
started:
  description: The units that were started (they did not run).
  type: list
  elements: str
  returned: always
waited_s:
  description: Seconds until every URL answered 200.
  type: float
  returned: always
first:
  description: The unit (re)started and waited for before the others (one_first), or null.
  type: str
  returned: always
"""

# Unit-file states that need no `systemctl enable` (a template instance reads as its template's).
_ENABLED = ("enabled", "enabled-runtime", "static", "alias", "indirect", "generated")
# Active states in which `systemctl start` would do nothing.
_RUNNING = ("active", "activating", "reloading")


def parse_show(text: str) -> dict[str, dict[str, str]]:
    """`systemctl show` output -> each unit's properties, keyed by its Id."""
    units: dict[str, dict[str, str]] = {}
    for block in text.split("\n\n"):
        props = dict(line.split("=", 1) for line in block.strip().splitlines() if "=" in line)
        if props.get("Id"):
            units[props["Id"]] = props
    return units


def plan(
    units: list[str], restart: list[str], states: dict[str, dict[str, str]]
) -> tuple[list[str], list[str], list[str]]:
    """(to enable, to restart, to start), each in the order of `units`."""
    to_enable = [u for u in units if states.get(u, {}).get("UnitFileState") not in _ENABLED]
    to_restart = [u for u in units if u in restart]
    to_start = [
        u for u in units if u not in to_restart and states.get(u, {}).get("ActiveState") not in _RUNNING
    ]
    return to_enable, to_restart, to_start


def stages(
    one_first: bool, units: list[str], to_restart: list[str], to_start: list[str]
) -> list[tuple[list[str], list[str]]]:
    """(to restart, to start) per step: one step, or with `one_first` and two or more units to
    (re)start, the first of them in `units` order alone and then the rest."""
    moving = [u for u in units if u in to_restart or u in to_start]
    if not one_first or len(moving) < 2:
        return [(to_restart, to_start)]
    first = moving[0]
    alone = ([first], []) if first in to_restart else ([], [first])
    return [alone, ([u for u in to_restart if u != first], [u for u in to_start if u != first])]


def answer(opener: urllib.request.OpenerDirector, url: str, timeout: float) -> str | None:
    """None when `url` answers 200 (a tcp://host:port one: accepts a connection), else what it
    answered (or why it did not)."""
    if url.startswith("tcp://"):
        host, _, port = url[len("tcp://") :].rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except (OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None
    try:
        with opener.open(url, timeout=timeout) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "units": {"type": "list", "elements": "str", "required": True},
            "restart": {"type": "list", "elements": "str", "default": []},
            "wait": {"type": "dict", "default": {}},
            "timeout": {"type": "float", "default": 300.0},
            "interval": {"type": "float", "default": 1.0},
            "daemon_reload": {"type": "bool", "default": False},
            "one_first": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    units = list(p["units"])
    systemctl = module.get_bin_path("systemctl", required=True)
    if p["daemon_reload"] and not module.check_mode:
        rc, _out, err = module.run_command([systemctl, "daemon-reload"])
        if rc != 0:
            module.fail_json(msg=f"systemctl daemon-reload exited {rc}: {err.strip()}", units=units)
    states = show(module, systemctl, units, ["Id", "LoadState", "ActiveState", "UnitFileState"])
    missing = [u for u in units if states.get(u, {}).get("LoadState") != "loaded"]
    # check mode on a fresh host: the unit files that this run would have installed are not there
    if missing and not module.check_mode:
        module.fail_json(msg=f"no such unit: {', '.join(missing)} (is its unit file installed?)", units=units)
    to_enable, to_restart, to_start = plan(units, list(p["restart"]), states)
    changed = bool(to_enable or to_restart or to_start)
    steps = stages(p["one_first"], units, to_restart, to_start)
    restarting: list[dict[str, str]] = []
    result: dict[str, object] = {
        "enabled": to_enable,
        "restarted": to_restart,
        "started": to_start,
        "waited_s": 0.0,
        "first": (steps[0][0] + steps[0][1])[0] if len(steps) > 1 else None,
        "restarting": restarting,
        "nrestarts": {},
    }
    if module.check_mode:
        module.exit_json(changed=changed, **result)
    t0 = time.monotonic()
    for i, (restart_now, start_now) in enumerate(steps):
        verbs = (("enable", to_enable if i == 0 else []), ("restart", restart_now), ("start", start_now))
        for verb, names in verbs:
            if names:
                failure = run_verb(module, systemctl, verb, names, p["wait"], restarting)
                if failure is not None:
                    module.fail_json(msg=failure, changed=changed, **result)
        # Before the last step only the unit started alone; at the end every URL.
        wait = p["wait"]
        if i < len(steps) - 1:
            wait = {u: p["wait"][u] for u in restart_now + start_now if u in p["wait"]}
        failure = wait_healthy(module, systemctl, wait, p["timeout"], p["interval"])
        if failure is not None:
            result["waited_s"] = round(time.monotonic() - t0, 3)
            module.fail_json(msg=failure, changed=changed, **result)
    result["waited_s"] = round(time.monotonic() - t0, 3)
    came_back = sorted({u for r in restarting for u in r["units"].split()})
    if came_back:  # their restarts so far were this start's, not the cell's (the orchestrator's baseline)
        states = show(module, systemctl, came_back, ["Id", "NRestarts"])
        result["nrestarts"] = {u: _restarts(states.get(u, {})) for u in came_back}
    module.exit_json(changed=changed, **result)


def run_verb(
    module: AnsibleModule,
    systemctl: str,
    verb: str,
    names: list[str],
    wait: dict[str, object],
    restarting: list[dict[str, str]],
) -> str | None:
    """`systemctl VERB NAMES`: None once it succeeded, or where every unit it left down is one that
    systemd restarts itself (`Restart=`: SubState auto-restart) and that the wait will watch (its failure
    kept in `restarting`, its journal with it, and said as a warning); else the error."""
    rc, _out, err = module.run_command([systemctl, verb, "--", *names])
    if rc == 0:
        return None
    failure = f"systemctl {verb} exited {rc}: {err.strip()}" + journal_tail(module, names)
    states = show(module, systemctl, names, ["Id", "ActiveState", "SubState"])
    down = [u for u in names if states.get(u, {}).get("ActiveState") != "active"]
    coming_back = [u for u in down if states.get(u, {}).get("SubState") == "auto-restart" and u in wait]
    if not down or coming_back != down:
        return failure
    restarting.append({"units": " ".join(down), "error": failure})
    module.warn(f"{' '.join(down)} failed to {verb} and systemd starts it again (Restart=): {failure}")
    return None


# Restarts by systemd (Restart=) during one wait after which a unit that never answered is given up.
RESTARTS_GIVEN_UP = 3


def wait_healthy(
    module: AnsibleModule, systemctl: str, wait: dict[str, str], timeout: float, interval: float
) -> str | None:
    """Poll each URL until all answered 200 (None), or the reason the wait failed: a unit failed, or
    systemd restarted it RESTARTS_GIVEN_UP times meanwhile (it keeps failing), or the timeout."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    pending = {
        str(url): str(unit)
        for unit, urls in wait.items()
        for url in (urls if isinstance(urls, list) else [urls])
    }
    properties = ["Id", "ActiveState", "Result", "NRestarts"]
    before = {
        u: _restarts(s) for u, s in show(module, systemctl, sorted(set(pending.values())), properties).items()
    }
    last: dict[str, str] = {}
    deadline = time.monotonic() + max(0.0, timeout)
    while pending:
        for url in list(pending):
            error = answer(opener, url, timeout=max(1.0, interval))
            if error is None:
                del pending[url]
            else:
                last[url] = error
        if not pending:
            return None
        states = show(module, systemctl, sorted(set(pending.values())), properties)
        dead = {u: s for u, s in states.items() if s.get("ActiveState") == "failed"}
        looping = {u for u, s in states.items() if _restarts(s) - before.get(u, 0) >= RESTARTS_GIVEN_UP}
        if dead or looping or time.monotonic() >= deadline:
            url, unit = next(
                (x for x in pending.items() if x[1] in dead or x[1] in looping), next(iter(pending.items()))
            )
            state = states.get(unit, {})
            if unit in dead:
                why = f"{unit} failed (Result={state.get('Result', '?')})"
            elif unit in looping:
                why = f"{unit} restarted by systemd {_restarts(state) - before.get(unit, 0)} times meanwhile"
            else:
                why = f"no 200 within {timeout:g} s"
            return (
                f"{why}: {url} last answered {last.get(url, 'nothing')}; "
                f"see `journalctl -u {unit}` on this host" + journal_tail(module, [unit])
            )
        time.sleep(max(0.0, interval))
    return None


def _restarts(state: dict[str, str]) -> int:
    """A unit's NRestarts (systemd's automatic restarts since its last start by hand), 0 if unknown."""
    value = state.get("NRestarts", "0")
    return int(value) if value.isdigit() else 0


# Lines of each unit's journal that a failure quotes, and the characters kept of each line.
JOURNAL_LINES = 15
JOURNAL_LINE_CHARS = 400


def journal_tail(module: AnsibleModule, units: list[str]) -> str:
    """The last lines of each unit's journal, to end an error with ("" where journalctl is missing or
    says nothing): what the service printed before it exited."""
    journalctl = module.get_bin_path("journalctl")
    if journalctl is None:
        return ""
    parts = []
    for unit in units:
        argv = [journalctl, "--no-pager", "--output=cat", f"--lines={JOURNAL_LINES}", "--unit", unit]
        rc, out, _err = module.run_command(argv)
        lines = [line[:JOURNAL_LINE_CHARS] for line in out.splitlines() if line.strip()]
        if rc == 0 and lines and lines != ["-- No entries --"]:
            parts.append(f"\nlast {len(lines)} lines of {unit}'s journal:\n" + "\n".join(lines))
    return "".join(parts)


def show(
    module: AnsibleModule, systemctl: str, units: list[str], properties: list[str]
) -> dict[str, dict[str, str]]:
    """One `systemctl show` of `units`, parsed (the module fails on a non-zero exit)."""
    argv = [systemctl, "show", "--property=" + ",".join(properties), "--", *units]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg=f"systemctl show exited {rc}: {err.strip()}", units=units)
    return parse_show(out)


if __name__ == "__main__":
    main()
