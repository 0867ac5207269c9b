"""Paths of a campaign's results folder (DESIGN.md section 5); the one place that spells them.

Pure path arithmetic plus directory listing; no parsing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SNAPSHOT_BEFORE = "snapshot-before.jsonl"
SNAPSHOT_AFTER = "snapshot-after.jsonl"


@dataclass(frozen=True)
class CellPaths:
    """Files of one cell folder."""

    root: Path

    @property
    def cell_id(self) -> str:
        return self.root.name

    @property
    def cell_json(self) -> Path:
        return self.root / "cell.json"

    @property
    def requests(self) -> Path:
        return self.root / "requests.jsonl"

    @property
    def sessions(self) -> Path:
        return self.root / "sessions.json"

    @property
    def metrics_dir(self) -> Path:
        return self.root / "metrics"

    @property
    def done(self) -> Path:
        return self.root / "DONE"

    @property
    def snapshot_before(self) -> Path:
        return self.metrics_dir / SNAPSHOT_BEFORE

    @property
    def snapshot_after(self) -> Path:
        return self.metrics_dir / SNAPSHOT_AFTER

    def sample_files(self) -> list[Path]:
        """`metrics/<target>.jsonl`, snapshots excluded, sorted by name."""
        if not self.metrics_dir.is_dir():
            return []
        return sorted(
            p for p in self.metrics_dir.glob("*.jsonl") if p.name not in (SNAPSHOT_BEFORE, SNAPSHOT_AFTER)
        )


@dataclass(frozen=True)
class CampaignPaths:
    """Top-level files of a campaign folder."""

    root: Path

    @property
    def campaign_json(self) -> Path:
        return self.root / "campaign.json"

    @property
    def cells_dir(self) -> Path:
        return self.root / "cells"

    @property
    def tables_dir(self) -> Path:
        return self.root / "tables"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    @property
    def manifest(self) -> Path:
        return self.tables_dir / "manifest.json"

    def cells(self) -> list[CellPaths]:
        if not self.cells_dir.is_dir():
            return []
        return [CellPaths(p) for p in sorted(self.cells_dir.iterdir()) if p.is_dir()]

    def inputs(self) -> list[Path]:
        """Every raw file ingest reads, for the freshness check."""
        files = [self.campaign_json] if self.campaign_json.is_file() else []
        for cell in self.cells():
            for p in (cell.cell_json, cell.requests, cell.sessions, cell.done):
                if p.is_file():
                    files.append(p)
            if cell.metrics_dir.is_dir():
                files.extend(sorted(cell.metrics_dir.glob("*.jsonl")))
        return files
