"""Build, check and load a campaign's typed tables (`tables/*.parquet` + `tables/manifest.json`).

Tables (all carry `cell_id`; parquet metadata and the manifest carry `TABLES_SCHEMA_VERSION`):
- cells: one row per cell folder with a readable cell.json, its columns derived from CellMeta
  (kvoffload/contracts/cells_table.py): config columns + JSON-text columns for
  hosts, targets, timings, versions (controller), software (lab hosts), config (every key of the
  resolved cell), profiles and units (systemd states); the node that ran the cell and its cold-start
  method (restart or reset); `done` says whether DONE exists).
- requests: requests.jsonl rows (docs/contracts.md schema), plus each request's LMCache L1 and L2 hit
  chunks from the KV cache server's prefetch lines in units/ (kvoffload/ingest/lmcache_log.py; null
  where no line names the request).
- sessions: sessions.json, one row per cell that has one.
- samples: metric samples with `phase` = run (metrics/<target>.jsonl) | before | after (snapshots).
A cell folder whose cell.json is missing or invalid is skipped and listed in the manifest's `skipped`.
Any other raw file of a cell that cannot be read (sessions.json not valid JSON or not the model, a
requests or metrics file with a broken line) is left out and listed in the manifest's `unreadable`
({cell_id, file, reason}), so one damaged file nulls the figures it feeds, never the whole report.
A metrics file whose last line is cut off (a writer stopped mid-line) is read up to it and listed in the
manifest's `cut_off` ({cell_id, file}).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvoffload.atomic import atomic_path, write_text_atomic
from kvoffload.contracts.arrow import arrow_schema
from kvoffload.contracts.cells_table import CELLS_SCHEMA, cell_row
from kvoffload.contracts.layout import CampaignPaths, CellPaths
from kvoffload.contracts.records import SessionCounts
from kvoffload.errors import UserError
from kvoffload.ingest import lmcache_log
from kvoffload.ingest.cellmeta import load_cell_meta, load_session_counts
from kvoffload.ingest.jsonl import REQUEST_SCHEMA, SAMPLE_SCHEMA, ends_mid_line, read_requests, read_samples

log = logging.getLogger(__name__)

# 2: cells gained `software`; 3: cells gained `valid` and `invalid_reasons`; 4: cells gained `config`
# (the whole resolved cell config), `profiles` and `units`; 5: columns derived from the contract models
# (kvoffload/contracts): requests gained `ttft_clock` and `late_s`, sessions every sessions.json field;
# 6: cells derived from CellMeta too (kvoffload/contracts/cells_table.py): every cell.json field a column.
# 7: requests gained the schema-3 record fields and the LMCache L1/L2 hit chunks of each request.
# 8: cells gained `client` (the client host that replayed the cell).
# Tables of an older version are rebuilt from the raw files (`ingest_needed`).
TABLES_SCHEMA_VERSION = 8
TABLE_NAMES = ("cells", "requests", "sessions", "samples")

# Every field of sessions.json but its schema version, as the model defines them.
# sessions.json keys that stay out of the sessions table: its version, and the warm-up rounds' failures
# (diagnostics in words, a list: the cell's sessions.json keeps them).
SESSIONS_JSON_ONLY = ("schema", "warmup_errors")
SESSIONS_SCHEMA = pa.schema(
    [("cell_id", pa.string()), *arrow_schema(SessionCounts, exclude=SESSIONS_JSON_ONLY)]
)
REQUESTS_TABLE_SCHEMA = pa.schema([("cell_id", pa.string()), *REQUEST_SCHEMA, *lmcache_log.COLUMNS])
SAMPLES_TABLE_SCHEMA = pa.schema([("cell_id", pa.string()), ("phase", pa.string()), *SAMPLE_SCHEMA])


@dataclass(frozen=True)
class Tables:
    """A campaign's tables as DataFrames, plus campaign.json and the cells ingest skipped."""

    cells: pd.DataFrame
    requests: pd.DataFrame
    sessions: pd.DataFrame
    samples: pd.DataFrame
    campaign: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    unreadable: list[dict[str, str]] = field(default_factory=list)
    cut_off: list[dict[str, str]] = field(default_factory=list)


def _with_columns(table: pa.Table, **constants: str) -> pa.Table:
    for i, (name, value) in enumerate(constants.items()):
        table = table.add_column(i, name, pa.array([value] * table.num_rows, pa.string()))
    return table


def _cell_row(cell: CellPaths) -> dict[str, Any]:
    meta = load_cell_meta(cell.cell_json)
    if meta.cell_id != cell.cell_id:
        raise UserError(
            f"{cell.cell_json}: cell_id {meta.cell_id!r} differs from its folder name {cell.cell_id!r}"
        )
    return cell_row(meta, done=cell.done.is_file())


def _unreadable(cell: CellPaths, path: Path, exc: UserError) -> dict[str, str]:
    return {"cell_id": cell.cell_id, "file": str(path.relative_to(cell.root)), "reason": str(exc)}


def _cell_samples(
    cell: CellPaths, unreadable: list[dict[str, str]], cut_off: list[dict[str, str]]
) -> list[pa.Table]:
    out = []
    files = [("run", p) for p in cell.sample_files()]
    files += [(phase, p) for phase, p in (("before", cell.snapshot_before), ("after", cell.snapshot_after))]
    for phase, path in files:
        if not path.is_file():
            continue
        if path.stat().st_size and ends_mid_line(path):
            cut_off.append({"cell_id": cell.cell_id, "file": str(path.relative_to(cell.root))})
        try:
            out.append(_with_columns(read_samples(path), cell_id=cell.cell_id, phase=phase))
        except UserError as exc:
            unreadable.append(_unreadable(cell, path, exc))
    return out


def _concat(tables: Sequence[pa.Table], schema: pa.Schema) -> pa.Table:
    if not tables:
        return schema.empty_table()
    return pa.concat_tables([t.select(schema.names).cast(schema) for t in tables])


def _fingerprint(paths: CampaignPaths) -> dict[str, list[int]]:
    out = {}
    for p in paths.inputs():
        st = p.stat()
        out[str(p.relative_to(paths.root))] = [st.st_size, st.st_mtime_ns]
    return out


def ingest_campaign(results_dir: Path) -> Path:
    """Read every cell of `results_dir` and write its tables; return the tables folder."""
    paths = CampaignPaths(results_dir)
    if not paths.cells_dir.is_dir():
        msg = f"{results_dir}: no cells/ folder; give a campaign results folder (results/<name>)"
        raise UserError(msg)
    if not paths.cells():
        raise UserError(f"{paths.cells_dir}: no cell folders, nothing to ingest; run the campaign first")
    cell_rows: list[dict[str, Any]] = []
    session_rows: list[dict[str, Any]] = []
    requests: list[pa.Table] = []
    samples: list[pa.Table] = []
    skipped: list[dict[str, str]] = []
    unreadable: list[dict[str, str]] = []
    cut_off: list[dict[str, str]] = []
    for cell in paths.cells():
        if not cell.cell_json.is_file():
            skipped.append({"cell_id": cell.cell_id, "reason": f"{cell.cell_json} is missing"})
            continue
        try:
            cell_rows.append(_cell_row(cell))
        except UserError as exc:
            skipped.append({"cell_id": cell.cell_id, "reason": str(exc)})
            continue
        try:
            if cell.sessions.is_file():
                counts = load_session_counts(cell.sessions)
                session_rows.append({"cell_id": cell.cell_id, **counts.model_dump(exclude={"schema_"})})
        except UserError as exc:
            unreadable.append(_unreadable(cell, cell.sessions, exc))
        try:
            if cell.requests.is_file():
                prefetches = lmcache_log.read_folder(cell.units_dir)
                table = lmcache_log.join(read_requests(cell.requests), prefetches)
                requests.append(_with_columns(table, cell_id=cell.cell_id))
        except UserError as exc:
            unreadable.append(_unreadable(cell, cell.requests, exc))
        samples.extend(_cell_samples(cell, unreadable, cut_off))
    for s in skipped:
        log.warning("ingest: skipped cell %s: %s", s["cell_id"], s["reason"])
    for u in unreadable:
        log.warning("ingest: cell %s: %s not read: %s", u["cell_id"], u["file"], u["reason"])
    out = {
        "cells": pa.Table.from_pylist(cell_rows, schema=CELLS_SCHEMA),
        "sessions": pa.Table.from_pylist(session_rows, schema=SESSIONS_SCHEMA),
        "requests": _concat(requests, REQUESTS_TABLE_SCHEMA),
        "samples": _concat(samples, SAMPLES_TABLE_SCHEMA),
    }
    paths.tables_dir.mkdir(parents=True, exist_ok=True)
    meta = {b"kvoffload.schema": str(TABLES_SCHEMA_VERSION).encode()}
    for name, table in out.items():
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
        with atomic_path(paths.tables_dir / f"{name}.parquet") as tmp:
            pq.write_table(table, tmp, compression="zstd")
    manifest = {
        "schema": TABLES_SCHEMA_VERSION,
        "tables": {name: t.num_rows for name, t in out.items()},
        "skipped": skipped,
        "unreadable": unreadable,
        "cut_off": cut_off,
        "inputs": _fingerprint(paths),
    }
    write_text_atomic(paths.manifest, json.dumps(manifest, indent=1, sort_keys=True))
    return paths.tables_dir


def ingest_needed(results_dir: Path) -> bool:
    """True when tables are missing, of another schema version, or older than any raw input."""
    paths = CampaignPaths(results_dir)
    try:
        manifest = json.loads(paths.manifest.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return True
    if manifest.get("schema") != TABLES_SCHEMA_VERSION:
        return True
    if any(not (paths.tables_dir / f"{n}.parquet").is_file() for n in TABLE_NAMES):
        return True
    return bool(manifest.get("inputs") != _fingerprint(paths))


def load_tables(results_dir: Path) -> Tables:
    """Load the tables written by `ingest_campaign` (run it first, or use `ensure_tables`)."""
    paths = CampaignPaths(results_dir)
    manifest = json.loads(paths.manifest.read_text(encoding="utf-8"))
    frames = {n: pq.read_table(paths.tables_dir / f"{n}.parquet").to_pandas() for n in TABLE_NAMES}
    campaign: dict[str, Any] = {}
    if paths.campaign_json.is_file():
        try:
            campaign = json.loads(paths.campaign_json.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise UserError(f"{paths.campaign_json}: not valid JSON ({exc})") from exc
    return Tables(
        **frames,
        campaign=campaign,
        skipped=list(manifest.get("skipped", [])),
        unreadable=list(manifest.get("unreadable", [])),
        cut_off=list(manifest.get("cut_off", [])),
    )


def ensure_tables(results_dir: Path) -> Tables:
    """Ingest when needed, then load."""
    if ingest_needed(results_dir):
        ingest_campaign(results_dir)
    return load_tables(results_dir)
