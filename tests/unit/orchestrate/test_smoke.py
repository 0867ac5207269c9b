"""The smoke check's bring-up on a lab (kvoffload/orchestrate/checks/round_trip.py PairSmoke) with the
playbooks
replaced by a recording fake and the servers by recorded answers (tests/unit/doctor/test_doctor_smoke.py
`Servers`), and its place in the doctor's verdicts (kvoffload/orchestrate/checks/doctor.py run_doctor)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kvoffload.config import load_lab
from kvoffload.doctor import checks as dc
from kvoffload.orchestrate.campaign.runner import CampaignRunner
from kvoffload.orchestrate.checks import doctor
from kvoffload.orchestrate.checks.round_trip import PairSmoke, offload_cell, pair_of
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from kvoffload.orchestrate.results import CampaignResults
from kvoffload.playbook import PlaybookFailed, PlaybookResult
from kvoffload.playbook.runner import TaskFailure
from tests.unit.doctor.test_doctor_smoke import Servers
from tests.unit.orchestrate.test_doctor import (
    CLIENT,
    GPU1,
    GPU2,
    FakeRunner,
    _answer,
    _doctor_lab,
    _lab_files,
    _Progress,
)


class Playbooks:
    """Records each playbook run; `fail`: (playbook, tags or skip tags) -> the failing task."""

    def __init__(self, fail: dict[tuple[str, str], str] | None = None) -> None:
        self.runs: list[dict[str, Any]] = []
        self.fail = fail or {}

    def run(self, playbook: str, extravars: Any = None, **kw: Any) -> PlaybookResult:
        tags = ",".join(kw.get("tags") or kw.get("skip_tags") or ())
        self.runs.append({"playbook": playbook, "extravars": dict(extravars or {}), **kw})
        result = PlaybookResult(playbook, "successful", 0, {}, (), Path("/nonexistent"), 1.0)
        task = self.fail.get((playbook, tags))
        if task is not None:
            failed = PlaybookResult(
                playbook, "failed", 2, {}, (TaskFailure(GPU1, task, "boom"),), Path("/nonexistent"), 1.0
            )
            raise PlaybookFailed(failed)
        return result


def _smoke(tmp_path: Path, playbooks: Playbooks, servers: Servers | None) -> tuple[PairSmoke, Any]:
    lab = load_lab(*_lab_files(tmp_path))
    results = CampaignResults.open(tmp_path / "results", lab.campaign.name)
    runner = CampaignRunner(lab, Path("hosts.yml"), results, _Progress(), wheel_cache=tmp_path / "w")
    runner.wheels = Wheels(tmp_path / "pkg.whl", None)
    runner.playbooks = playbooks  # type: ignore[assignment]
    transport = httpx.MockTransport(servers or Servers())
    return PairSmoke(runner, tmp_path / "smoke", httpx.Client(transport=transport)), lab


def test_each_node_installs_starts_one_replica_checks_and_stops(tmp_path: Path) -> None:
    playbooks = Playbooks()
    # gpu01's first replica (index 0) and its lmcache-server, at the addresses the sampler reads
    servers = Servers(replica="http://192.0.2.11:8000", cache="http://192.0.2.11:8080")
    smoke, lab = _smoke(tmp_path, playbooks, servers)
    found = smoke([GPU1], None)
    assert found[GPU1].get("error") is None, found
    assert found[GPU1]["ranks"] == 1  # gpus "0": one rank
    assert dc.smoke_pair(None, "vllm", True, found[GPU1]).status == dc.Status.OK
    steps = [(r["playbook"], r.get("tags"), r.get("skip_tags"), r.get("limit")) for r in playbooks.runs]
    node = ",".join(lab.node_hosts(lab.node(GPU1)))
    assert steps == [
        ("preflight.yml", None, None, None),
        ("provision.yml", None, None, None),
        ("deploy.yml", ("install", "model"), None, node),
        ("deploy.yml", None, ("install", "model", "quiet"), node),
        ("teardown.yml", None, ("unquiet",), node),
    ]
    deploy = playbooks.runs[3]["extravars"]
    # the campaign's first offload cell, narrowed to the pair: one replica, no Caddy, dev mode
    cell = offload_cell(lab)
    assert cell is not None and cell.tier == "cpu" and found[GPU1]["cell"] == cell.id
    assert deploy["kvoffload_tier"] == "cpu" and deploy["lmcache_server_enabled"] is True
    assert deploy["vllm_replicas"] == [{"index": 0, "gpus": "0"}]
    assert deploy["caddy_enabled"] is False
    assert deploy["vllm_env"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert "LMCacheMPConnector" in " ".join(deploy["vllm_engine_args"])
    # no cheap gate after provisioning: the doctor judged the hosts itself
    assert not any(r["playbook"] == doctor.PLAYBOOK for r in playbooks.runs)
    # what the vllm role writes for that one replica: dev mode and the connector to this node's server
    from tests.unit.roles.render import render, role_defaults

    env = render(
        "vllm",
        "etc/kvoffload/vllm/replica.env.j2",
        {
            **role_defaults("vllm"),
            **deploy,
            "ansible_host": "192.0.2.11",
            "replica": deploy["vllm_replicas"][0],
        },
    )
    assert "VLLM_SERVER_DEV_MODE='1'" in env.splitlines() and "KVOFFLOAD_PORT='8000'" in env.splitlines()
    assert '\\"lmcache.mp.host\\":\\"tcp://192.0.2.11\\",\\"lmcache.mp.port\\":5555' in env


def test_the_pair_expects_one_registration_per_tensor_parallel_rank(tmp_path: Path) -> None:
    inv, camp = _lab_files(tmp_path)
    inventory = yaml.safe_load(inv.read_text())
    # gpu01's first replica spans two GPUs: two ranks, each registering with lmcache-server on its own
    inventory["all"]["hosts"][GPU1]["vllm_replicas"] = [
        {"index": 0, "gpus": "0,1"},
        {"index": 1, "gpus": "2"},
    ]
    inv.write_text(yaml.safe_dump(inventory))
    lab = load_lab(inv, camp)
    targets = [
        {"name": "vllm-gpu01.lab.example-0", "url": "http://192.0.2.11:8000/metrics"},
        {"name": "lmcache", "url": "http://192.0.2.11:8080/metrics"},
    ]
    pair = pair_of({"replay_metrics_targets": targets}, lab, GPU1, 256)
    assert (pair.replica, pair.lmcache, pair.ranks) == ("http://192.0.2.11:8000", "http://192.0.2.11:8080", 2)


@pytest.mark.parametrize(
    ("fail", "stage"),
    [
        (("deploy.yml", "install,model"), "install"),
        (("deploy.yml", "install,model,quiet"), "start"),
    ],
)
def test_a_failed_bring_up_is_named_and_the_node_is_still_stopped(
    tmp_path: Path, fail: tuple[str, str], stage: str
) -> None:
    playbooks = Playbooks({fail: "Wait for replica 0 healthy"})
    smoke, _lab = _smoke(tmp_path, playbooks, None)
    found = smoke([GPU1], None)[GPU1]
    assert found["stage"] == stage and "Wait for replica 0 healthy" in found["error"]
    assert playbooks.runs[-1]["playbook"] == "teardown.yml"
    verdict = dc.smoke_pair(None, "vllm", True, found)
    assert verdict.status == dc.Status.FAIL and verdict.detail.startswith(f"{stage}: ")


def test_a_failed_stop_is_kept_and_a_failed_provision_stops_every_node(tmp_path: Path) -> None:
    servers = Servers(replica="http://192.0.2.11:8000", cache="http://192.0.2.11:8080")
    smoke, _lab = _smoke(tmp_path, Playbooks({("teardown.yml", "unquiet"): "Stop the cell's units"}), servers)
    left = smoke([GPU1], None)[GPU1]
    assert "Stop the cell's units" in left["stop_error"]
    assert dc.smoke_pair(None, "vllm", True, left).status == dc.Status.WARN
    (tmp_path / "b").mkdir()
    smoke, _lab = _smoke(tmp_path / "b", Playbooks({("provision.yml", ""): "Install node-exporter"}), None)
    found = smoke([GPU1, GPU2], None)
    assert {n: f["stage"] for n, f in found.items()} == {GPU1: "provision", GPU2: "provision"}
    # a wheelhouse that cannot be built: every node's check says why, the doctor's record still comes out
    from kvoffload.errors import UserError

    def no_index() -> None:
        raise UserError("building the wheelhouse: pip download failed: no route to pypi.org")

    smoke.runner.wheels = None
    smoke.runner.prepare_wheelhouse = no_index  # type: ignore[method-assign]
    found = smoke([GPU1], "3.12.3")
    assert found[GPU1]["stage"] == "wheelhouse" and "no route to pypi.org" in found[GPU1]["error"]
    assert smoke.runner.hosts_python == "3.12.3"  # the Python the probes reported: no second asking


def test_the_doctor_runs_the_smoke_on_ready_nodes_only(tmp_path: Path) -> None:
    """A node that fails another check is not smoke-checked (it would fail for the same reason); the
    smoke's facts land in doctor/smoke.json and its verdict in the node's report."""
    lab = load_lab(*_lab_files(tmp_path))
    answers = {GPU1: _answer(), GPU2: _answer(device_files="/dev/nvidia-uvm (missing)"), CLIENT: _answer()}
    asked: list[tuple[list[str], str | None]] = []
    stop = {"node": GPU1, "stage": "start", "error": "replica 0 exited"}

    def smoke(nodes: Any, hosts_python: str | None) -> dict[str, Any]:
        asked.append((list(nodes), hosts_python))
        return {GPU1: stop}

    out = tmp_path / "out"
    reports = doctor.run_doctor(
        lab, FakeRunner(answers), out, hosts_python=None, learn_python=True, smoke=smoke
    )
    assert asked == [([GPU1], "3.11.2")]  # the Python the hosts reported: the wheelhouse's
    pair = {r.host: {c.name: c for c in r.checks}["smoke_pair"] for r in reports}
    assert (pair[GPU1].status, pair[GPU1].detail) == (dc.Status.FAIL, "start: replica 0 exited")
    assert pair[GPU2].status == dc.Status.SKIP and pair[GPU2].detail.endswith(
        "not run: device_files failed (provisioning would refuse the host); fix it first"
    )
    assert pair[CLIENT].detail == "no vLLM/LMCache pair on this host"
    assert json.loads((out / doctor.SMOKE_JSON).read_text()) == {GPU1: stop}
    # the simulator has no pair: the smoke is never asked
    (tmp_path / "sim").mkdir()
    sim = load_lab(*_lab_files(tmp_path / "sim", engine="sim"))
    doctor.run_doctor(sim, FakeRunner(answers), tmp_path / "o2", hosts_python="3.11.2", smoke=smoke)
    assert len(asked) == 1 and not (tmp_path / "o2" / doctor.SMOKE_JSON).exists()


def test_the_doctor_command_runs_the_smoke_by_default_for_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvoffload.cli.main import main
    from tests.unit.doctor.test_doctor_smoke import trip

    inv, camp, _ = _doctor_lab(tmp_path, monkeypatch)
    built: list[tuple[CampaignRunner, Path]] = []
    facts = {GPU1: trip(Servers()), GPU2: {"node": GPU2, "stage": "install", "error": "no wheel for torch"}}

    class FakeSmoke:
        def __init__(self, runner: CampaignRunner, out: Path) -> None:
            built.append((runner, out))

        def __call__(self, nodes: Any, hosts_python: str | None) -> dict[str, Any]:
            return {n: facts[n] for n in nodes}

    monkeypatch.setattr("kvoffload.orchestrate.checks.round_trip.PairSmoke", FakeSmoke)
    results = tmp_path / "results"
    argv = ["doctor", str(inv), "--campaign", str(camp), "--results", str(results), "--json"]
    argv += ["--wheel-cache", str(tmp_path / "wheels")]
    assert main(argv) == 1  # gpu02's install failed
    record = json.loads(capsys.readouterr().out)
    pair = {h["host"]: {c["name"]: c for c in h["checks"]}["smoke_pair"] for h in record["hosts"]}
    assert pair[GPU1]["status"] == "ok" and pair[GPU1]["facts"]["stored_chunks"] == 147
    assert (pair[GPU2]["status"], pair[GPU2]["detail"]) == ("fail", "install: no wheel for torch")
    [(runner, out)] = built
    assert runner.wheel_cache == tmp_path / "wheels" and runner.offline is True
    assert out == results / "doc" / doctor.DOCTOR_DIR / "smoke"
    # --no-smoke: no runner is built, the pair check says it did not run
    assert main([*argv, "--no-smoke"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(built) == 1
    [gpu1] = [h for h in record["hosts"] if h["host"] == GPU1]
    skipped = {c["name"]: c for c in gpu1["checks"]}["smoke_pair"]
    assert skipped["status"] == "skip" and skipped["detail"].endswith("not run: --no-smoke")
