"""nvme_storage refuses unsafe devices and leaves them untouched; formats and mounts a clean one.

Runs the real role with ansible-playbook against this machine (connection local) on loop devices the
test creates; needs root and losetup. Every case lists exactly one device; refusals must name the
reason and leave the device byte-for-byte unchanged (sha256 before and after).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ansible import ansible_playbook

REPO = Path(__file__).resolve().parents[2]
SIZE = 320 * 1024 * 1024  # xfs needs 300 MB

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="loop devices and mounts need root"),
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("losetup", "mkfs.xfs", "mkfs.ext4", "parted", "wipefs")),
        reason="needs losetup, xfsprogs, e2fsprogs, parted (make deps installs them)",
    ),
    pytest.mark.timeout(300),
]


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)


@pytest.fixture
def loopdev(tmp_path: Path) -> Iterator[str]:
    image = tmp_path / "disk.img"
    with image.open("wb") as handle:
        handle.truncate(SIZE)
    device = run("losetup", "--find", "--show", "--partscan", str(image)).stdout.strip()
    try:
        yield device
    finally:
        with Path("/proc/self/mounts").open() as mounts:
            targets = [line.split()[1] for line in mounts if line.split()[0] == device]
        for target in reversed(targets):
            subprocess.run(["umount", target], check=False, timeout=60)
        # Drop partitions first: the kernel would keep stale ones for the next user of this loop number.
        subprocess.run(["partx", "--delete", device], check=False, capture_output=True, timeout=60)
        subprocess.run(["losetup", "--detach", device], check=False, timeout=60)


def digest(device: str, skip: tuple[int, int] = (0, 0)) -> str:
    """sha256 of the device's bytes, leaving out the byte range `skip` (start, end)."""
    sha = hashlib.sha256()
    with Path(device).open("rb") as handle:
        offset = 0
        while chunk := handle.read(1 << 16):
            lo, hi = max(skip[0] - offset, 0), min(skip[1] - offset, len(chunk))
            sha.update(chunk[:lo] + chunk[hi:] if lo < hi else chunk)
            offset += len(chunk)
    return sha.hexdigest()


def device_mapper_works() -> bool:
    return shutil.which("dmsetup") is not None and (
        subprocess.run(["dmsetup", "version"], capture_output=True, timeout=60, check=False).returncode == 0
    )


def converge(
    tmp_path: Path, devices: list[dict[str, object]], **extra_vars: object
) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "play.yml"
    play_vars: dict[str, object] = {
        "nvme_storage_devices": devices,
        "nvme_storage_persist": False,
        "ansible_python_interpreter": sys.executable,
    }
    play_vars.update(extra_vars)
    play = [
        {
            "name": "nvme_storage on this machine",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": True,
            "roles": [{"role": "kvoffload"}, {"role": "nvme_storage"}],
            "vars": play_vars,
        }
    ]
    playbook.write_text(json.dumps(play))
    return ansible_playbook("-i", "localhost,", str(playbook))


def assert_refused(result: subprocess.CompletedProcess[str], reason: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "nvme_storage refused (nothing was changed)" in result.stdout, result.stdout[-3000:]
    assert reason in result.stdout, result.stdout[-3000:]


def test_unlisted_device_is_never_touched(tmp_path: Path, loopdev: str) -> None:
    before = digest(loopdev)
    result = converge(tmp_path, [])
    assert result.returncode == 0, result.stdout[-3000:]
    assert digest(loopdev) == before


def test_device_with_a_file_system_is_refused(tmp_path: Path, loopdev: str) -> None:
    run("mkfs.ext4", "-q", "-L", "data", loopdev)
    before = digest(loopdev)
    result = converge(tmp_path, [{"device": loopdev, "mount": str(tmp_path / "mnt")}])
    assert_refused(result, f"{loopdev}: holds a ext4 file system (label 'data') that is not ours")
    assert digest(loopdev) == before


def test_device_with_partitions_is_refused(tmp_path: Path, loopdev: str) -> None:
    run("parted", "-s", loopdev, "mklabel", "gpt", "mkpart", "data", "1MiB", "100MiB")
    run("partx", "--update", loopdev)
    before = digest(loopdev)
    result = converge(tmp_path, [{"device": loopdev, "mount": str(tmp_path / "mnt")}])
    assert_refused(result, f"{loopdev}: holds partitions ({loopdev}p1; table gpt)")
    assert digest(loopdev) == before


def test_mounted_device_is_refused_even_with_wipe(tmp_path: Path, loopdev: str) -> None:
    run("mkfs.ext4", "-q", loopdev)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run("mount", "-o", "ro", loopdev, str(elsewhere))
    try:
        result = converge(tmp_path, [{"device": loopdev, "mount": str(tmp_path / "mnt"), "wipe": True}])
        assert_refused(result, f"{loopdev}: is mounted at {elsewhere}")
    finally:
        run("umount", str(elsewhere))
    before = digest(loopdev)  # read-only mount: nothing wrote to it; compare after unmounting
    result = converge(tmp_path, [{"device": loopdev, "mount": str(tmp_path / "mnt")}])
    assert_refused(result, "holds a ext4 file system")
    assert digest(loopdev) == before


def test_device_mounted_at_its_mount_point_with_a_foreign_fs_is_refused_even_with_wipe(
    tmp_path: Path, loopdev: str
) -> None:
    # The wanted mount point is busy with someone else's file system: wipe must not format under it.
    run("mkfs.ext4", "-q", "-L", "data", loopdev)
    before = digest(loopdev)
    mount = tmp_path / "l2"
    mount.mkdir()
    run("mount", "-o", "ro,noload", loopdev, str(mount))
    try:
        result = converge(tmp_path, [{"device": loopdev, "mount": str(mount), "fstype": "xfs", "wipe": True}])
        assert_refused(
            result,
            f"{loopdev}: is mounted at {mount} with a ext4 file system (label 'data') that is not ours; "
            "unmount it first",
        )
    finally:
        run("umount", str(mount))
    assert digest(loopdev) == before


def test_active_swap_is_refused_even_with_wipe(tmp_path: Path, loopdev: str) -> None:
    # A 64 KiB swap area: the kernel may swap pages into its slots, so those bytes are left out of the
    # digest; the header (first page) and everything after the area must stay as they are.
    run("mkswap", loopdev, "64")
    run("swapon", loopdev)
    try:
        before = digest(loopdev, skip=(4096, 65536))
        result = converge(tmp_path, [{"device": loopdev, "mount": str(tmp_path / "mnt"), "wipe": True}])
        assert_refused(result, f"{loopdev}: is active swap ({loopdev}); swapoff it")
        assert digest(loopdev, skip=(4096, 65536)) == before
    finally:
        subprocess.run(["swapoff", loopdev], check=False, timeout=60)


@pytest.mark.skipif(not device_mapper_works(), reason="device-mapper is not available in this kernel")
def test_device_with_a_device_mapper_holder_is_refused_even_with_wipe(tmp_path: Path, loopdev: str) -> None:
    # A dm-linear over the whole loop device, as LVM or dm-crypt would put on an NVMe drive.
    run("mkfs.ext4", "-q", "-L", "data", loopdev)
    name = f"kvoffload-test-{os.getpid()}"
    run("dmsetup", "create", name, "--table", f"0 {SIZE // 512} linear {loopdev} 0")
    try:
        before = digest(loopdev)
        result = converge(tmp_path, [{"device": loopdev, "mount": str(tmp_path / "mnt"), "wipe": True}])
        assert_refused(result, f"{loopdev}: is in use by a stacked device ({loopdev} by dm-")
        assert f"({name})" in result.stdout, result.stdout[-3000:]
        assert digest(loopdev) == before
    finally:
        subprocess.run(["dmsetup", "remove", name], check=False, timeout=60)


def test_device_backing_root_is_refused(tmp_path: Path, loopdev: str) -> None:
    # Protect a mount of the loop device as if it were "/": the same rule refuses the real root disk.
    target = tmp_path / "sysroot"
    target.mkdir()
    run("mkfs.xfs", "-q", "-L", "kvoffload-l2", loopdev)
    run("mount", "-o", "ro", loopdev, str(target))
    try:
        devices: list[dict[str, object]] = [{"device": loopdev, "mount": str(target), "wipe": True}]
        result = converge(tmp_path, devices, nvme_storage_protected_mounts=["/", str(target)])
        assert_refused(result, f"{loopdev}: backs the protected mount {target}")
    finally:
        run("umount", str(target))


def test_real_root_disk_is_refused(tmp_path: Path) -> None:
    source = run("findmnt", "--noheadings", "--output", "SOURCE", "/").stdout.strip()
    if not source.startswith("/dev/"):
        pytest.skip(f"/ is not on a block device here ({source})")
    disks = run("lsblk", "--noheadings", "--paths", "--inverse", "--list", "--output", "NAME", source).stdout
    disk = disks.split()[-1]
    result = converge(tmp_path, [{"device": disk, "mount": str(tmp_path / "mnt"), "wipe": True}])
    assert result.returncode != 0
    assert "nvme_storage refused" in result.stdout
    assert "backs the protected mount /" in result.stdout or "is mounted at" in result.stdout


def test_clean_device_is_formatted_mounted_and_recorded_idempotently(tmp_path: Path, loopdev: str) -> None:
    mount = tmp_path / "l2"
    devices: list[dict[str, object]] = [{"device": loopdev, "mount": str(mount), "fstype": "xfs"}]
    fact_file = Path("/etc/ansible/facts.d/kvoffload_nvme.fact")
    fact_existed = fact_file.exists()
    try:
        first = converge(tmp_path, devices)
        assert first.returncode == 0, first.stdout[-3000:]
        assert run("findmnt", "--noheadings", "--output", "SOURCE,FSTYPE", str(mount)).stdout.split() == [
            loopdev,
            "xfs",
        ]
        assert (
            run("blkid", "--match-tag", "LABEL", "--output", "value", loopdev).stdout.strip()
            == "kvoffload-l2"
        )
        second = converge(tmp_path, devices)
        assert second.returncode == 0, second.stdout[-3000:]
        assert "changed=0" in second.stdout, second.stdout[-3000:]
        fact = json.loads(fact_file.read_text())
        assert fact["devices"][0]["device"] == loopdev
        assert fact["devices"][0]["fstype"] == "xfs"
    finally:
        subprocess.run(["umount", str(mount)], check=False, timeout=60)
        if not fact_existed:  # the role ran on this machine: leave no fact behind
            fact_file.unlink(missing_ok=True)
