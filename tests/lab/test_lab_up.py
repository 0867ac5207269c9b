"""The virtual lab's life cycle on this machine: up, reach every host, down leaves nothing behind.

Runs the real `kvoffload-lab lab up/status/down` as subprocesses with their own state dir, bridge,
subnet and host names, so it does not collide with a demo lab that may be up at the same time. The
base image is shared through the normal cache (built on first use, about a minute).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoffload.config import load_inventory
from tests.support.lab import free_lab_names, lab_marks

pytestmark = lab_marks(600)

NAMES = free_lab_names("t", 9)
BRIDGE, PREFIX, SUBNET = NAMES.bridge, NAMES.prefix, NAMES.subnet


def _cli(env: dict[str, str], *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvoffload.cli.main", "lab", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _ssh(key: Path, address: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
         f"root@{address}", command],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


def _nspawn_pids(machine_prefix: str) -> list[int]:
    """Live systemd-nspawn processes whose --machine name is `machine_prefix` and a host number."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"systemd-nspawn") and b"--machine" in argv:
            name = argv[argv.index(b"--machine") + 1].decode()
            if name.startswith(machine_prefix) and name[len(machine_prefix) :].isdigit():
                pids.append(int(entry.name))
    return pids


@pytest.fixture
def lab_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "KVOFFLOAD_LAB_STATE": str(tmp_path / "state")}
    try:
        yield env
    finally:
        # Whatever the test did, leave nothing running.
        _cli(env, "down", timeout=120)


def test_lab_up_reach_and_down(lab_env: dict[str, str], tmp_path: Path) -> None:
    inventory_path = tmp_path / "hosts.yml"
    up = _cli(
        lab_env, "up", "--hosts", "3", "--bridge", BRIDGE, "--subnet", SUBNET, "--prefix", PREFIX,
        "--inventory", str(inventory_path),
    )  # fmt: skip
    assert up.returncode == 0, up.stderr

    inventory = load_inventory(inventory_path)
    assert [h.name for h in inventory.hosts] == [NAMES.host(1), NAMES.host(2), NAMES.host(3)]
    assert [h.name for h in inventory.group("client")] == [NAMES.host(1)]
    # One node runs every service of a run; the third host is a spare node in no group.
    for group in ("vllm", "lmcache", "lb"):
        assert [h.name for h in inventory.group(group)] == [NAMES.host(2)], group
    assert inventory.host(NAMES.host(3)).groups == frozenset()
    lmcache = inventory.host(NAMES.host(2))
    assert len(lmcache.nvme_devices) == 1
    loop_device = lmcache.nvme_devices[0].device
    assert loop_device.startswith("/dev/loop")
    key = Path(str(inventory.all_vars["ansible_ssh_private_key_file"]))

    for host in inventory.hosts:
        probe = _ssh(
            key, host.address,
            "hostname; ps -p 1 -o comm=; systemctl is-system-running --wait; "
            f"test -b {loop_device} && echo has-loop || echo no-loop",
        )  # fmt: skip
        assert probe.returncode == 0, probe.stderr
        name, pid1, state, loop = probe.stdout.split()
        failed = _ssh(
            key, host.address, "systemctl --failed --no-legend --plain; journalctl -p err -b --no-pager"
        )
        assert (name, pid1, state) == (host.name, "systemd", "running"), failed.stdout
        assert loop == ("has-loop" if host.name == NAMES.host(2) else "no-loop")

    # The loop device inside the lmcache host is a real block device: it can be formatted there.
    mkfs = _ssh(key, lmcache.address, f"mkfs.xfs -q -f {loop_device} && blkid -o value -s TYPE {loop_device}")
    assert mkfs.stdout.strip() == "xfs", mkfs.stderr

    status = _cli(lab_env, "status", timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    pids = sorted(_nspawn_pids(PREFIX))
    assert len(pids) == 3

    # `lab up` on a healthy lab of the same size reuses it and writes its inventory again.
    inventory_path.unlink()
    again_up = _cli(
        lab_env, "up", "--hosts", "3", "--bridge", BRIDGE, "--subnet", SUBNET, "--prefix", PREFIX,
        "--inventory", str(inventory_path),
    )  # fmt: skip
    assert again_up.returncode == 0, again_up.stderr
    assert sorted(_nspawn_pids(PREFIX)) == pids
    assert load_inventory(inventory_path).host(NAMES.host(2)).nvme_devices[0].device == loop_device
    backing = Path(lab_env["KVOFFLOAD_LAB_STATE"]) / "nvme0.img"

    down = _cli(lab_env, "down", timeout=120)
    assert down.returncode == 0, down.stderr
    assert "lab torn down" in down.stdout
    assert _nspawn_pids(PREFIX) == []
    assert subprocess.run(["ip", "link", "show", "dev", BRIDGE], capture_output=True).returncode != 0
    attached = json.loads(
        subprocess.run(["losetup", "--json", "--list"], capture_output=True, text=True).stdout or "{}"
    )
    assert [
        d for d in attached.get("loopdevices", []) if d.get("back-file", "").startswith(str(backing))
    ] == []
    assert not inventory_path.exists()
    assert not Path(lab_env["KVOFFLOAD_LAB_STATE"]).exists()

    again = _cli(lab_env, "down", timeout=60)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert _cli(lab_env, "status", timeout=60).returncode == 1
