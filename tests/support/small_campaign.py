"""The shipped campaign-small results folder (tests/fixtures/campaign-small), copied where a test may
change it: its raw files only, without the derived tables and report or the generator and its notes."""

from __future__ import annotations

import shutil
from pathlib import Path

SMALL = Path(__file__).resolve().parents[1] / "fixtures" / "campaign-small"


def copy_small(dest: Path) -> Path:
    """campaign-small's raw files copied to `dest` (which must not exist); returns `dest`."""
    shutil.copytree(SMALL, dest, ignore=shutil.ignore_patterns("tables", "report", "*.py", "*.md"))
    return dest
