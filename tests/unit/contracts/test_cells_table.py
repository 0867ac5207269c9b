"""The cells table is derived from CellMeta: every cell.json field a column, shown as the report reads it."""

from __future__ import annotations

import json

import pyarrow as pa

from kvoffload.contracts.cell import CellConfig, CellMeta
from kvoffload.contracts.cells_table import CELLS_SCHEMA, cell_row


def test_every_field_of_the_model_is_a_column() -> None:
    top = {info.alias or name for name, info in CellMeta.model_fields.items()} - {"schema"}
    config = set(CellConfig.model_fields) - {"dataset"} | {"dataset_code", "dataset_path"}
    assert set(CELLS_SCHEMA.names) == top | config | {"done"}
    assert CELLS_SCHEMA.names[:4] == ["cell_id", "campaign", "status", "done"]
    assert CELLS_SCHEMA.field("concurrency").type == pa.int64()
    assert CELLS_SCHEMA.field("valid").type == pa.bool_()
    assert CELLS_SCHEMA.field("started_at").type == pa.float64()
    assert CELLS_SCHEMA.field("osl").type == pa.string()  # a number or "recorded"


def test_a_row_flattens_the_config_and_keeps_the_views_the_report_reads() -> None:
    meta = CellMeta.model_validate(
        {
            "cell_id": "abc",
            "status": "done",
            "config": {
                "tier": "nvme",
                "model": "m",
                "concurrency": 4,
                "num_rounds": 5,
                "isl": 100,
                "osl": "recorded",
                "dataset": {"code": "generic", "path": "/d"},
            },
            "invalid_reasons": ["replica 0 restarted", "lmcache-server restarted"],
            "cold_start": {"method": "reset", "probes": [1]},
            "timings": {"deploy": 2.5},
        }
    )
    row = cell_row(meta, done=True)
    assert set(row) == set(CELLS_SCHEMA.names)
    assert (row["tier"], row["concurrency"], row["osl"], row["dataset_code"], row["done"]) == (
        "nvme",
        4,
        "recorded",
        "generic",
        True,
    )
    assert row["invalid_reasons"] == "replica 0 restarted; lmcache-server restarted"
    assert row["cold_start"] == "reset"
    assert json.loads(row["timings"]) == {"deploy": 2.5}
    assert json.loads(row["config"])["dataset"] == {"code": "generic", "path": "/d"}
    assert row["fault_effects"] is None and row["error"] is None
    pa.Table.from_pylist([row], schema=CELLS_SCHEMA)  # the row fits the schema
