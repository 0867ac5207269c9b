"""The cells table's columns, derived from the cell.json model: one row per cell, flat enough to filter.

Every field of `CellMeta` is a column, so a field added to the model is a column here without a second
list. A scalar field keeps its type; the config is flattened into its own fields (the dataset as
`dataset_code` and `dataset_path`, `osl` as text since it is a number or "recorded") and also kept
whole as JSON text in `config`; `invalid_reasons` is joined with "; " and `cold_start` shows its
method, the two views the report reads; any other structured field is JSON text with sorted keys.
`done` (the DONE marker, not a cell.json field) follows `status`. Models only; no IO.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from kvoffload.contracts.arrow import arrow_type
from kvoffload.contracts.cell import CellConfig, CellMeta

# Structured fields shown as one text other than JSON (what the report's views read).
_TEXT_VIEWS: dict[str, Callable[[Any], str | None]] = {
    "invalid_reasons": lambda reasons: "; ".join(reasons),
    "cold_start": lambda cold: cold.get("method"),
}
_SKIPPED = frozenset({"schema"})  # the cell.json version: the table carries its own


def _scalar(annotation: Any) -> pa.DataType | None:
    try:
        return arrow_type(annotation)
    except TypeError:
        return None


Getter = Callable[[dict[str, Any]], Any]


def _field(name: str, view: Callable[[Any], Any] = lambda value: value) -> Getter:
    """The getter of a top-level field of the dumped cell.json, shown through `view`."""
    return lambda dumped: view(dumped[name])


def _config_field(name: str, view: Callable[[Any], Any] = lambda value: value) -> Getter:
    return lambda dumped: view(dumped["config"][name])


def _dataset_field(key: str) -> Getter:
    return lambda dumped: (dumped["config"].get("dataset") or {}).get(key)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def _config_columns() -> Iterator[tuple[str, pa.DataType, Getter]]:
    for name, info in CellConfig.model_fields.items():
        if name == "dataset":
            for key in ("code", "path"):
                yield f"dataset_{key}", pa.string(), _dataset_field(key)
            continue
        kind = _scalar(info.annotation)
        if kind is None:
            yield name, pa.string(), _config_field(name, str)
        else:
            yield name, kind, _config_field(name)


def _columns() -> list[tuple[str, pa.DataType, Getter]]:
    columns: list[tuple[str, pa.DataType, Getter]] = []
    for name, info in CellMeta.model_fields.items():
        column = info.alias or name
        if column in _SKIPPED:
            continue
        if column == "config":
            columns += _config_columns()
            columns.append(("config", pa.string(), _field("config", _json)))
        elif column in _TEXT_VIEWS:
            columns.append((column, pa.string(), _field(column, _TEXT_VIEWS[column])))
        elif (kind := _scalar(info.annotation)) is not None:
            columns.append((column, kind, _field(column)))
        else:
            columns.append((column, pa.string(), _field(column, _json)))
        if column == "status":
            columns.append(("done", pa.bool_(), _field("done")))
    return columns


_COLUMNS = _columns()
CELLS_SCHEMA = pa.schema([(name, kind) for name, kind, _ in _COLUMNS])


def cell_row(meta: CellMeta, *, done: bool) -> dict[str, Any]:
    """The cells-table row of one cell.json (`done`: whether its DONE marker exists)."""
    dumped = {**meta.model_dump(mode="json", by_alias=True), "done": done}
    return {name: get(dumped) for name, _, get in _COLUMNS}
