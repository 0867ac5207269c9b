"""The lab's private bridge and its loop-device NVMe stand-in.

Only creates and deletes what it is told to (by name); never touches other links, routes, firewall
rules or `net.ipv4.ip_forward` (the lab must have no route out, so forwarding stays as it is: off).
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

from kvoffload.errors import UserError
from kvoffload.lab.proc import run

log = logging.getLogger(__name__)

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def plan_addresses(subnet: str, count: int) -> tuple[str, list[str]]:
    """(gateway address, host addresses) in `subnet`: the bridge takes .1, host i takes .(10+i)."""
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise UserError(f"--subnet {subnet}: not an IPv4 network like 10.213.0.0/24 ({exc})") from exc
    if not net.is_private or net.prefixlen > 24:
        raise UserError(f"--subnet {subnet}: use a private network of /24 or larger, e.g. 10.213.0.0/24")
    hosts = list(net.hosts())
    if len(hosts) < 10 + count:
        raise UserError(f"--subnet {subnet} has no room for {count} hosts")
    return str(hosts[0]), [str(hosts[9 + i]) for i in range(1, count + 1)]


def create_bridge(name: str, gateway: str, prefixlen: int) -> None:
    if link_exists(name):
        raise UserError(
            f"a network link named {name} already exists and this lab's state does not own it: "
            f"remove it (`ip link del {name}`) or pick another with --bridge"
        )
    run(["ip", "link", "add", name, "type", "bridge"])
    run(["ip", "addr", "add", f"{gateway}/{prefixlen}", "dev", name])
    run(["ip", "link", "set", name, "up"])
    if IP_FORWARD.read_text().strip() != "0":
        log.warning(
            "net.ipv4.ip_forward is on (something else enabled it, e.g. podman); lab hosts have no NAT, "
            "but consider `sysctl -w net.ipv4.ip_forward=0`"
        )


def delete_bridge(name: str) -> None:
    if link_exists(name):
        run(["ip", "link", "del", name])


def attach_loop(backing: Path, size_bytes: int) -> str:
    """Create a sparse backing file of `size_bytes` and attach it; returns /dev/loopN."""
    backing.parent.mkdir(parents=True, exist_ok=True)
    with backing.open("wb") as handle:
        handle.truncate(size_bytes)
    return run(["losetup", "--find", "--show", str(backing)]).stdout.strip()


def detach_loop(device: str, backing: str) -> None:
    """Detach `device` only if it is still backed by our `backing` file (loop numbers get reused)."""
    proc = run(["losetup", "--noheadings", "--output", "BACK-FILE", device], check=False)
    if proc.returncode != 0:
        return
    current = proc.stdout.strip().removesuffix(" (deleted)")
    if Path(current) != Path(backing):
        log.warning("%s is now backed by %s, not by our %s: leaving it attached", device, current, backing)
        return
    run(["losetup", "--detach", device])
