#!/usr/bin/python3
"""Ansible module (read-only): may this block device become the kvoffload L2 file system?

Of the kvoffload.lab collection, called by its nvme_storage role. It inspects one listed device
(/proc/partitions, /proc/self/mountinfo, /proc/swaps, blkid, and lsblk and /sys/class/block/*/holders
where sysfs shows block devices; containers may hide them) and answers ok/refused with the exact
reason, plus the device's facts (model, firmware, size, NUMA node, file system). It never writes to a device:
formatting and mounting are separate tasks that run only when every listed device passed this check.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: kvoffload_blockdev
short_description: Decide whether a block device may be formatted and mounted for the L2 cache
version_added: "0.1.0"
author: kvoffload-lab
description:
  - Refuses a device that is not a block device, backs a protected mount (such as /), is mounted
    anywhere else than the wanted mount point, is mounted at the wanted mount point with a file system
    that is not ours, is (or has a partition that is) active swap, has holders (device-mapper, LVM, md
    or another stacked device on it or on a partition), holds partitions, or holds a file system that
    is not ours; wipe allows only the last two (never mounted, swap, held or protected devices).
  - Only reads; the nvme_storage role formats and mounts according to the C(action) it returns.
options:
  device: {type: path, required: true, description: Device path as listed.}
  mount: {type: path, required: true, description: Wanted mount point.}
  fstype: {type: str, required: true, choices: [xfs, ext4], description: Wanted file system.}
  label: {type: str, required: true, description: Label that marks a file system as ours.}
  wipe: {type: bool, default: false, description: Allow destroying partitions or a foreign file system.}
  protected_mounts: {type: list, elements: path, default: ["/"], description: Mounts never touched.}
"""

EXAMPLES = r"""
- name: Check that the L2 device may be used
  kvoffload.lab.kvoffload_blockdev:
    device: /dev/nvme1n1
    mount: /mnt/kvoffload-l2
    fstype: xfs
    label: kvoffload-l2
  register: l2_device

- name: Refuse it before touching anything
  ansible.builtin.assert:
    that: l2_device.ok
    fail_msg: "{{ l2_device.reason }}"

- name: Allow wiping a foreign file system, never /boot or /
  kvoffload.lab.kvoffload_blockdev:
    device: /dev/disk/by-id/nvme-Samsung_SSD_990_PRO_2TB_S7KHNJ0W123456
    mount: /mnt/kvoffload-l2
    fstype: ext4
    label: kvoffload-l2
    wipe: true
    protected_mounts: [/, /boot]
  register: l2_device
"""

RETURN = r"""
ok:
  description: Whether the device may be used.
  type: bool
  returned: always
reason:
  description: Why it was refused, naming the device (empty when ok).
  type: str
  returned: always
action:
  description: "format, mount (ours, not mounted) or none (ours and mounted, or refused)."
  type: str
  returned: always
facts:
  description: >-
    What was found: device, path, model, firmware, size_bytes, numa_node, fstype, label,
    partition_table, partitions, mountpoints, holders, swap.
  type: dict
  returned: always
"""


# Kernel views the checks read (module constants, so a unit test can point them at a fake tree).
SYS_CLASS_BLOCK = "/sys/class/block"
PROC_SWAPS = "/proc/swaps"


def _partitions() -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
    """Kernel block devices from /proc/partitions: name -> (major, minor), and name -> size in bytes."""
    numbers, sizes = {}, {}
    with Path("/proc/partitions").open() as handle:
        for line in handle:
            parts = line.split()
            if len(parts) == 4 and parts[0].isdigit():
                numbers[parts[3]] = (int(parts[0]), int(parts[1]))
                sizes[parts[3]] = int(parts[2]) * 1024
    return numbers, sizes


def _children(name: str, table: dict[str, tuple[int, int]]) -> list[str]:
    """Partitions of `name` by the kernel's naming rule (sda -> sda1, nvme0n1 -> nvme0n1p1,
    loop0 -> loop0p1)."""
    prefix = name + "p" if name[-1].isdigit() else name
    return sorted(n for n in table if n.startswith(prefix) and n[len(prefix) :].isdigit())


def _mounts() -> list[tuple[tuple[int, int], str]]:
    """(major, minor) of the source and the mount point of every mount, from /proc/self/mountinfo."""
    result = []
    with Path("/proc/self/mountinfo").open() as handle:
        for line in handle:
            parts = line.split()
            major, minor = parts[2].split(":")
            result.append(((int(major), int(minor)), parts[4].replace("\\040", " ")))
    return result


def _backing(module: AnsibleModule, source: str) -> set[str]:
    """Devices under a mount's source (through LVM, dm-crypt, md), by lsblk where sysfs allows it."""
    rc, out, _err = module.run_command(
        ["lsblk", "--inverse", "--list", "--noheadings", "--paths", "--output", "NAME", source]
    )
    return {os.path.realpath(line.strip()) for line in out.splitlines() if line.strip()} if rc == 0 else set()


def _probe(module: AnsibleModule, device: str) -> dict[str, str]:
    """Low-level blkid probe of the device itself (does not depend on a udev database)."""
    rc, out, err = module.run_command(["blkid", "--probe", "--output", "export", device])
    if rc not in (0, 2):  # 2: nothing recognised
        module.fail_json(msg=f"blkid --probe {device} failed: {err.strip()}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _swaps() -> list[tuple[tuple[int, int], str]]:
    """(major, minor) and path of every active swap area on a block device, from /proc/swaps."""
    result = []
    try:
        lines = Path(PROC_SWAPS).read_text().splitlines()[1:]  # the first line is the column header
    except OSError:
        return result
    for line in lines:
        if not line.split():
            continue
        path = line.split()[0].replace("\\040", " ")
        try:
            st = Path(path).stat()
        except OSError:
            continue
        if stat.S_ISBLK(st.st_mode):  # swap files live on a mounted file system: the mount check sees it
            result.append(((os.major(st.st_rdev), os.minor(st.st_rdev)), path))
    return result


def _holders(name: str) -> list[str]:
    """Kernel names of the devices stacked on `name` (dm-0, md0, ...), with their device-mapper name."""
    try:
        held = sorted(p.name for p in Path(SYS_CLASS_BLOCK, name, "holders").iterdir())
    except OSError:  # no sysfs view of block devices (some containers): nothing to tell
        return []
    out = []
    for holder in held:
        try:
            out.append(f"{holder} ({Path(SYS_CLASS_BLOCK, holder, 'dm', 'name').read_text().strip()})")
        except OSError:
            out.append(holder)
    return out


def _sysfs(name: str, attr: str) -> str:
    try:
        return Path(SYS_CLASS_BLOCK, name, "device", attr).read_text().strip()
    except OSError:
        return "unknown"


def _numa_node(name: str) -> int | None:
    """The NUMA node of the device's PCI controller (a namespace's `device` is its NVMe controller, whose
    own `device` is the PCI function); None where sysfs does not say (-1, containers, virtual disks)."""
    for attr in ("numa_node", "device/numa_node"):
        try:
            node = int(_sysfs(name, attr))
        except ValueError:  # "unknown": not there
            continue
        return node if node >= 0 else None
    return None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "device": {"type": "path", "required": True},
            "mount": {"type": "path", "required": True},
            "fstype": {"type": "str", "required": True, "choices": ["xfs", "ext4"]},
            "label": {"type": "str", "required": True},
            "wipe": {"type": "bool", "default": False},
            "protected_mounts": {"type": "list", "elements": "path", "default": ["/"]},
        },
        supports_check_mode=True,
    )
    p = module.params
    device = os.path.realpath(p["device"])
    facts = {
        "device": p["device"],
        "path": device,
        "model": "unknown",
        "firmware": "unknown",
        "size_bytes": None,
        "numa_node": None,
        "fstype": None,
        "label": None,
        "partition_table": None,
        "partitions": [],
        "mountpoints": [],
        "holders": [],
        "swap": [],
    }

    def refuse(reason: str) -> None:
        module.exit_json(
            changed=False, ok=False, reason=f"{p['device']}: {reason}", action="none", facts=facts
        )

    try:
        st = Path(device).stat()
    except OSError as exc:
        refuse(f"does not exist ({exc.strerror})")
    if not stat.S_ISBLK(st.st_mode):
        refuse("is not a block device")
    number = (os.major(st.st_rdev), os.minor(st.st_rdev))
    table, sizes = _partitions()
    name = next((n for n, num in table.items() if num == number), Path(device).name)
    children = _children(name, table)
    numbers = {number} | {table[c] for c in children}
    mounts = _mounts()
    facts.update(
        model=_sysfs(name, "model"),
        firmware=_sysfs(name, "firmware_rev"),
        size_bytes=sizes.get(name),
        numa_node=_numa_node(name),
        partitions=children,
        mountpoints=sorted({target for num, target in mounts if num in numbers}),
    )

    for target in p["protected_mounts"]:
        sources = [num for num, mounted in mounts if mounted == target]
        if not sources:
            continue
        source_number = sources[-1]  # the last mount over a path is the one in effect
        backing = {device} if source_number in numbers else set()
        source_name = next((n for n, num in table.items() if num == source_number), None)
        if source_name:
            backing |= _backing(module, "/dev/" + source_name) & ({device} | {"/dev/" + c for c in children})
        if backing:
            refuse(f"backs the protected mount {target}; it is never formatted")

    other_mounts = [m for m in facts["mountpoints"] if m != p["mount"]]
    if other_mounts:
        refuse(
            f"is mounted at {', '.join(other_mounts)}; unmount it first "
            "(wipe never applies to mounted devices)"
        )

    facts["swap"] = sorted(path for num, path in _swaps() if num in numbers)
    if facts["swap"]:
        refuse(
            f"is active swap ({', '.join(facts['swap'])}); swapoff it and drop it from /etc/fstab first "
            "(wipe never applies to swap)"
        )
    held = {n: _holders(n) for n in [name, *children]}
    facts["holders"] = sorted(h for hs in held.values() for h in hs)
    if facts["holders"]:
        where = "; ".join(f"/dev/{n} by {', '.join(hs)}" for n, hs in held.items() if hs)
        refuse(
            f"is in use by a stacked device ({where}: device-mapper, LVM, md or the like); remove that "
            "first (wipe never applies to held devices)"
        )

    # Only now read the device's first blocks: protected, mounted, swap and held devices are refused unread.
    probe = _probe(module, device)
    facts.update(fstype=probe.get("TYPE"), label=probe.get("LABEL"), partition_table=probe.get("PTTYPE"))

    ours = facts["fstype"] == p["fstype"] and facts["label"] == p["label"] and not children
    if ours:
        action = "none" if p["mount"] in facts["mountpoints"] else "mount"
        module.exit_json(changed=False, ok=True, reason="", action=action, facts=facts)
    if facts["mountpoints"]:  # at the wanted mount point (others were refused above), but not ours
        what = (
            f"a {facts['fstype']} file system (label {facts['label']!r})"
            if facts["fstype"]
            else "a partition"
        )
        refuse(
            f"is mounted at {p['mount']} with {what} that is not ours; unmount it first "
            "(wipe never applies to mounted devices)"
        )
    if (children or facts["partition_table"]) and not p["wipe"]:
        names = ", ".join("/dev/" + c for c in children) or "none listed yet"
        refuse(
            f"holds partitions ({names}; table {facts['partition_table']}); "
            "set wipe: true for this device to destroy them"
        )
    if facts["fstype"] and not p["wipe"]:
        refuse(
            f"holds a {facts['fstype']} file system (label {facts['label']!r}) that is not ours; "
            "set wipe: true for this device to destroy it"
        )
    module.exit_json(changed=False, ok=True, reason="", action="format", facts=facts)


if __name__ == "__main__":
    main()
