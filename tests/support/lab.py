"""What the virtual-lab tests share: their pytest marks and running the CLI as a subprocess."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATASET = ROOT / "data" / "tau2-bench" / "gpt-4.1_airline_default_gpt-4.1_1trials.json"


def small_campaign(name: str, tiers: list[str], **over: Any) -> dict[str, Any]:
    """A sim campaign for lab tests: 8 airline users x 5 rounds at concurrency 4, 16K tokens of GPU KV
    per replica (64 MiB on the tiny profile); `over` replaces or adds keys."""
    return {
        "name": name,
        "model": "tiny-llama",
        "gpu_vendor": "nvidia",
        "engine": "sim",
        "sim_profile": "tiny",
        "dataset": {"code": "tau2-bench-v1", "path": str(DATASET)},
        "tiers": tiers,
        "concurrency": [4],
        "num_rounds": [5],
        "isl": 16384,
        "osl": 16,
        "max_sessions": 8,
        "kv_cache_memory_bytes": 64 * 1024 * 1024,
        "extra_engine_args": ["--max-model-len", "16384"],
        **over,
    }


@dataclass(frozen=True)
class LabNames:
    """The network names of one test's lab: its bridge, host-name prefix and /24."""

    bridge: str
    prefix: str
    subnet: str

    def host(self, index: int) -> str:
        """The name of lab host `index` (1-based), as `lab up` names it."""
        return f"{self.prefix}{index}"

    def up_args(self) -> tuple[str, ...]:
        """The `lab up` flags that give the lab these names."""
        return ("--bridge", self.bridge, "--prefix", self.prefix, "--subnet", self.subnet)


def _subnet_in_use(subnet: str) -> bool:
    net = ipaddress.IPv4Network(subnet)
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        fields = line.split()
        if "inet" in fields and ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).ip in net:
            return True
    return False


def free_lab_names(stem: str, octet: int) -> LabNames:
    """Names for a test's lab that nothing on this machine uses yet: bridge `kvlab<stem>0`, hosts
    `kv<stem>1..`, subnet 10.213.<octet>.0/24 when they are free (each lab module has its own stem and
    octet, so the lanes never meet); otherwise the first free alternative (bridge `kvlab<stem><i>`, hosts
    `kv<stem><letter>1..`, octet + 20*i). A lab left behind by a run that was killed (or one still
    running from another checkout on this machine) then costs nothing but its own resources."""
    for i in range(10):
        names = LabNames(
            bridge=f"kvlab{stem}{i}",
            prefix=f"kv{stem}" + ("" if i == 0 else "abcdefghij"[i]),
            subnet=f"10.213.{octet + 20 * i}.0/24",
        )
        taken = (
            Path("/sys/class/net", names.bridge).exists()
            or Path("/sys/class/net", f"vb-{names.host(1)}").exists()
            or _subnet_in_use(names.subnet)
        )
        if not taken:
            return names
    raise RuntimeError(f"no free lab names for stem {stem!r}: remove stale kvlab{stem}* links")


def lab_marks(timeout_s: int) -> list[pytest.MarkDecorator]:
    """Marks of a lab test: `lab`, a timeout, and skips where the machine cannot run a lab."""
    return [
        pytest.mark.lab,
        pytest.mark.timeout(timeout_s),
        pytest.mark.skipif(
            os.geteuid() != 0, reason="the virtual lab needs root (nspawn, bridge, loop device)"
        ),
        pytest.mark.skipif(
            shutil.which("systemd-nspawn") is None or shutil.which("debootstrap") is None,
            reason="systemd-nspawn or debootstrap missing (apt-get install systemd-container debootstrap)",
        ),
    ]


def kvlab(env: dict[str, str], *args: str, timeout: float = 3000) -> subprocess.CompletedProcess[str]:
    """`kvoffload-lab ARGS` from the repository root, output captured, never raising on failure."""
    return subprocess.run(
        [sys.executable, "-m", "kvoffload.cli.main", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
