"""Flags that several `kvoffload-lab` commands take with one meaning: the lab, its results, the wheels.

CLI layer only: argparse in, nothing else; each command module adds its own flags after these. The one
module of this package that the command modules share: a command never imports another's code.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from kvoffload.errors import UserError

# Where `run`, `plan --emit-extravars`, `doctor` and `demo` build the wheelhouse shipped to the hosts.
DEFAULT_WHEEL_CACHE = Path.home() / ".cache" / "kvoffload-lab" / "wheels"


def add_lab_arguments(p: argparse.ArgumentParser, *, results: bool = True) -> None:
    """INVENTORY, --campaign and (unless `results` is False) --results, as every lab command takes them."""
    p.add_argument("inventory", type=Path, help="Ansible YAML inventory (file, or folder holding hosts.yml)")
    p.add_argument("--campaign", type=Path, help="campaign YAML (default: all.vars.kvoffload_campaign)")
    if results:
        p.add_argument(
            "--results", type=Path, default=Path("results"), help="results base folder (default ./results)"
        )


def hosts_python_flag(value: str | None) -> str | None:
    """The `--hosts-python` value (of run, doctor and plan --emit-extravars), checked; None when not
    given: the hosts are then asked before the wheelhouse is built (kvoffload/orchestrate/host_python.py)."""
    from kvoffload.orchestrate.wheelhouse import DEFAULT_HOSTS_PYTHON  # lazily: the CLI starts light

    if value is None:
        return None
    if not re.fullmatch(r"3\.[0-9]+\.[0-9]+", value):
        raise UserError(
            f"--hosts-python {value!r}: give the hosts' python3 version as X.Y.Z, e.g. {DEFAULT_HOSTS_PYTHON}"
        )
    return value
