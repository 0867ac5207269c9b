"""Paths of a campaign's results folder (docs/architecture.md section 9); the one place that spells them.

    results/<campaign>/campaign.json, status.json, cells/<cell-id>/{cell.json, requests.jsonl, sessions.json,
    metrics/, units/, logs/, software/, DONE}, attempts/<cell-id>-<stamp>/ (earlier unfinished
    attempts), ansible/ (runner artifacts), tables/, report/

The orchestrator, the replay, the plan and ingest all take their paths from here. Pure path arithmetic
plus directory listing; no parsing, no writing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SNAPSHOT_BEFORE = "snapshot-before.jsonl"
SNAPSHOT_AFTER = "snapshot-after.jsonl"
CELL_JSON = "cell.json"
REQUESTS = "requests.jsonl"
SESSIONS = "sessions.json"
DONE = "DONE"
CELLS_DIR = "cells"
# Folders a cell's run creates before its playbooks write into them.
CELL_SUBDIRS = ("metrics", "units", "logs")


@dataclass(frozen=True)
class CellPaths:
    """Files of one cell folder."""

    root: Path

    @property
    def cell_id(self) -> str:
        return self.root.name

    @property
    def cell_json(self) -> Path:
        return self.root / CELL_JSON

    @property
    def requests(self) -> Path:
        return self.root / REQUESTS

    @property
    def sessions(self) -> Path:
        return self.root / SESSIONS

    @property
    def metrics_dir(self) -> Path:
        return self.root / "metrics"

    @property
    def units_dir(self) -> Path:
        """`<host>--<unit>` systemctl states the collect role writes."""
        return self.root / "units"

    @property
    def software_dir(self) -> Path:
        """`<host>.json`: the software the collect role found on each host."""
        return self.root / "software"

    @property
    def fetched_archive(self) -> Path:
        """The cell folder as the replay role fetched it from the client (a gzip tarball), until unpacked
        here (roles/replay/vars/main.yml `_replay_controller_archive`)."""
        return self.root / f".fetched-{self.cell_id}.tar.gz"

    @property
    def workers_dir(self) -> Path:
        """A replay over worker processes: workers/<i>/ holds each one's records until they are merged."""
        return self.root / "workers"

    def worker(self, index: int) -> CellPaths:
        return CellPaths(self.workers_dir / str(index))

    @property
    def done(self) -> Path:
        return self.root / DONE

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
    def status_json(self) -> Path:
        """Where each node is while `run` works (kvoffload/orchestrate/campaign/status.py), for `watch`."""
        return self.root / "status.json"

    @property
    def cells_dir(self) -> Path:
        return self.root / CELLS_DIR

    @property
    def attempts_dir(self) -> Path:
        return self.root / "attempts"

    @property
    def ansible_dir(self) -> Path:
        return self.root / "ansible"

    def cell(self, cell_id: str) -> CellPaths:
        return CellPaths(self.cells_dir / cell_id)

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
            if cell.units_dir.is_dir():  # the KV cache server's prefetch lines (ingest/lmcache_log.py)
                files.extend(sorted(cell.units_dir.glob("*.prefetch.txt")))
        return files
