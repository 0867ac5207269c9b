"""cell.json: the orchestrator's writer and ingest's reader share `CellMeta`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kvoffload.contracts.cell import CellMeta, cell_json_text
from kvoffload.ingest.cellmeta import load_cell_meta

FIXTURE = Path(__file__).parents[2] / "fixtures" / "campaign-small"


def _record() -> dict[str, Any]:
    return {
        "schema": 1,
        "cell_id": "abc123",
        "campaign": "c",
        "status": "running",
        "config": {"tier": "cpu", "model": "m", "concurrency": 2, "num_rounds": 3, "isl": 100, "osl": 8},
        "node": "gpu01",
        "engine_key": "k",
        "replay_argv": ["kvoffload-lab", "replay"],
        "timings": {"deploy": 1.5},
        "started_at": 1.0,
    }


def test_what_the_writer_writes_the_reader_reads(tmp_path: Path) -> None:
    path = tmp_path / "cell.json"
    record = _record()
    path.write_text(cell_json_text(record))
    meta = load_cell_meta(path)
    assert (meta.cell_id, meta.status, meta.config.tier, meta.node, meta.replay_argv) == (
        "abc123",
        "running",
        "cpu",
        "gpu01",
        ["kvoffload-lab", "replay"],
    )
    assert json.loads(path.read_text()) == record  # written as given: no defaults added


def test_the_writer_refuses_a_key_the_model_lacks() -> None:
    with pytest.raises(ValueError, match=r"\['surprise'\] are not in contracts.cell.CellMeta"):
        cell_json_text({**_record(), "surprise": 1})


def test_the_writer_refuses_a_bad_value() -> None:
    with pytest.raises(ValidationError, match="tier"):
        cell_json_text({**_record(), "config": {**_record()["config"], "tier": "ram"}})


@pytest.mark.parametrize("cell", sorted(p.name for p in (FIXTURE / "cells").iterdir()))
def test_last_weeks_cell_json_still_reads(cell: str) -> None:
    meta = load_cell_meta(FIXTURE / "cells" / cell / "cell.json")
    assert meta.cell_id == cell
    assert meta.engine_key is None and meta.faults == []  # fields the fixture predates
    assert isinstance(meta, CellMeta)
