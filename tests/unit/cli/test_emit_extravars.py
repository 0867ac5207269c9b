"""`plan --emit-extravars CELL_ID`: exactly the extravars `run` passes for that cell, as YAML."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kvoffload.cli.main import build_parser, main
from kvoffload.cli.run import _runner
from kvoffload.engines.lab import wheel_sets
from kvoffload.orchestrate.campaign import runner as campaign_module
from kvoffload.orchestrate.cell.deployment import cell_extravars
from kvoffload.orchestrate.installs import host_python, wheelhouse
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from tests.support.campaigns import sim_campaign, write_dataset, write_yaml

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "inventories" / "example" / "hosts.yml"


def _campaign(tmp_path: Path) -> Path:
    """A small simulator campaign on the example's two nodes, with its dataset on this machine (run
    weighs its node schedule by the requests each cell sends)."""
    data = write_dataset(tmp_path, sessions=3)
    dataset = {"code": "generic", "path": str(data)}
    campaign = sim_campaign("emittest", sim_profile="h200-qwen3-8b", dataset=dataset, concurrency=[2, 4])
    return write_yaml(tmp_path / "campaign.yml", campaign)


@pytest.fixture
def wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """build_wheels replaced by a recorder: the wheels are not built in a unit test."""
    calls: list[dict[str, object]] = []

    def fake(cache: Path, **kwargs: object) -> Wheels:
        calls.append({"cache": cache, **kwargs})
        return Wheels(
            package=cache / "package-x" / "kvoffload_lab-0-py3-none-any.whl", wheelhouse=cache / "h.tar"
        )

    monkeypatch.setattr(wheelhouse, "build_wheels", fake)
    # run's runner holds its own reference (imported by name), bound whenever campaign.py was first imported
    monkeypatch.setattr(campaign_module, "build_wheels", fake)
    # the hosts' Python, asked before the wheelhouse is built (orchestrate/installs/host_python.py): Ubuntu
    # 24.04's
    monkeypatch.setattr(host_python, "learn_hosts_python", lambda _runner: "3.12.3")
    return calls


def _emit(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["plan", str(EXAMPLE), *argv]) == 0
    out = capsys.readouterr().out
    # the header says how to run it: on the cell's node and its client host only (two nodes, each
    # replayed from its own client host)
    node = re.search(r"on node (\S+);", out)
    client = {"gpu01.lab.example": "client01.lab.example", "gpu02.lab.example": "client02.lab.example"}
    assert node and f"--limit {node.group(1)},{client[node.group(1)]}" in out.splitlines()[1]
    # and how to complete the cell's results afterwards (cell.json, DONE)
    cell = re.search(r"extravars of cell (\S+) ", out)
    assert cell and out.splitlines()[3].endswith(f" --finish-cell {cell.group(1)}")
    data = yaml.safe_load(out)
    assert isinstance(data, dict)
    return data


# About 2 s: run's node schedule weighs each cell by the requests it sends, so both run's runner and
# each emit load the dataset and select its users; one cell per node keeps it to three loads.
def test_emitted_extravars_are_those_run_passes_to_each_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], wheels: list[dict[str, object]]
) -> None:
    results = tmp_path / "results"
    cache = tmp_path / "wheels"
    argv = ["--campaign", str(_campaign(tmp_path)), "--results", str(results), "--wheel-cache", str(cache)]
    args = build_parser().parse_args(["run", str(EXAMPLE), *argv])
    lab, campaign_results, _display, runner = _runner(args)
    # The node run gives each cell, from run's own schedule; the wheels run's runner builds.
    plans = runner.plan(lab.cells)
    # run's campaign-wide playbooks (preflight, provision, the final teardown) cover every node: they
    # name none, which would limit preflight to that node (roles/preflight/tasks/cell_hosts.yml)
    assert "kvoffload_node" not in runner._base_extravars()
    assert len(plans) == 2  # the example's two nodes both get cells
    # one cell of each node, the later of its cells (a schedule of another node would differ)
    for plan in plans:
        cell = plan.cells[-1]
        emitted = _emit(capsys, *argv, "--emit-extravars", cell.id)
        # as `run` plans the cell on its node (orchestrate/cell/plan.py), and as deployment.py makes them
        expected = cell_extravars(lab, cell, campaign_results.cell_dir(cell), runner._wheels(), plan.node)
        assert emitted == expected == dict(runner.plan_of(cell, plan.node).extravars), cell.id
    assert wheels[0] == {
        "cache": cache,
        "offline": True,
        "engine_sets": wheel_sets(lab),
        "hosts_python": "3.12.3",  # the hosts' (run and emit both ask them)
    }
    assert all(w == wheels[0] for w in wheels)


def test_no_wheelhouse_and_the_results_folder_are_taken_as_run_takes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], wheels: list[dict[str, object]]
) -> None:
    from kvoffload.config import load_lab

    lab = load_lab(EXAMPLE, None)
    cell = lab.cells[0].id
    argv = ["--results", str(tmp_path), "--wheel-cache", str(tmp_path), "--no-wheelhouse"]
    data = _emit(capsys, *argv, "--emit-extravars", cell)
    assert wheels[-1]["offline"] is False
    assert data["replay_controller_dir"] == str(tmp_path.resolve() / lab.campaign.name / "cells" / cell)
    assert data["replay_cell_id"] == cell
    assert not (tmp_path / lab.campaign.name).exists()  # planning writes no results folder


def test_an_unknown_cell_exits_2(capsys: pytest.CaptureFixture[str], wheels: list[dict[str, object]]) -> None:
    assert main(["plan", str(EXAMPLE), "--emit-extravars", "nope"]) == 2
    assert "--emit-extravars nope: no such cell" in capsys.readouterr().err
    assert not wheels  # nothing built for bad input


def test_the_header_quotes_what_it_hands_to_a_shell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], wheels: list[dict[str, object]]
) -> None:
    import shlex

    from kvoffload.config import load_lab

    cell = load_lab(EXAMPLE, None).cells[0].id
    results = tmp_path / "my results; $(touch x)"
    assert main(["plan", str(EXAMPLE), "--results", str(results), "--emit-extravars", cell]) == 0
    header = capsys.readouterr().out.splitlines()[:4]
    # each command, split as a shell would, gives back the paths as given, one word each
    words = shlex.split(header[3].removeprefix("#"))
    assert words[:3] == ["kvoffload-lab", "plan", str(EXAMPLE)]
    assert words[words.index("--results") + 1] == str(results)
    assert shlex.split(header[1].removeprefix("#"))[:3] == ["ansible-playbook", "-i", str(EXAMPLE)]
