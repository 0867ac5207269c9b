"""The wheelhouse the controller ships to lab hosts, which have no route to a package index.

It holds this package's wheel and the wheels of its base dependencies (never the `controller` extra).
Dependencies are fetched once per dependency set and cached; this package's wheel is rebuilt on every
run, reproducibly (fixed SOURCE_DATE_EPOCH), and replaced only when its bytes change, so that
re-provisioning an unchanged lab copies nothing and changes nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from kvoffload.errors import UserError
from kvoffload.playbook import ansible_dir

log = logging.getLogger(__name__)
DIST = "kvoffload-lab"
REPRODUCIBLE_EPOCH = "315532800"  # 1980-01-01, the earliest time a zip file can hold


def base_requirements() -> list[str]:
    """This package's base dependencies (markers kept), read from the pyproject.toml being shipped."""
    with (ansible_dir() / "pyproject.toml").open("rb") as fh:
        project = tomllib.load(fh)["project"]
    return sorted(str(r) for r in project["dependencies"])


def _pip(args: list[str], what: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise UserError(f"building the wheelhouse: {what} failed: " + " | ".join(tail))


def build_wheelhouse(cache: Path) -> Path:
    """`cache/wheelhouse` with this package and its base dependencies as wheels; returns the folder."""
    reqs = base_requirements()
    key = hashlib.sha256("\n".join([sys.version.split()[0], *reqs]).encode()).hexdigest()[:12]
    deps = cache / f"deps-{key}"
    if not (deps / ".complete").exists():
        log.info("fetching the wheels of %d base dependencies into %s", len(reqs), deps)
        deps.mkdir(parents=True, exist_ok=True)
        _pip(["wheel", "--quiet", "--wheel-dir", str(deps), *reqs], "pip wheel of the base dependencies")
        (deps / ".complete").write_text("\n".join(reqs) + "\n")
    house = cache / "wheelhouse"
    house.mkdir(parents=True, exist_ok=True)
    for wheel in deps.glob("*.whl"):
        target = house / wheel.name
        if not target.exists():
            shutil.copy2(wheel, target)
    with tempfile.TemporaryDirectory() as tmp:
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
                str(ansible_dir()),
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            raise UserError(f"building the {DIST} wheel failed: {proc.stderr.strip()[-400:]}")
        for built in Path(tmp).glob("kvoffload_lab-*.whl"):
            target = house / built.name
            if not target.exists() or target.read_bytes() != built.read_bytes():
                for old in house.glob("kvoffload_lab-*.whl"):
                    old.unlink()
                shutil.copyfile(built, target)
                os.utime(target, (int(REPRODUCIBLE_EPOCH), int(REPRODUCIBLE_EPOCH)))
    return house
