"""`plan --finish-cell CELL_ID`: a plain Ansible run's cell folder becomes a cell as `run` writes it
(cell.json, DONE), which ingest reads and `plan` counts DONE; nothing is ever overwritten."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvoffload.cli.main import main
from kvoffload.config import load_lab
from kvoffload.ingest.cellmeta import load_cell_meta
from kvoffload.ingest.tables import ingest_campaign, load_tables
from kvoffload.orchestrate.cell.deployment import cell_units
from tests.unit.cli.test_emit_extravars import EXAMPLE, _campaign

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "campaign-small" / "cells" / "a1gpu"
# a host's software as the collect role writes it (software/<host>.json)
SOFTWARE = {
    "groups": ["vllm"],
    "packages": {"caddy": "2.6.2"},
    "python": {"/opt/kvoffload/venv": {"vllm": "0.32.0"}},
}


def _plain_run(cell_dir: Path, units: list[str], *, results: bool = True, restarted: str = "") -> None:
    """What site.yml's replay and collect leave on the controller: the fetched folder, unit states and
    software per host; no cell.json, no DONE."""
    cell_dir.mkdir(parents=True)
    if results:
        for name in ("requests.jsonl", "sessions.json", "metrics"):
            src = FIXTURE / name
            (shutil.copytree if src.is_dir() else shutil.copy)(src, cell_dir / name)
    by_host: dict[str, dict[str, dict[str, str]]] = {}
    for key in units:
        host, unit = key.split("--", 1)
        restarts = "1" if unit == restarted else "0"
        by_host.setdefault(host, {})[unit] = {
            "ActiveState": "active",
            "SubState": "running",
            "NRestarts": restarts,
        }
    (cell_dir / "units").mkdir()
    (cell_dir / "software").mkdir()
    for host, states in by_host.items():
        (cell_dir / "units" / f"{host}.json").write_text(json.dumps({"host": host, "units": states}))
        (cell_dir / "software" / f"{host}.json").write_text(json.dumps(SOFTWARE))


def test_a_plain_run_is_finished_into_a_cell_that_ingest_and_plan_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    camp = _campaign(tmp_path)
    lab = load_lab(EXAMPLE, camp)
    results = tmp_path / "results"
    argv = ["plan", str(EXAMPLE), "--campaign", str(camp), "--results", str(results)]
    cell, other = lab.cells[0], lab.cells[1]
    node = lab.nodes[1].name  # the schedule may give it either node: the units say which
    units = cell_units(lab, cell, node)
    folder = results / lab.campaign.name / "cells"
    _plain_run(folder / cell.id, units, restarted="kvoffload-vllm@0.service")
    assert main([*argv, "--finish-cell", cell.id]) == 0
    assert f"cell {cell.id}: DONE (invalid: a replica" in capsys.readouterr().out
    meta = load_cell_meta(folder / cell.id / "cell.json")
    assert (meta.status, meta.node, meta.cold_start["method"]) == ("done", node, "plain")
    assert meta.config.concurrency == cell.concurrency and meta.targets and meta.replay_argv
    assert meta.software[node] == SOFTWARE
    # a replica systemd restarted during the replay makes the cell invalid, as in `run`
    assert not meta.valid and any("restarted" in r for r in meta.invalid_reasons)
    assert (folder / cell.id / "DONE").is_file()
    # ingest reads it (it skipped a folder without cell.json); plan counts it DONE
    tables = load_tables(ingest_campaign(results / lab.campaign.name).parent)
    assert tables.skipped == [] and list(tables.cells["cell_id"]) == [cell.id]
    assert len(tables.requests) > 0
    assert main(argv) == 0
    assert f"{len(lab.cells) - 1} cell(s) to run, 1 already DONE" in capsys.readouterr().out
    # never twice: a DONE cell is not touched
    assert main([*argv, "--finish-cell", cell.id]) == 2
    assert "is DONE; it is never overwritten" in capsys.readouterr().err

    # a replay that never fetched its results: cell.json says so, no DONE
    _plain_run(folder / other.id, cell_units(lab, other, node), results=False)
    assert main([*argv, "--finish-cell", other.id]) == 1
    assert "collected results lack requests.jsonl, sessions.json" in capsys.readouterr().err
    assert load_cell_meta(folder / other.id / "cell.json").status == "failed"
    assert not (folder / other.id / "DONE").exists()
    # a folder with cell.json is `run`'s (or finished): refused
    assert main([*argv, "--finish-cell", other.id]) == 2
    assert "cell.json: exists" in capsys.readouterr().err


def test_finishing_a_cell_with_no_results_folder_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    camp = _campaign(tmp_path)
    cell = load_lab(EXAMPLE, camp).cells[0]
    argv = ["plan", str(EXAMPLE), "--campaign", str(camp), "--results", str(tmp_path / "r")]
    assert main([*argv, "--finish-cell", cell.id]) == 2
    assert f"no results of cell {cell.id} (run its playbooks first" in capsys.readouterr().err
    assert main([*argv, "--finish-cell", "nope"]) == 2
    assert "--finish-cell nope: no such cell" in capsys.readouterr().err
