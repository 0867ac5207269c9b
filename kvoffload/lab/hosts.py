"""Booting and reaching the lab's nspawn hosts: per-host files, the nspawn command, ssh readiness.

Each host is an ephemeral (`-x`) copy of the cached base rootfs booted by systemd-nspawn with systemd
as PID 1 on the lab bridge; its identity (address, hostname, /etc/hosts, authorized key) comes in
through read-only binds, so the base stays untouched. This module starts and probes hosts; tearing
down is `proc.terminate` on the recorded PID.
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

from kvoffload.errors import UserError
from kvoffload.lab.proc import is_ours, run
from kvoffload.lab.state import LabHost, LabState

log = logging.getLogger(__name__)

# The nspawn command line carries the machine name after this flag; used to recognise our PIDs.
MACHINE_FLAG = "--machine"
SSH_OPTIONS = (
    "-o",
    "BatchMode=yes",
    "-o",
    "IdentitiesOnly=yes",
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ConnectTimeout=3",
)


def host_dir(state: LabState, host: LabHost) -> Path:
    return Path(state.state_dir) / "hosts" / host.name


def generate_ssh_key(key: Path) -> None:
    key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key.unlink(missing_ok=True)
    key.with_suffix(".pub").unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kvoffload-lab", "-f", str(key)])


def write_host_files(state: LabState, host: LabHost, prefixlen: int) -> None:
    """systemd-networkd file and /etc/hosts for `host`, bound read-only into it at boot."""
    folder = host_dir(state, host)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "10-kvlab.network").write_text(
        "# Written by kvoffload-lab lab up: the lab bridge is the gateway; it forwards nothing.\n"
        "[Match]\nName=host0\n\n"
        f"[Network]\nAddress={host.ip}/{prefixlen}\nGateway={state.gateway}\n"
        "LinkLocalAddressing=no\nIPv6AcceptRA=no\n"
    )
    lines = ["127.0.0.1 localhost", f"127.0.1.1 {host.name}"]
    lines += [f"{other.ip} {other.name}" for other in state.hosts if other.name != host.name]
    (folder / "hosts").write_text("\n".join(lines) + "\n")


def nspawn_command(state: LabState, host: LabHost) -> list[str]:
    folder = host_dir(state, host)
    cmd = [
        "systemd-nspawn",
        "--quiet",
        f"--directory={state.rootfs}",
        "--ephemeral",
        MACHINE_FLAG,
        host.name,
        f"--hostname={host.name}",
        "--boot",
        "--register=no",
        "--keep-unit",
        f"--network-bridge={state.bridge}",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        "--console=read-only",
        f"--bind-ro={folder / '10-kvlab.network'}:/etc/systemd/network/10-kvlab.network",
        f"--bind-ro={folder / 'hosts'}:/etc/hosts",
        f"--bind-ro={state.ssh_key}.pub:/root/.ssh/authorized_keys",
    ]
    if host.loop_device:
        cmd.append(f"--bind={host.loop_device}")
    return cmd


def spawn(state: LabState, host: LabHost) -> int:
    """Boot `host` in the background (own session, console to a log file); returns the nspawn PID."""
    console = host_dir(state, host) / "console.log"
    with console.open("wb") as out:
        proc = subprocess.Popen(
            nspawn_command(state, host),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc.pid


def ssh_command(state: LabState, host: LabHost, *remote: str) -> list[str]:
    return ["ssh", "-i", state.ssh_key, *SSH_OPTIONS, f"root@{host.ip}", *remote]


def ssh_answers(state: LabState, host: LabHost) -> bool:
    return run(ssh_command(state, host, "true"), check=False, timeout=15).returncode == 0


def wait_for_ssh(state: LabState, timeout_s: float) -> None:
    """Wait until every host accepts the lab key over ssh; fail early if a host's nspawn died."""
    pending = list(state.hosts)
    deadline = time.monotonic() + timeout_s
    while pending:
        for host in list(pending):
            if host.pid is None or not is_ours(host.pid, host.name):
                tail = _tail(host_dir(state, host) / "console.log")
                raise UserError(f"lab host {host.name} exited while booting; its console said:\n{tail}")
            if ssh_answers(state, host):
                pending.remove(host)
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(host.name for host in pending)
            raise UserError(
                f"ssh did not answer on {names} within {timeout_s:.0f} s; consoles are under "
                f"{Path(state.state_dir) / 'hosts'}"
            )
        time.sleep(1.0)


def settle(state: LabState, host: LabHost, attempts: int = 3) -> None:
    """Wait until `host` finished booting and no unit failed, restarting units that did.

    On this kind of VM a unit started during the first second of a boot sometimes fails with
    "Failed at step CGROUP ... No such file or directory" (a cgroup race outside our control); run
    again, it succeeds. A lab host must come up "running", as a real host would, not "degraded".
    """
    failed: list[str] = []
    for _ in range(attempts):
        probe = run(ssh_command(state, host, "systemctl is-system-running --wait"), check=False, timeout=150)
        if probe.stdout.strip() == "running":
            return
        listing = run(
            ssh_command(state, host, "systemctl list-units --failed --plain --no-legend --no-pager"),
            check=False,
        )
        failed = [line.split()[0] for line in listing.stdout.splitlines() if line.strip()]
        if not failed:
            continue
        log.info("%s: restarting units that failed while booting: %s", host.name, ", ".join(failed))
        run(
            ssh_command(state, host, "systemctl reset-failed; systemctl restart " + " ".join(failed)),
            check=False,
        )
    raise UserError(
        f"lab host {host.name} did not reach the 'running' state; failed units: {', '.join(failed) or '?'} "
        f"(see `ssh -i {state.ssh_key} root@{host.ip} systemctl --failed`)"
    )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no console log)"
