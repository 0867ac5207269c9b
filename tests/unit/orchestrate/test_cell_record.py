"""cell.json as a typed record (kvoffload/orchestrate/cell/record.py): the keys a cell has at each point
of its run, the status strings, and the check against the contract's model."""

from __future__ import annotations

import json
import typing
from pathlib import Path

from kvoffload.contracts.cell import CELL_SCHEMA, CellMeta
from kvoffload.contracts.layout import CellPaths
from kvoffload.orchestrate.cell.faults import Fault
from kvoffload.orchestrate.cell.record import CellRecord, CellStatus

BASE = {"schema", "cell_id", "campaign", "status", "config", "node", "client", "profiles", "targets",
        "l2_device", "replay_argv", "versions", "software", "started_at"}  # fmt: skip


def _record(**kw: typing.Any) -> CellRecord:
    config = {
        "tier": "nvme",
        "model": "m",
        "concurrency": 2,
        "num_rounds": 3,
        "isl": 100,
        "osl": 16,
        "id": "c1",
    }
    return CellRecord(cell_id="c1", campaign="camp", config=config, node="gpu01", profiles={"engine": "e"},
                      targets={}, l2_device="nvme1n1", replay_argv=["kvoffload-lab", "replay"],
                      versions={"python": "3.11"}, started_at=1.0, **kw)  # fmt: skip


def test_the_status_strings_are_the_contracts() -> None:
    allowed = set(typing.get_args(CellMeta.model_fields["status"].annotation))
    assert {str(s) for s in CellStatus} == allowed == {"running", "done", "failed", "interrupted"}


def test_a_running_record_has_only_what_is_known_and_a_plain_one_no_run_fields() -> None:
    running = _record(engine_key="k", hosts={}, timings={})
    assert set(running.to_json()) == BASE | {"engine_key", "hosts", "timings"}
    assert running.to_json()["status"] == "running" and running.to_json()["schema"] == CELL_SCHEMA
    assert set(_record().to_json()) == BASE  # a plain run: no engine key, host facts or timings


def test_l2_trim_is_a_key_of_cells_with_an_l2_even_when_null() -> None:
    record = _record()
    assert "l2_trim" not in record.to_json()
    record.l2_trim = None
    assert record.to_json()["l2_trim"] is None


def test_the_judged_record_has_faults_valid_and_with_a_fault_its_reasons_and_effects(tmp_path: Path) -> None:
    record = _record()
    record.units = {}
    record.judge([], [], tmp_path / "requests.jsonl")
    out = record.to_json()
    assert out["faults"] == [] and out["valid"] is True
    assert "invalid_reasons" not in out and "fault_effects" not in out
    fault = Fault("vllm-gpu01-0", "restarted", "NRestarts 0 -> 1")
    record.judge([], [fault], tmp_path / "requests.jsonl")
    out = record.to_json()
    assert out["valid"] is False and out["faults"] == [fault.to_json()]
    assert out["invalid_reasons"] == [fault.reason()] and "fault_effects" in out


def test_the_written_record_passes_the_model_and_reads_back(tmp_path: Path) -> None:
    record = _record(engine_key="k", hosts={}, timings={"deploy": 1.5})
    record.status, record.error, record.engines_kept = CellStatus.FAILED, "boom", True
    paths = CellPaths(tmp_path)
    record.write(paths)
    meta = CellMeta.model_validate(json.loads(paths.cell_json.read_text()))
    assert meta.status == "failed" and meta.error == "boom" and meta.engines_kept
    assert meta.timings == {"deploy": 1.5} and meta.engine_key == "k"
