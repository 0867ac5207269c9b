"""Flags that several `kvoffload-lab` commands take with one meaning: the lab and its results.

CLI layer only: argparse in, nothing else; each command module adds its own flags after these.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_lab_arguments(p: argparse.ArgumentParser, *, results: bool = True) -> None:
    """INVENTORY, --campaign and (unless `results` is False) --results, as every lab command takes them."""
    p.add_argument("inventory", type=Path, help="Ansible YAML inventory (file, or folder holding hosts.yml)")
    p.add_argument("--campaign", type=Path, help="campaign YAML (default: all.vars.kvoffload_campaign)")
    if results:
        p.add_argument(
            "--results", type=Path, default=Path("results"), help="results base folder (default ./results)"
        )
