"""Reading cell.json and sessions.json: validated through their contract models, errors naming file and key.

The models are kvoffload/contracts (cell.CellMeta, records.SessionCounts), shared with the writers;
keys they do not list are ignored, so a newer writer's fields do not break ingest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kvoffload.contracts.cell import CellMeta
from kvoffload.contracts.records import SessionCounts
from kvoffload.errors import UserError

__all__ = ["CellMeta", "SessionCounts", "load_cell_meta", "load_session_counts"]


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        msg = f"{path}: not valid JSON ({exc}); fix or delete the file and re-run the cell"
        raise UserError(msg) from exc


def _explain(path: Path, exc: ValidationError) -> str:
    first = exc.errors()[0]
    key = ".".join(str(p) for p in first["loc"])
    return f"{path}: key {key!r}: {first['msg']} ({len(exc.errors())} problem(s))"


def load_cell_meta(path: Path) -> CellMeta:
    """Read and validate cell.json; UserError names the file and the first bad key."""
    try:
        return CellMeta.model_validate(_load_json(path))
    except ValidationError as exc:
        raise UserError(_explain(path, exc)) from exc


def load_session_counts(path: Path) -> SessionCounts:
    """Read and validate sessions.json; UserError names the file and the first bad key."""
    try:
        return SessionCounts.model_validate(_load_json(path))
    except ValidationError as exc:
        raise UserError(_explain(path, exc)) from exc
