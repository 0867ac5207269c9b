"""`lab up`, `lab down` and `lab status` as functions: the virtual lab's whole life cycle.

Up records every resource in the state file right after creating it, so `down` can undo a half-up lab
(bridge without hosts, hosts without ssh). Down stops hosts by their recorded PIDs (SIGTERM, which
nspawn turns into a clean shutdown), detaches the loop device, deletes the bridge and is idempotent.
Root only. Nothing here prints: the CLI renders the returned data.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from kvoffload.atomic import write_text_atomic
from kvoffload.errors import UserError
from kvoffload.lab import hosts as lab_hosts
from kvoffload.lab import network
from kvoffload.lab.image import ensure_base_image
from kvoffload.lab.inventory import HEADER, assign_groups, render, shape_problem
from kvoffload.lab.paths import state_dir
from kvoffload.lab.proc import is_ours, terminate
from kvoffload.lab.state import STATE_FILE, LabHost, LabState

log = logging.getLogger(__name__)

REQUIRED_TOOLS = ("systemd-nspawn", "debootstrap", "ip", "losetup", "ssh", "ssh-keygen")


@dataclass(frozen=True)
class UpOptions:
    """What `lab up` builds."""

    hosts: int = 2
    nodes: int = 1  # the hosts after the client hosts are nodes (vllm, lmcache, lb), each with a loop device
    clients: int = 1  # the first hosts are client hosts (group client); the nodes are shared out among them
    bridge: str = "kvlab0"
    subnet: str = "10.213.0.0/24"
    prefix: str = "kvlab"
    inventory: Path = Path("inventories/local/hosts.yml")
    nvme_size_mb: int = 512
    ssh_timeout_s: float = 120.0


@dataclass(frozen=True)
class HostStatus:
    """What `lab status` reports per host."""

    name: str
    ip: str
    groups: tuple[str, ...]
    pid: int | None
    running: bool
    ssh: bool


@dataclass(frozen=True)
class LabStatus:
    """What `lab status` reports for the lab."""

    state_dir: Path
    bridge: str
    bridge_up: bool
    loop_device: str | None
    inventory: str
    hosts: tuple[HostStatus, ...]

    @property
    def healthy(self) -> bool:
        return self.bridge_up and bool(self.hosts) and all(h.running and h.ssh for h in self.hosts)


def require_root() -> None:
    if os.geteuid() != 0:
        raise UserError(
            "the virtual lab needs root (systemd-nspawn, a bridge, a loop device): "
            "run `sudo kvoffload-lab lab ...`"
        )
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        raise UserError(
            f"missing {', '.join(missing)}: `apt-get install --no-install-recommends debootstrap "
            "systemd-container iproute2 util-linux openssh-client` (or `make deps`)"
        )


def check_options(opts: UpOptions) -> None:
    """The options `up` refuses, each naming its flag; `lab up` checks them before it looks at (or
    pings) an existing lab, and `up` again for its other callers."""
    if not 1 <= opts.hosts <= 32:
        raise UserError(f"--hosts {opts.hosts}: choose between 1 and 32 hosts")
    problem = shape_problem(opts.hosts, opts.nodes, opts.clients)
    if problem is not None:
        raise UserError(problem)
    # nspawn names the host side of each veth "vb-<machine>", and link names stop at 15 characters.
    if len(f"vb-{opts.prefix}{opts.hosts}") > 15 or not opts.prefix.isalnum():
        raise UserError(f"--prefix {opts.prefix}: use up to 10 letters/digits")
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", opts.bridge):
        raise UserError(f"--bridge {opts.bridge!r}: a network link name of 1-15 letters, digits, . _ -")
    network.plan_addresses(opts.subnet, opts.hosts)  # raises naming --subnet
    if opts.inventory.is_dir():
        raise UserError(f"--inventory {opts.inventory}: is a folder; give the hosts.yml file to write")


def up(opts: UpOptions) -> LabStatus:
    """Build (or reuse) the image and boot the lab; returns its status once ssh answers everywhere."""
    require_root()
    check_options(opts)
    sdir = state_dir()
    existing = LabState.load(sdir)
    if existing is not None:
        current = status()
        if current.healthy and len(current.hosts) == opts.hosts:
            log.info("the lab is already up (state in %s); rewriting its inventory", sdir)
            Path(existing.inventory).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(Path(existing.inventory), render(existing))
            return current
        raise UserError(
            f"a lab (or what is left of one) is recorded in {sdir / STATE_FILE}: "
            "run `kvoffload-lab lab down` first"
        )
    gateway, addresses = network.plan_addresses(opts.subnet, opts.hosts)
    prefixlen = ipaddress.IPv4Network(opts.subnet).prefixlen
    image = ensure_base_image()
    sdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    names = [f"{opts.prefix}{i}" for i in range(1, opts.hosts + 1)]
    groups = assign_groups(names, opts.nodes, opts.clients)
    state = LabState(
        state_dir=str(sdir),
        bridge=opts.bridge,
        subnet=opts.subnet,
        gateway=gateway,
        rootfs=str(image.rootfs),
        ssh_key=str(sdir / "ssh" / "id_ed25519"),
        inventory=str(opts.inventory.resolve()),
        hosts=[LabHost(name=n, ip=ip, groups=groups[n]) for n, ip in zip(names, addresses, strict=True)],
    )
    state.save()
    try:
        lab_hosts.generate_ssh_key(Path(state.ssh_key))
        network.create_bridge(opts.bridge, gateway, prefixlen)
        state.bridge_created = True
        state.save()
        for i, host in enumerate(h for h in state.hosts if "lmcache" in h.groups):
            backing = sdir / f"nvme{i}.img"
            host.loop_backing = str(backing)
            host.loop_device = network.attach_loop(backing, opts.nvme_size_mb * 1024 * 1024)
            state.save()
        for host in state.hosts:
            lab_hosts.write_host_files(state, host, prefixlen)
        for host in state.hosts:
            host.pid = lab_hosts.spawn(state, host)
            state.save()
        lab_hosts.wait_for_ssh(state, opts.ssh_timeout_s)
        for host in state.hosts:
            lab_hosts.settle(state, host)
        opts.inventory.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(opts.inventory, render(state))
    except BaseException:
        kept = _keep_consoles(sdir)
        log.error("lab up failed; tearing down what was created (host consoles kept in %s)", kept)
        down()
        raise
    return status()


def _keep_consoles(sdir: Path) -> Path:
    """Copy the hosts' console logs out of the state dir (which `down` removes) for the post-mortem."""
    kept = sdir.parent / f"{sdir.name}-failed-up"
    shutil.rmtree(kept, ignore_errors=True)
    if (sdir / "hosts").is_dir():
        shutil.copytree(sdir / "hosts", kept)
    return kept


def down() -> bool:
    """Tear the recorded lab down; returns False when there was nothing to tear down."""
    require_root()
    sdir = state_dir()
    state = LabState.load(sdir)
    if state is None:
        return False
    for host in state.hosts:
        if host.pid is not None:
            terminate(host.pid, host.name)
    for host in state.hosts:
        if host.loop_device and host.loop_backing:
            network.detach_loop(host.loop_device, host.loop_backing)
    if state.bridge_created:
        network.delete_bridge(state.bridge)
    _remove_leftover_copies(Path(state.rootfs))
    inventory = Path(state.inventory)
    if inventory.is_file() and inventory.read_text().startswith(HEADER):
        inventory.unlink()
    shutil.rmtree(sdir, ignore_errors=True)
    return True


def _remove_leftover_copies(rootfs: Path) -> None:
    """Drop ephemeral copies an nspawn killed by SIGKILL could not remove (`.#rootfs<random>`).

    Only when no nspawn at all still runs from this base: another lab (a test's) may share it.
    """
    marker = f"--directory={rootfs}"
    if any(is_ours(int(entry.name), marker) for entry in Path("/proc").iterdir() if entry.name.isdigit()):
        return
    for copy in rootfs.parent.glob(f".#{rootfs.name}*"):
        if copy.is_dir():
            log.info("removing leftover ephemeral copy %s", copy)
            shutil.rmtree(copy, ignore_errors=True)


def status() -> LabStatus:
    """The recorded lab and what is actually running; an empty status when no lab is recorded."""
    sdir = state_dir()
    state = LabState.load(sdir)
    if state is None:
        return LabStatus(sdir, "", False, None, "", ())
    hosts = []
    for host in state.hosts:
        running = host.pid is not None and is_ours(host.pid, host.name)
        ssh = running and lab_hosts.ssh_answers(state, host)
        hosts.append(HostStatus(host.name, host.ip, tuple(host.groups), host.pid, running, ssh))
    return LabStatus(
        state_dir=sdir,
        bridge=state.bridge,
        bridge_up=network.link_exists(state.bridge),
        loop_device=", ".join(state.loop_devices) or None,
        inventory=state.inventory,
        hosts=tuple(hosts),
    )
