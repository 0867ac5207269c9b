"""The campaign runner's cell lifecycle with the playbooks and the lab's HTTP replaced by recorders.

What is checked: which playbooks run for which cell on which node, when engines are kept between
cells (cold_start: reset) and when they restart, the fallback to a restart when a reset fails, and
that a lab of two nodes runs each comparison group on one node, the nodes at once, and that the
client installs while the nodes start their first engines (and every replay waits for it).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.config import LabConfig, load_lab
from kvoffload.contracts.layout import CellPaths
from kvoffload.orchestrate import playbooks_api as api
from kvoffload.orchestrate.campaign.runner import CampaignRunner
from kvoffload.orchestrate.campaign.schedule import group_key, schedule
from kvoffload.orchestrate.cell import run as cell_run
from kvoffload.orchestrate.cell.coldstart import ResetFailed, ResetRecord
from kvoffload.orchestrate.cell.watch import ColdCheck
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from kvoffload.orchestrate.results import CampaignResults
from kvoffload.playbook import PlaybookFailed, PlaybookResult
from kvoffload.playbook.runner import TaskFailure
from tests.support.campaigns import example_inventory, sim_campaign, write_dataset, write_yaml

ROOT = Path(__file__).resolve().parents[3]


def _lab_files(
    tmp_path: Path, *, nodes: int, cold_start: str = "reset", clients: int = 1
) -> tuple[Path, Path]:
    # The example has two client hosts: keep `clients` of them (one: the nodes share it).
    inv = write_yaml(tmp_path / "hosts.yml", example_inventory(nodes=nodes, clients=clients))
    write_dataset(tmp_path, sessions=4)
    campaign = sim_campaign("flow", concurrency=[2, 8], isl=100000, cold_start=cold_start)
    camp = write_yaml(tmp_path / "campaign.yml", campaign)
    return inv, camp


class Recorder:
    """Stands in for PlaybookRunner: records each run and writes what replay/collect would fetch."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str, str | None]] = []  # (playbook, node, limit)
        self.lock = threading.Lock()
        self.active: dict[str, int] = {}
        self.overlap = False  # two nodes inside a playbook at the same time
        self.software_reads: list[str] = []  # nodes whose collect read the software versions
        self.marks: list[tuple[float, str]] = []  # (when, what): installs' ends, replays' starts
        self.journals: list[tuple[str, Any]] = []  # (node, vllm_teardown_journal_units) of each teardown.yml
        self.fail_client_install: bool | str = False  # True: every client host's; a name: that one's
        self.fact_caches: list[tuple[str, str, str | None]] = []  # (playbook, node, its fact cache folder)

    def run(self, playbook: str, extravars: dict[str, Any] | None = None, **kw: Any) -> PlaybookResult:
        ev = extravars or {}
        node = str(ev.get("kvoffload_node"))
        if kw.get("tags"):  # the once-per-campaign install of a node (deploy) or of the client (replay)
            playbook = f"{playbook}:{','.join(kw['tags'])}"
        elif playbook == "teardown.yml" and "unquiet" not in (kw.get("skip_tags") or ()):
            playbook = "teardown.yml:final"  # the node's last: the periodic disk jobs come back
        else:
            assert set(kw.get("skip_tags") or ()) >= {"install", "model"} or playbook not in (
                "deploy.yml",
                "replay.yml",
            ), (playbook, kw)
        if ev.get("kvoffload_clear_l2"):
            playbook += "+clear-l2"  # the lmcache_server role empties L2 in place before the replay
        if ev.get("kvoffload_clear_l2_next"):
            playbook += "+clear-l2-next"  # and after the replay's collect, for a next cell on these engines
        teardown = bool(ev.get(api.TEARDOWN_AFTER_VAR)) and playbook.startswith("replay.yml")
        if teardown:
            playbook += "+teardown"  # no next cell keeps the engines: replay.yml ends with teardown.yml
        with self.lock:
            self.runs.append((playbook, node, kw.get("limit")))
            if playbook.startswith("teardown.yml"):
                self.journals.append((node, ev.get("vllm_teardown_journal_units")))
            cache = kw.get("fact_cache")
            self.fact_caches.append((playbook, node, str(cache) if cache else None))
            self.active[node] = self.active.get(node, 0) + 1
            self.overlap = self.overlap or sum(1 for n in self.active.values() if n) > 1
        try:
            if playbook == "replay.yml:install":  # the client's: slow enough to overlap a deploy
                threading.Event().wait(0.2)
                failing = self.fail_client_install
                if failing is True or (failing and failing == kw.get("limit")):
                    host = str(kw.get("limit") or "client01.lab.example")
                    failure = TaskFailure(host, "Install the requirement set", "pip: no wheel")
                    raise PlaybookFailed(
                        PlaybookResult("replay.yml", "failed", 2, {}, (failure,), Path("/nonexistent"), 0.0)
                    )
            if playbook.startswith("replay.yml") and not kw.get("tags"):
                self.mark(f"replay {node}")
            replay = playbook.startswith("replay.yml") and not kw.get("tags")
            if replay and "collect-software" not in (kw.get("skip_tags") or ()):  # replay.yml collects
                software = Path(ev["replay_controller_dir"]) / "software"
                software.mkdir(parents=True, exist_ok=True)
                (software / f"{node}.json").write_text('{"packages": {"vllm": "1"}}')
                self.software_reads.append(node)
            if playbook.startswith("replay.yml") and not kw.get("tags"):
                folder = Path(ev["replay_controller_dir"])
                (folder / "requests.jsonl").write_text("")
                (folder / "sessions.json").write_text("{}")
                threading.Event().wait(0.05)  # long enough for the other node to be in its own replay
        finally:
            with self.lock:
                self.active[node] -= 1
            if kw.get("tags") and "install" in kw["tags"]:
                self.mark(f"installed {playbook} {node}")
        plays = ((api.COLLECT_PLAY, 0.0), (api.TEARDOWN_PLAY, 0.0)) if teardown else ()
        # the lmcache_server role's fstrim after each end-of-cell L2 wipe (trim_l2.yml), in the play that
        # wiped; the clear of a reset's probes right before the replay (api.CLEAR_L2_PLAY) trims nothing
        wipes: list[str] = []
        if ev.get("lmcache_server_l2_path") and not kw.get("tags"):
            if "+clear-l2-next" in playbook:
                wipes.append("Empty L2 for the next cell, which keeps these engines")
            if teardown or playbook == "teardown.yml":
                wipes.append(api.TEARDOWN_PLAY)
        trims = tuple(
            (play, node, {"outcome": "trimmed", "message": f"{len(self.runs)} {playbook} {play}"})
            for play in wipes
        )
        return PlaybookResult(
            playbook, "successful", 0, {}, (), Path("/nonexistent"), 0.0, {}, plays, l2_trims=trims
        )

    def mark(self, what: str) -> None:
        with self.lock:
            self.marks.append((time.monotonic(), what))

    def when(self, prefix: str) -> list[float]:
        return [t for t, what in self.marks if what.startswith(prefix)]

    def for_node(self, node: str) -> list[str]:
        """The node's playbooks in order; the client's install runs beside them (tested on its own)."""
        return [p for p, n, _ in self.runs if n == node and p != "replay.yml:install"]


class Progress:
    def phase(self, *a: Any) -> None: ...
    def task(self, name: str) -> None: ...
    def replay(self, done: int, expected: int) -> None: ...
    def cell_done(self, *a: Any) -> None: ...


@contextmanager
def _quiet_watch(*_a: Any, **_k: Any) -> Iterator[Any]:
    class Watch:
        def faults(self) -> list[Any]:
            return []

    yield Watch()


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    state: dict[str, Any] = {"resets": [], "fail_resets": 0}

    class FakeReset:
        def __init__(self, endpoints: Any, *, external: bool) -> None:
            self.endpoints = endpoints
            self.external = external

        def run(self, payload: Any) -> ResetRecord:
            state["resets"].append((sorted(self.endpoints.replicas), self.external, payload))
            if state["fail_resets"]:
                state["fail_resets"] -= 1
                raise ResetFailed("vllm-x-0: not cold after the reset: 96 cached prompt tokens")
            return ResetRecord(cold=True)

    monkeypatch.setattr(cell_run, "CacheReset", FakeReset)
    monkeypatch.setattr(cell_run, "check_cold", lambda _t: ColdCheck(True, {}, (), ()))
    monkeypatch.setattr(cell_run, "ReplayWatcher", _quiet_watch)
    monkeypatch.setattr(cell_run, "TargetWatch", _quiet_watch)
    return state


def _runner(
    tmp_path: Path, *, nodes: int, cold_start: str = "reset", clients: int = 1
) -> tuple[CampaignRunner, Recorder]:
    inv, camp = _lab_files(tmp_path, nodes=nodes, cold_start=cold_start, clients=clients)
    return _runner_of(tmp_path, load_lab(inv, camp), inv)


def _runner_of(tmp_path: Path, lab: LabConfig, inv: Path) -> tuple[CampaignRunner, Recorder]:
    """A runner of `lab` whose playbooks a `Recorder` plays; its results in tmp_path/results (a second
    runner there resumes the first's run)."""
    results = CampaignResults.open(tmp_path / "results", lab.campaign.name)
    runner = CampaignRunner(
        lab,
        inv,
        results,
        Progress(),
        wheel_cache=tmp_path / "cache",
        probe_payload=lambda cell: {"probe-of": cell.id},
    )
    recorder = Recorder()
    runner.playbooks = recorder  # type: ignore[assignment]
    runner.wheels = Wheels(tmp_path / "kvoffload.whl", None)
    return runner, recorder


def _run_with_a_failed_client_install(tmp_path: Path, nodes: int) -> tuple[CampaignRunner, Recorder]:
    """A run on `nodes` nodes whose one client host fails to install: each of its 6 cells fails with
    the install's error (test_client_host_runs.py's too)."""
    runner, rec = _runner(tmp_path, nodes=nodes)
    rec.fail_client_install = True
    outcome = runner.run(provision=False)
    assert not outcome.done and len(outcome.failed) == 6
    assert all(
        why.startswith("failed: the install of client host client01.lab.example failed: ")
        and "pip: no wheel" in why
        for why in outcome.failed.values()
    )
    return runner, rec


def _cell_json(runner: CampaignRunner, cell_id: str) -> dict[str, Any]:
    import json

    cell = next(c for c in runner.lab.cells if c.id == cell_id)
    return dict(json.loads((runner.results.cell_dir(cell) / "cell.json").read_text()))


def test_one_node_restarts_engines_only_when_the_tier_changes(tmp_path: Path, fakes: dict[str, Any]) -> None:
    runner, rec = _runner(tmp_path, nodes=1)
    outcome = runner.run(provision=False)
    assert len(outcome.done) == 6 and not outcome.failed
    assert rec.for_node("gpu01.lab.example") == [
        "deploy.yml:install,model,quiet", "teardown.yml",  # the node, once; nothing left running
        # gpu c2 restart, gpu c8 reset: the second's replay run ends with the teardown
        "deploy.yml", "replay.yml", "replay.yml+teardown",
        "deploy.yml", "replay.yml", "replay.yml+teardown",  # cpu
        # nvme: L2 emptied in place, by the first cell's collect and before the second's replay
        "deploy.yml", "replay.yml+clear-l2-next", "replay.yml+clear-l2+teardown",
        "teardown.yml:unquiet",  # after the node's last cell: the periodic disk jobs come back
    ]  # fmt: skip
    assert all(limit is None for _p, _n, limit in rec.runs)  # a one-node lab needs no --limit
    # one reset per tier, external only where a connector runs, probing with the previous cell's prompt
    assert [(external, payload is not None) for _r, external, payload in fakes["resets"]] == [
        (False, True), (True, True), (True, True)
    ]  # fmt: skip
    order = [c.id for c in runner.plan(runner.lab.cells)[0].cells]
    methods = [_cell_json(runner, i)["cold_start"]["method"] for i in order]
    assert methods == ["restart", "reset", "restart", "reset", "restart", "reset"]
    first, second = _cell_json(runner, order[0]), _cell_json(runner, order[1])
    assert first["cold_start"]["reason"] == "first cell on the node"
    assert first.get("engines_kept") is True and "teardown" not in first["timings"]
    assert "reset" in second["timings"] and "deploy" not in second["timings"]
    assert second["engine_key"] == first["engine_key"] and second["node"] == "gpu01.lab.example"
    assert _cell_json(runner, order[2])["cold_start"]["reason"] == "the engine configuration changed"


def test_cold_start_restart_tears_down_every_cell(tmp_path: Path, fakes: dict[str, Any]) -> None:
    runner, rec = _runner(tmp_path, nodes=1, cold_start="restart")
    runner.run(provision=False)
    plays = rec.for_node("gpu01.lab.example")
    assert plays[:2] == ["deploy.yml:install,model,quiet", "teardown.yml"]
    cell = ["deploy.yml", "replay.yml+teardown"]
    assert plays[2:] == cell * 6 + ["teardown.yml:unquiet"]
    assert fakes["resets"] == []


def test_a_teardown_that_fails_at_the_end_of_the_replay_runs_again_on_its_own(
    tmp_path: Path, fakes: dict[str, Any]
) -> None:
    runner, rec = _runner(tmp_path, nodes=1, cold_start="restart")
    original = rec.run
    failed: list[str] = []

    def run(playbook: str, extravars: dict[str, Any] | None = None, **kw: Any) -> PlaybookResult:
        result = original(playbook, extravars, **kw)
        if result.playbook == "replay.yml+teardown" and not failed:
            failed.append(playbook)
            stop = TaskFailure("gpu01.lab.example", "Stop Caddy", "systemctl stop exited 1",
                               play=api.TEARDOWN_PLAY)  # fmt: skip
            raise PlaybookFailed(PlaybookResult("replay.yml", "failed", 2, {}, (stop,), Path("/nonexistent"),
                                                0.0, plays=result.plays))  # fmt: skip
        return result

    rec.run = run  # type: ignore[method-assign]
    outcome = runner.run(provision=False)
    assert not outcome.failed and len(outcome.done) == 6
    plays = rec.for_node("gpu01.lab.example")[2:]
    # the first cell's replay and collect were whole: it stands, and its teardown ran again on its own
    assert plays[:4] == ["deploy.yml", "replay.yml+teardown", "teardown.yml", "deploy.yml"]
    first = _cell_json(runner, runner.plan(runner.lab.cells)[0].cells[0].id)
    assert first["status"] == "done" and "teardown_error" not in first


def test_a_replay_from_a_host_of_another_node_leaves_the_teardown_to_its_own_run(
    tmp_path: Path, fakes: dict[str, Any]
) -> None:
    # the client is gpu01, a node: gpu02's replays reach it, so their runs must not stop its units
    runner, rec = _runner(tmp_path, nodes=2, cold_start="restart")
    doc = yaml.safe_load((tmp_path / "hosts.yml").read_text())
    doc["all"]["children"]["client"]["hosts"] = {"gpu01.lab.example": None}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    runner.lab = load_lab(tmp_path / "hosts.yml", tmp_path / "campaign.yml")
    assert not runner.run(provision=False).failed
    assert set(rec.for_node("gpu01.lab.example")[2:]) == {
        "deploy.yml",
        "replay.yml+teardown",
        "teardown.yml:unquiet",
    }
    assert set(rec.for_node("gpu02.lab.example")[2:]) == {"deploy.yml", "replay.yml", "teardown.yml",
                                                          "teardown.yml:unquiet"}  # fmt: skip


def test_a_failed_reset_falls_back_to_a_restart_and_says_why(tmp_path: Path, fakes: dict[str, Any]) -> None:
    fakes["fail_resets"] = 1
    runner, rec = _runner(tmp_path, nodes=1)
    runner.run(provision=False)
    plays = rec.for_node("gpu01.lab.example")[2:]
    # the first cell kept its engines for a reset that failed: the second stops them before its deploy
    assert plays[:5] == ["deploy.yml", "replay.yml", "teardown.yml", "deploy.yml", "replay.yml+teardown"]
    second = _cell_json(runner, runner.plan(runner.lab.cells)[0].cells[1].id)
    assert second["cold_start"]["method"] == "restart"
    assert second["cold_start"]["reason"].startswith("the reset failed: vllm-x-0: not cold after the reset")
    assert second["status"] == "done"


def test_two_nodes_run_their_groups_at_once_each_group_on_one_node(
    tmp_path: Path, fakes: dict[str, Any]
) -> None:
    runner, rec = _runner(tmp_path, nodes=2)
    outcome = runner.run(provision=False)
    assert len(outcome.done) == 6
    assert rec.overlap  # the nodes were in their playbooks at the same time
    nodes: dict[tuple[object, ...], set[str]] = {}
    for cell in runner.lab.cells:
        nodes.setdefault(group_key(cell), set()).add(_cell_json(runner, cell.id)["node"])
    assert all(len(n) == 1 for n in nodes.values()) and len(set().union(*nodes.values())) == 2
    assert [r for r in rec.runs if r[0] == "replay.yml:install"] == [
        ("replay.yml:install", "gpu01.lab.example", None)  # once, for the client
    ]
    for playbook, node, limit in rec.runs:
        if playbook == "replay.yml:install":
            continue
        playbook = playbook.split(":")[0].split("+")[0]
        hosts = set((limit or "").split(","))
        own = {node, "client01.lab.example"} if playbook == "replay.yml" else {node}
        assert hosts == own, (playbook, node, limit)
    # a node's install gathers its facts, its cells' deploys read them from the node's own cache
    for playbook, node, cache in rec.fact_caches:
        if playbook.startswith("deploy.yml"):
            assert cache is not None and Path(cache).name == node, (playbook, node, cache)
    assert not runner._facts_dir.exists()  # the run's facts are gone with the run
    # status.json: every cell of each node done, on the node that ran it, nothing queued or running
    status = json.loads(runner.results.paths.status_json.read_text())
    assert status["state"] == "done" and status["total"] == 6 and status["finished_at"] is not None
    # the run's estimate went in with the queues (the live page's ETA before any cell ends)
    assert set(status["estimate"]["cells"]) == {c.id for c in runner.lab.cells}
    for node, entry in status["nodes"].items():
        ran = {c.id for c in runner.lab.cells if _cell_json(runner, c.id)["node"] == node}
        assert {d["cell"] for d in entry["done"]} == ran and entry["failed"] == [] and entry["queued"] == []
        assert entry["cell"] is None and entry["phase"] == "finished"
    # campaign.json: the estimate made before the cells ran, and what they measured, phase by phase
    estimate = json.loads(runner.results.paths.campaign_json.read_text())["estimate"]
    assert set(estimate["cells"]) == {c.id for c in runner.lab.cells} and len(estimate["nodes"]) == 2
    measured = estimate["measured"]
    assert set(measured["phases"]) == {"install", "engine_start", "replay", "overhead"}
    assert measured["total_s"] > 0 and measured["phases"]["replay"] > 0


def test_schedule_balances_groups_and_keeps_tiers_together(tmp_path: Path) -> None:
    inv, camp = _lab_files(tmp_path, nodes=2)
    cells = load_lab(inv, camp).cells
    plans = schedule(cells, ["a", "b", "c"])
    assert [len(p.cells) for p in plans] == [3, 3, 0]
    for plan in plans[:2]:
        assert [c.tier for c in plan.cells] == ["gpu", "cpu", "nvme"] and plan.groups == 1
    # weighted: the heavier group goes first, to the first node
    heavy = schedule(cells, ["a", "b"], cost=lambda c: float(c.concurrency))
    assert {c.concurrency for c in heavy[0].cells} == {8}
    assert schedule(cells, ["a", "b"]) == schedule(cells, ["a", "b"])
    with pytest.raises(ValueError, match="at least one node"):
        schedule(cells, [])


def test_the_knee_search_ramps_on_one_set_of_engines_and_records_its_decisions(
    tmp_path: Path, fakes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import pandas as pd

    inv, camp = _lab_files(tmp_path, nodes=1)
    doc = yaml.safe_load(camp.read_text())
    doc.update(tiers=["gpu"], knee_search={"slo_p95_ttft_s": 1.0, "max_concurrency": 32})
    camp.write_text(yaml.safe_dump(doc))
    runner, rec = _runner_of(tmp_path, load_lab(inv, camp), inv)

    def measured(root: Path) -> pd.DataFrame:
        # a server whose later-round p95 TTFT is concurrency / 10 seconds: the SLO breaks above 10
        rows = []
        for done in (root / "cells").glob("*/DONE"):
            config = json.loads((done.parent / "cell.json").read_text())["config"]
            rows.append({**config, "status": "done", "steady_held": True,
                         "steady_ttft_later_p95_s": config["concurrency"] / 10,
                         "steady_later_cached_share": None})  # fmt: skip
        return pd.DataFrame(rows)

    monkeypatch.setattr("kvoffload.orchestrate.campaign.knee.campaign_summary", measured)
    outcome = runner.run(provision=False)
    assert not outcome.failed and len(outcome.done) == 2 + 4  # the campaign's 2, then 16, 12, 10, 11
    campaign = json.loads((runner.results.root / "campaign.json").read_text())
    (ramp,) = campaign["knee_search"]
    assert ramp["outcome"] == "bracketed" and ramp["bracket"] == [10, 11]
    assert [s["concurrency"] for s in ramp["steps"] if s["action"] == "try"] == [16, 12, 10, 11]
    # issue 43, defect 11: the knee search is timed apart from the cells the estimate's total covers
    ran = campaign["estimate"]["measured"]
    assert ran["knee_search"]["cells"] == 4 and campaign["timings"]["knee-search"] > 0
    assert ran["total_s"] == pytest.approx(ran["wall_s"] - campaign["timings"]["knee-search"], abs=0.002)
    plays = rec.for_node("gpu01.lab.example")[2:]
    # the campaign's two cells share engines; the ramp starts them once more and resets between steps
    assert plays == [
        "deploy.yml", "replay.yml", "replay.yml+teardown", "teardown.yml:unquiet",  # the campaign's
        "deploy.yml:install,model,quiet", "teardown.yml", "deploy.yml", *["replay.yml"] * 4,
        "teardown.yml:final",
    ]  # fmt: skip
    # a second run resumes: nothing runs again, the ramp re-derives the same bracket from the results
    rec.runs.clear()
    again = runner.run(provision=False)
    assert again.done == [] and len(again.skipped) == 6 and not again.failed
    assert rec.runs == []  # nothing to provision or install either
    assert json.loads((runner.results.root / "campaign.json").read_text())["knee_search"] == [ramp]


def test_a_stop_on_one_node_stops_the_other_and_both_tear_down(tmp_path: Path, fakes: dict[str, Any]) -> None:
    import json

    from kvoffload.playbook import PlaybookCanceled

    runner, rec = _runner(tmp_path, nodes=2)
    original = rec.run

    def run(playbook: str, extravars: dict[str, Any] | None = None, **kw: Any) -> PlaybookResult:
        ev = extravars or {}
        if (
            playbook == "replay.yml"
            and not kw.get("tags")
            and ev.get("kvoffload_node") == "gpu02.lab.example"
        ):
            raise PlaybookCanceled("playbook replay.yml stopped on request")
        return original(playbook, extravars, **kw)

    rec.run = run  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        runner.run(provision=False)
    statuses = {}
    for cell in runner.lab.cells:
        path = runner.results.cell_dir(cell) / "cell.json"
        if path.is_file():
            record = json.loads(path.read_text())
            statuses.setdefault(record["node"], []).append(record["status"])
    assert statuses["gpu02.lab.example"] == ["interrupted"]
    # the other node stopped too, before running all its cells, and tore its cell down
    assert len(statuses.get("gpu01.lab.example", [])) < 3
    for node in ("gpu01.lab.example", "gpu02.lab.example"):
        assert rec.for_node(node)[-1] == "teardown.yml:final", rec.for_node(node)
    status = json.loads(runner.results.paths.status_json.read_text())
    assert status["state"] == "interrupted"
    assert [f["status"] for f in status["nodes"]["gpu02.lab.example"]["failed"]] == ["interrupted"]


def test_software_is_read_once_per_node_and_copied_into_later_cells(
    tmp_path: Path, fakes: dict[str, Any]
) -> None:
    import json

    runner, rec = _runner(tmp_path, nodes=2, cold_start="restart")
    runner.run(provision=False)
    # nothing is installed after a node's first cell, so its collect alone reads the versions
    assert sorted(rec.software_reads) == ["gpu01.lab.example", "gpu02.lab.example"]
    for cell in runner.lab.cells:
        record = json.loads((runner.results.cell_dir(cell) / "cell.json").read_text())
        assert record["software"] == {record["node"]: {"packages": {"vllm": "1"}}}, cell.id


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_client_installs_after_the_nodes_and_before_every_replay(
    tmp_path: Path, fakes: dict[str, Any], nodes: int
) -> None:
    runner, rec = _runner(tmp_path, nodes=nodes)
    outcome = runner.run(provision=False)
    assert len(outcome.done) == 6 and not outcome.failed
    assert [r[0] for r in rec.runs].count("replay.yml:install") == 1
    (client,) = rec.when("installed replay.yml:install")
    nodes_installed = rec.when("installed deploy.yml:install")
    assert len(nodes_installed) == nodes and max(nodes_installed) <= client  # no two pip runs at once
    replays = rec.when("replay ")
    assert len(replays) == 6 and min(replays) >= client  # every replay waited for it
    # the first cell of a node deployed while the client installed: that wait is a phase of its own
    first = [_cell_json(runner, plan.cells[0].id) for plan in runner.plan(runner.lab.cells)]
    assert all("wait-client" in record["timings"] for record in first)
    assert {"install-client", "cells"} <= set(
        __import__("json").loads((runner.results.root / "campaign.json").read_text())["timings"]
    )


def test_a_client_that_is_also_a_node_host_installs_first_alone(
    tmp_path: Path, fakes: dict[str, Any]
) -> None:
    inv, camp = _lab_files(tmp_path, nodes=1)
    inventory = yaml.safe_load(inv.read_text())
    inventory["all"]["children"]["lb"]["hosts"] = {"client01.lab.example": None}  # Caddy on the client
    inv.write_text(yaml.safe_dump(inventory))
    lab = load_lab(inv, camp)
    runner = CampaignRunner(lab, inv, CampaignResults.open(tmp_path / "results", lab.campaign.name),
                            Progress(), wheel_cache=tmp_path / "cache")  # fmt: skip
    rec = Recorder()
    runner.playbooks = rec  # type: ignore[assignment]
    runner.wheels = Wheels(tmp_path / "kvoffload.whl", None)
    assert not runner.run(provision=False).failed
    assert all(units is None for _node, units in rec.journals)  # a done cell's teardown keeps none
    assert [p for p, _n, _l in rec.runs][:2] == ["replay.yml:install", "deploy.yml:install,model,quiet"]
    assert all("wait-client" not in _cell_json(runner, c.id)["timings"] for c in lab.cells)


def test_a_failed_client_install_fails_the_cells_and_the_nodes_still_tear_down(
    tmp_path: Path, fakes: dict[str, Any]
) -> None:
    _, rec = _run_with_a_failed_client_install(tmp_path, nodes=2)
    assert rec.when("replay ") == []  # nothing was replayed
    for node in ("gpu01.lab.example", "gpu02.lab.example"):
        assert rec.for_node(node)[-1] == "teardown.yml:unquiet", rec.for_node(node)
    # each failed cell's teardown kept every stopped unit's journal (its collect never ran)
    failed_teardowns = [units for _node, units in rec.journals if units is not None]
    assert failed_teardowns and set(failed_teardowns) == {"all"}


def test_each_node_replays_from_its_own_client_host_and_a_failed_install_fails_only_its_nodes(
    tmp_path: Path, fakes: dict[str, Any]
) -> None:
    runner, rec = _runner(tmp_path, nodes=2, clients=2)
    rec.fail_client_install = "client02.lab.example"
    outcome = runner.run(provision=False)
    assignment = runner.lab.client_assignment
    assert assignment == {
        "gpu01.lab.example": "client01.lab.example",
        "gpu02.lab.example": "client02.lab.example",
    }
    # Each client host installed on its own, limited to it.
    installs = sorted(limit or "" for p, _n, limit in rec.runs if p == "replay.yml:install")
    assert installs == ["client01.lab.example", "client02.lab.example"]
    plans = {p.node: [c.id for c in p.cells] for p in runner.plan(runner.lab.cells)}
    assert sorted(outcome.done) == sorted(plans["gpu01.lab.example"])
    assert sorted(outcome.failed) == sorted(plans["gpu02.lab.example"])
    assert all("client host client02.lab.example failed" in why for why in outcome.failed.values())
    # The replays of gpu01 ran from client01 only, and their cells say so.
    replays = [(n, limit) for p, n, limit in rec.runs if p.startswith("replay.yml") and ":install" not in p]
    assert replays and all(
        n == "gpu01.lab.example" and "client01.lab.example" in str(limit) for n, limit in replays
    )
    assert all("client02" not in str(limit) for _n, limit in replays)
    assert {_cell_json(runner, c)["client"] for c in outcome.done} == {"client01.lab.example"}
    for node in ("gpu01.lab.example", "gpu02.lab.example"):
        assert rec.for_node(node)[-1] == "teardown.yml:unquiet", rec.for_node(node)


def test_the_replay_progress_counts_the_datasets_requests_not_the_warmup(
    tmp_path: Path, fakes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvoffload.replay.command import WARMUP_REQUESTS

    @contextmanager
    def watcher(_targets: Any, on_update: Any, *_a: Any, **_k: Any) -> Iterator[None]:
        on_update(2)  # the replicas' finished requests: the warmup is still running
        on_update(WARMUP_REQUESTS + 40)  # every request of the dataset is done
        yield None

    monkeypatch.setattr(cell_run, "ReplayWatcher", watcher)
    runner, _rec = _runner(tmp_path, nodes=1)
    runner.expected_requests = lambda _cell: 40
    seen: list[tuple[int, int]] = []

    class Seen(Progress):
        def replay(self, done: int, expected: int) -> None:
            seen.append((done, expected))

    runner.progress = Seen()
    heard: list[tuple[str, int, int]] = []
    runner.status.replay = lambda node, done, expected: heard.append((node, done, expected))  # type: ignore[method-assign]
    assert not runner.run(provision=False).failed
    assert seen[:2] == [(0, 40), (40, 40)]
    # status.json hears the same counts, with the node
    assert heard[:2] == [("gpu01.lab.example", 0, 40), ("gpu01.lab.example", 40, 40)]


def test_the_replay_runs_collect_and_times_it_as_the_collect_phase() -> None:
    from kvoffload.orchestrate.cell.run import split_collect
    from kvoffload.orchestrate.playbooks_api import COLLECT_PLAY, TEARDOWN_PLAY

    result = PlaybookResult(
        "replay.yml", "successful", 0, {}, (), Path("/nonexistent"), 30.0,
        plays=(("Empty L2 of the reset's probes", 0.9), ("Replay the cell", 1.0), (COLLECT_PLAY, 27.5)),
    )  # fmt: skip
    assert result.seconds_from(COLLECT_PLAY) == 2.5 and result.seconds_from("no such play") is None
    timings = {"replay": 30.2}  # the phase: the playbook and the orchestrator's own work around it
    split_collect(timings, result, teardown_after=False)
    assert timings == {"replay": 27.7, "collect": 2.5}
    # with the teardown at its end: the teardown's plays are the cell's teardown phase
    ending = PlaybookResult(
        "replay.yml", "successful", 0, {}, (), Path("/nonexistent"), 30.0,
        plays=(("Replay the cell", 1.0), (COLLECT_PLAY, 27.5), (TEARDOWN_PLAY, 29.0)),
    )  # fmt: skip
    timings = {"replay": 30.2}
    split_collect(timings, ending, teardown_after=True)
    assert timings == {"replay": 27.7, "collect": 1.5, "teardown": 1.0}
    # the teardown's plays start (their tasks skipped) when no teardown was asked for: collect's time
    timings = {"replay": 30.2}
    split_collect(timings, ending, teardown_after=False)
    assert timings == {"replay": 27.7, "collect": 2.5}
    # collect.yml's first play is the one replay.yml imports under that name
    play = yaml.safe_load((ROOT / "playbooks" / "collect.yml").read_text())[0]
    assert play["name"] == COLLECT_PLAY
    imported = yaml.safe_load((ROOT / "playbooks" / "replay.yml").read_text())
    assert [p["ansible.builtin.import_playbook"] for p in imported[-2:]] == ["collect.yml", "teardown.yml"]
    assert imported[-1]["when"] == f"{api.TEARDOWN_AFTER_VAR} | default(false) | bool"
    # teardown.yml's first play is the one the teardown is timed from
    assert yaml.safe_load((ROOT / "playbooks" / "teardown.yml").read_text())[0]["name"] == TEARDOWN_PLAY


def test_unit_states_and_software_from_the_runs_events_land_where_the_collect_role_writes_them(
    tmp_path: Path,
) -> None:
    from kvoffload.orchestrate.cell.record import host_software, unit_states, write_collected

    state = {"Id": "kvoffload-vllm@0.service", "LoadState": "loaded", "NRestarts": "2", "Result": "success"}
    software = {
        "host": "gpu01.lab.example",
        "groups": ["lb", "lmcache", "vllm"],
        "packages": {"caddy": "2.6.2-5"},
        "python": {"/opt/kvoffload/venv": {"kvoffload-lab": "0.1.0"}},
        "gpu": {},
    }
    result = PlaybookResult(
        "replay.yml", "successful", 0, {}, (), Path("/nonexistent"), 1.0,
        unit_states={"gpu01.lab.example": {"kvoffload-vllm@0.service": state}, "client01.lab.example": {}},
        software={"gpu01.lab.example": software},
    )  # fmt: skip
    write_collected(CellPaths(tmp_path), result)
    written = json.loads((tmp_path / "units" / "gpu01.lab.example.json").read_text())
    assert written == {"host": "gpu01.lab.example", "units": {"kvoffload-vllm@0.service": state}}
    assert unit_states(CellPaths(tmp_path)) == {
        "gpu01.lab.example--kvoffload-vllm@0.service": {**state, "host": "gpu01.lab.example"}
    }
    assert json.loads((tmp_path / "software" / "gpu01.lab.example.json").read_text()) == software
    assert host_software(tmp_path / "software")  # what cell.json `software` is read from
    # the role's own writes are off in the orchestrator's runs (the files above replace them)
    defaults = yaml.safe_load((ROOT / "roles/collect/defaults/main.yml").read_text())
    assert defaults["collect_units_to_controller"] is True
    assert defaults["collect_software_to_controller"] is True


def test_the_fetched_cell_folder_is_unpacked_where_the_replay_role_would(tmp_path: Path) -> None:
    import subprocess

    from kvoffload.orchestrate.cell.record import unpack_fetched

    # the role's controller tarball is the path CellPaths names (the orchestrator unpacks it)
    role_vars = yaml.safe_load((ROOT / "roles/replay/vars/main.yml").read_text())
    assert role_vars["_replay_controller_archive"] == (
        "{{ replay_controller_dir }}/.fetched-{{ replay_cell_id }}.tar.gz"
    )
    client = tmp_path / "client" / "c1"
    (client / "metrics").mkdir(parents=True)
    (client / "requests.jsonl").write_text('{"id": 1}\n')
    (client / "metrics" / "samples.jsonl").write_text("{}\n")
    cell_dir = tmp_path / "results" / "c1"
    cell_dir.mkdir(parents=True)
    (cell_dir / "cell.json").write_text("{}\n")
    paths = CellPaths(cell_dir)
    archive = paths.fetched_archive
    assert archive == cell_dir / ".fetched-c1.tar.gz"
    pack = ["tar", "--create", "--gzip", "--file", str(archive), "--directory", str(client), "."]
    subprocess.run(pack, check=True)
    unpack_fetched(paths)
    assert (cell_dir / "requests.jsonl").read_text() == '{"id": 1}\n'
    assert (cell_dir / "metrics" / "samples.jsonl").is_file() and (cell_dir / "cell.json").is_file()
    assert not archive.exists()
    unpack_fetched(paths)  # nothing fetched (a replay that failed before its fetch): nothing to do
    archive.write_bytes(b"not a tarball")
    with pytest.raises(RuntimeError, match=r"unpacking .*fetched-c1\.tar\.gz failed"):
        unpack_fetched(paths)


@pytest.mark.parametrize("cold_start", ["reset", "restart"])
def test_each_nvme_cell_records_the_trim_after_the_last_wipe_before_its_replay(
    tmp_path: Path, fakes: dict[str, Any], cold_start: str
) -> None:
    runner, rec = _runner(tmp_path, nodes=1, cold_start=cold_start)
    runner.run(provision=False)
    order = [c for c in runner.plan(runner.lab.cells)[0].cells]
    trims = {c.tier: [] for c in order}  # type: dict[str, list[Any]]
    for c in order:
        trims[c.tier].append(_cell_json(runner, c.id).get("l2_trim", "absent"))
    assert trims["gpu"] == trims["cpu"] == ["absent", "absent"]  # no L2: no such key
    first, second = trims["nvme"]
    assert first is None  # nothing wiped an L2 in this run before the first nvme cell
    runs = [p for p, _n, _l in rec.runs]
    if cold_start == "reset":
        # the second cell keeps the engines: its replay run cleared L2 after the reset without a trim
        # (a whole-drive trim right before a replay), so its trim is the first cell's collect's, at the
        # end of that cell
        assert runs[-2:] == ["replay.yml+clear-l2+teardown", "teardown.yml:unquiet"]
        assert second["message"].endswith(
            "replay.yml+clear-l2-next Empty L2 for the next cell, which keeps these engines"
        )
    else:
        # restart: the first cell's replay ended with the teardown, whose wipe the second cell follows
        assert second["message"].endswith(f"replay.yml+teardown {api.TEARDOWN_PLAY}")
        assert second["message"].split()[0] == str(len(runs) - 3)  # the first cell's replay (1-based)
    assert second["outcome"] == "trimmed"


def test_a_cell_that_does_not_start_cold_fails_says_why_and_is_torn_down(
    tmp_path: Path, fakes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    hot = ColdCheck(False, {}, ("vllm-gpu01-0: 3 prefix-cache hits before any traffic",), ())
    monkeypatch.setattr(cell_run, "check_cold", lambda _t: hot)
    runner, rec = _runner(tmp_path, nodes=1, cold_start="restart")
    outcome = runner.run(provision=False)
    assert not outcome.done and len(outcome.failed) == 6
    why = "cell did not start cold: vllm-gpu01-0: 3 prefix-cache hits before any traffic"
    assert set(outcome.failed.values()) == {f"failed: {why}"}  # the display's text
    # no replay ran; each cell's engines were stopped after its deploy
    assert rec.for_node("gpu01.lab.example")[2:] == ["deploy.yml", "teardown.yml"] * 6 + [
        "teardown.yml:unquiet"
    ]
    for cell in runner.lab.cells:
        record = _cell_json(runner, cell.id)
        assert (record["status"], record["error"]) == ("failed", why)
        assert record["cold_start"]["cold"] is False and record["cold_start"]["problems"] == list(
            hot.problems
        )
        assert "engines_kept" not in record and record["faults"] == [] and record["units"] == {}
        assert {"deploy", "cold-check", "teardown", "total"} <= set(record["timings"])
        assert not (runner.results.cell_dir(cell) / "DONE").exists()


def test_a_unit_that_systemd_restarted_while_the_deploy_started_it_is_no_fault_of_the_cell(
    tmp_path: Path, fakes: dict[str, Any]
) -> None:
    # kvoffload_start_units: Caddy's first start failed, systemd started it again (NRestarts 1) and it
    # answered; the collect after the replay reads NRestarts 1 still. Only a restart after the deploy
    # would be the cell's; the record says that the deploy saw one.
    runner, rec = _runner(tmp_path, nodes=1, cold_start="restart")
    node, caddy = "gpu01.lab.example", "kvoffload-caddy.service"
    played = rec.run

    def run(playbook: str, extravars: dict[str, Any] | None = None, **kw: Any) -> PlaybookResult:
        result = played(playbook, extravars, **kw)
        cell = next((c for c in runner.lab.cells if c.id == (extravars or {}).get("replay_cell_id")), None)
        if playbook == "deploy.yml" and not kw.get("tags"):
            return replace(result, start_restarts={node: {caddy: 1}})
        if playbook == "replay.yml" and not kw.get("tags") and cell is not None:
            units = {
                key.split("--", 1)[1]: {"ActiveState": "active", "NRestarts": "1" if caddy in key else "0"}
                for key in runner.plan_of(cell, node).units
            }
            return replace(result, unit_states={node: units})
        return result

    rec.run = run  # type: ignore[method-assign]
    assert runner.run(provision=False).done
    with_caddy = [c for c in runner.lab.cells if f"{node}--{caddy}" in runner.plan_of(c, node).units]
    assert with_caddy
    for cell in with_caddy:
        record = _cell_json(runner, cell.id)
        assert record["faults"] == [] and record["valid"] is True, record["faults"]
        assert record["cold_start"]["deploy_restarts"] == {f"{node}--{caddy}": 1}
