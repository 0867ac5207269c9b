"""`molecule test` of every role scenario: real systemd in podman containers of the local Debian 12 image.

The image comes from the lab's own builder (kvoffload/lab/image.py: debootstrap, packages baked in,
`podman import`); no registry is pulled. Each scenario runs create, converge, idempotence, verify and
destroy (roles/<role>/molecule/<scenario>/molecule.yml: every scenario of every role, `default` and
named ones such as lmcache_server's `nvme`). Needs root, podman and runc; skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoffload.cli.args import DEFAULT_WHEEL_CACHE
from kvoffload.orchestrate.installs.wheelhouse import Wheels, build_wheels

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# (role, scenario) of every roles/<role>/molecule/<scenario>/molecule.yml.
SCENARIOS = sorted(
    (p.parents[2].name, p.parent.name) for p in (REPO / "roles").glob("*/molecule/*/molecule.yml")
)
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")

pytestmark = [
    pytest.mark.molecule,
    pytest.mark.skipif(os.geteuid() != 0, reason="molecule with podman here needs root"),
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("podman", "runc", "debootstrap", "systemd-nspawn")),
        reason="needs podman, runc, debootstrap, systemd-container (make deps installs them)",
    ),
]


@pytest.fixture(scope="module")
def image() -> str:
    from kvoffload.lab.image import ensure_podman_image

    return ensure_podman_image()


@pytest.fixture(scope="module")
def wheels() -> Wheels:
    """What the orchestrator ships to offline hosts, built by its own code into the wheel cache that
    `run` uses (so the lab tests of the same run find it ready): this package's wheel, and the archive
    of its dependencies and uv for the hosts' Python (one transfer into a container, not one per wheel),
    and Caddy's wheel."""
    return build_wheels(DEFAULT_WHEEL_CACHE, offline=True)


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[str]:
    """A blank 320 MB loop device for the scenarios of the nvme tier (nvme_storage, lmcache_server's
    nvme), passed into their container; the others ignore it."""
    image = tmp_path / "nvme.img"
    with image.open("wb") as handle:
        handle.truncate(320 * 1024 * 1024)
    device = subprocess.run(
        ["losetup", "--find", "--show", "--partscan", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        yield device
    finally:
        with Path("/proc/self/mounts").open() as mounts:
            for target in [line.split()[1] for line in mounts if line.split()[0] == device]:
                subprocess.run(["umount", target], check=False, timeout=60)
        subprocess.run(["losetup", "--detach", device], check=False, timeout=60)


@pytest.fixture
def keep_ip_forward_off() -> Iterator[None]:
    # Podman turns forwarding on when it sets up networking; the lab keeps it off (LAB.md).
    try:
        yield
    finally:
        if IP_FORWARD.exists() and IP_FORWARD.read_text().strip() != "0":
            IP_FORWARD.write_text("0\n")


def test_every_role_with_services_has_a_scenario() -> None:
    roles = {role for role, _ in SCENARIOS}
    expected = {"caddy", "node_exporter", "nvme_storage", "gpu_driver", "vllm", "replay", "lmcache_server"}
    assert expected <= roles, SCENARIOS
    assert ("lmcache_server", "nvme") in SCENARIOS, SCENARIOS


@pytest.mark.timeout(1800)  # hang guards, not speed checks: make test runs the lanes at once
@pytest.mark.parametrize(("role", "scenario"), SCENARIOS, ids=[f"{r}-{s}" for r, s in SCENARIOS])
def test_molecule_scenario(
    role: str,
    scenario: str,
    image: str,
    wheels: Wheels,
    loop_device: str,
    keep_ip_forward_off: None,
    tmp_path: Path,
) -> None:
    containers_conf = tmp_path / "containers.conf"
    containers_conf.write_text('[engine]\nruntime = "runc"\n')
    env = dict(
        os.environ,
        PATH=f"{BIN}:{os.environ.get('PATH', '')}",
        CONTAINERS_CONF=str(containers_conf),
        KVOFFLOAD_MOLECULE_WHEELHOUSE=str(wheels.wheelhouse),
        KVOFFLOAD_MOLECULE_PACKAGE_WHEEL=str(wheels.package),
        KVOFFLOAD_MOLECULE_UV_WHEEL=wheels.uv or "",
        KVOFFLOAD_MOLECULE_CADDY_WHEEL=str(wheels.caddy or ""),
        KVOFFLOAD_MOLECULE_LOOP=loop_device,
        KVOFFLOAD_MOLECULE_RESULTS=str(tmp_path / "results"),
        MOLECULE_IMAGE=image,
        NO_COLOR="1",
    )
    result = subprocess.run(
        [str(BIN / "molecule"), "test", "--scenario-name", scenario],
        cwd=REPO / "roles" / role,
        env=env,
        capture_output=True,
        text=True,
        timeout=1740,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
