"""The repository stands on its own: no tracked file cites a document kept outside it.

docs/architecture.md is the architecture record; a citation of the team's design notes (a file users
and future maintainers do not have) in code, docs, roles or the generated report is a dead end.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ("DESIGN.md", "DESIGN section", "../shared/")


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def test_no_tracked_file_cites_the_teams_design_notes() -> None:
    this = Path(__file__).resolve()
    found = []
    for path in _tracked():
        if path.resolve() == this or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary
        for number, line in enumerate(text.splitlines(), 1):
            if any(mark in line for mark in OUTSIDE) and "not in html" not in line:
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "cite docs/architecture.md (or the repo's own docs) instead:\n" + "\n".join(found)


def test_the_architecture_record_is_in_the_repository() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    headings = ("## 2. Parts", "## 3. The lab's shape", "## 5. A cell's lifecycle", "## 11. Where to change")
    for heading in headings:
        assert heading in text, heading
