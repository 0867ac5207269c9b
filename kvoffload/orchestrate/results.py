"""The results folder of a campaign (docs/architecture.md section 9): resume markers, never overwriting.

Its layout is kvoffload/contracts/layout.py's. A cell is done when its DONE file exists; DONE is
written last and atomically. A cell folder without it is an unfinished attempt: before the cell runs
again it is moved under attempts/, never deleted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from kvoffload.atomic import write_text_atomic
from kvoffload.config import Cell
from kvoffload.contracts.layout import CELL_SUBDIRS, CampaignPaths, CellPaths


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON whole or not at all (kvoffload.atomic), so a reader never sees half a file."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


class CampaignResults:
    """One campaign's results folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.paths = CampaignPaths(root)
        self.cells = self.paths.cells_dir
        self.attempts = self.paths.attempts_dir
        self.ansible = self.paths.ansible_dir

    @classmethod
    def open(cls, base: Path, campaign: str, fresh: bool = False) -> CampaignResults:
        """The folder `base/campaign`; with `fresh`, an existing one is kept aside as `<campaign>-<stamp>`."""
        root = base.resolve() / campaign  # absolute: playbooks run from their own folder
        if fresh and root.exists():
            root.rename(base / f"{campaign}-{time.strftime('%Y%m%dT%H%M%S')}")
        results = cls(root)
        results.cells.mkdir(parents=True, exist_ok=True)
        return results

    def cell_paths(self, cell: Cell) -> CellPaths:
        return self.paths.cell(cell.id)

    def cell_dir(self, cell: Cell) -> Path:
        return self.cell_paths(cell).root

    def is_done(self, cell: Cell) -> bool:
        return self.cell_paths(cell).done.is_file()

    def start_cell(self, cell: Cell) -> Path:
        """A fresh folder for the cell; an unfinished earlier attempt is moved under attempts/."""
        path = self.cell_dir(cell)
        if path.exists():
            if self.is_done(cell):
                raise FileExistsError(f"{path}: cell is DONE; it is never overwritten")
            self.attempts.mkdir(parents=True, exist_ok=True)
            path.rename(self.attempts / f"{cell.id}-{time.strftime('%Y%m%dT%H%M%S')}")
        for sub in CELL_SUBDIRS:
            (path / sub).mkdir(parents=True, exist_ok=True)
        return path

    def mark_done(self, cell: Cell) -> None:
        write_text_atomic(self.cell_paths(cell).done, time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
