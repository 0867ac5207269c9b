"""The cell-free pair check on a lab (kvoffload/orchestrate/checks/cellfree.py) and its place in the
doctor (kvoffload/orchestrate/checks/doctor.py run_doctor, the `doctor` command), with the playbooks replaced
by tests/unit/orchestrate/test_doctor.py's fake, which answers doctor_pair.yml with the node script's
answer recorded on a real systemd host (tests/fixtures/doctor/pair-cellfree)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvoffload.config import load_lab
from kvoffload.doctor import checks as dc
from kvoffload.orchestrate.checks import doctor
from kvoffload.orchestrate.checks.cellfree import NODE_SCRIPT, PLAYBOOK, PairCellFree, pair_args
from kvoffload.playbook import PlaybookFailed, PlaybookResult
from kvoffload.playbook.runner import TaskFailure
from tests.unit.orchestrate.test_doctor import (
    CLIENT,
    GPU1,
    GPU2,
    PAIR_OK,
    FakeRunner,
    _answer,
    _doctor_lab,
    _lab_files,
)

VENV = "/opt/kvoffload/venv"


def test_each_host_is_asked_its_build_chunk_and_l2_mount() -> None:
    assert pair_args(VENV, "cuda", 256, "/mnt/kvoffload-nvme/lmcache-l2") == [
        "--venv", VENV, "--mode", "gpu", "--chunk-size", "256", "--l2-parent", "/mnt/kvoffload-nvme",
    ]  # fmt: skip
    # vLLM's CPU build: its LMCache has no accelerator, the bench keeps its KV in host memory
    assert pair_args(VENV, "cpu", 256, None) == ["--venv", VENV, "--mode", "cpu", "--chunk-size", "256"]


class _Failing:
    """doctor_pair.yml failing on one host before its answer came back (the others answer)."""

    def __init__(self, failed: str) -> None:
        self.failed = failed
        self.extravars: dict[str, Any] = {}

    def run(self, playbook: str, extravars: Any = None, *, ident: str | None = None) -> PlaybookResult:
        self.extravars = dict(extravars)
        for host in extravars["doctor_pair_args"]:
            if host != self.failed:
                (Path(extravars["doctor_pair_dest"]) / f"{host}.json").write_text(json.dumps(PAIR_OK))
        failure = TaskFailure(self.failed, "Run the pair as two transient units", "non-zero return code")
        raise PlaybookFailed(PlaybookResult(playbook, "failed", 2, {}, (failure,), Path("/nonexistent"), 1.0))


def test_the_answers_come_back_per_host_and_a_failed_host_says_where(tmp_path: Path) -> None:
    runner = _Failing(GPU2)
    asked = {GPU1: pair_args(VENV, "cuda", 256, None), GPU2: pair_args(VENV, "cuda", 256, None)}
    found = PairCellFree(runner, tmp_path)(asked)
    assert found[GPU1] == PAIR_OK
    assert found[GPU2] == {
        "stage": "playbook",
        "error": "failed at 'Run the pair as two transient units': non-zero return code",
    }
    assert runner.extravars["doctor_pair_script"] == str(NODE_SCRIPT) and NODE_SCRIPT.is_file()
    assert runner.extravars["doctor_pair_args"] == asked
    assert PairCellFree(runner, tmp_path)({}) == {}  # nothing asked, no playbook


def test_the_doctor_runs_it_on_ready_pair_nodes_and_keeps_their_answers(tmp_path: Path) -> None:
    lab = load_lab(*_lab_files(tmp_path))
    answers = {GPU1: _answer(), GPU2: _answer(device_files="/dev/nvidia-uvm (missing)"), CLIENT: _answer()}
    runner = FakeRunner(answers)
    out = tmp_path / "out"
    reports = doctor.run_doctor(lab, runner, out, hosts_python="3.11.2", pair_check=PairCellFree(runner, out))
    pair_runs = [c for c in runner.calls if c[0] == PLAYBOOK]
    # only the node that fails no blocker is asked: a CUDA build, the campaign's chunk size, its L2 mount
    assert [c[1]["doctor_pair_args"] for c in pair_runs] == [
        {GPU1: ["--venv", VENV, "--mode", "gpu", "--chunk-size", "256", "--l2-parent", "/mnt/kvoffload-nvme"]}
    ]
    pair = {r.host: {c.name: c for c in r.checks}["pair_cellfree"] for r in reports}
    assert pair[GPU1].status == dc.Status.OK and pair[GPU1].facts["byte_exact"] is True
    assert (pair[GPU2].status, pair[GPU2].detail) == (
        dc.Status.SKIP,
        "not run: device_files failed (provisioning would refuse the host); fix it first",
    )
    assert pair[CLIENT].detail == "no vLLM/LMCache pair on this host"
    assert json.loads((out / doctor.PAIR_JSON).read_text()) == {GPU1: PAIR_OK}
    # without the smoke, its check still says why it did not run; with `run`'s cheap checks neither runs
    smoke = {r.host: {c.name: c for c in r.checks}["smoke_pair"] for r in reports}
    assert smoke[GPU1].detail.endswith("not run: --no-smoke")
    cheap = doctor.run_doctor(lab, FakeRunner(answers), tmp_path / "o2", hosts_python="3.11.2", cheap=True)
    cheap_pair = {r.host: {c.name: c for c in r.checks}["pair_cellfree"] for r in cheap}
    assert (
        cheap_pair[GPU1].detail
        == "not run: `run`'s cheap checks leave it out (`kvoffload-lab doctor` makes it)"
    )


def test_a_failed_pair_check_fails_the_node(tmp_path: Path) -> None:
    lab = load_lab(*_lab_files(tmp_path))
    bad = json.loads(
        (
            Path(__file__).resolve().parents[2] / "fixtures/doctor/pair-cellfree/cpu-server-af-unix-only.json"
        ).read_text()
    )
    answers = {GPU1: _answer(), GPU2: _answer(), CLIENT: _answer()}
    runner = FakeRunner(answers, pair_answers={GPU2: bad})
    reports = {
        r.host: r
        for r in doctor.run_doctor(
            lab,
            runner,
            tmp_path / "out",
            hosts_python="3.11.2",
            pair_check=PairCellFree(runner, tmp_path / "out"),
        )
    }
    assert reports[GPU1].status == dc.Status.OK
    assert [c.name for c in reports[GPU2].failed] == ["pair_cellfree"]
    assert reports[GPU2].failed[0].detail.startswith("server: the server unit is inactive before it answered")


@pytest.mark.parametrize("flag", [None, "--no-pair-check"])
def test_the_doctor_command_runs_it_by_default_for_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str | None
) -> None:
    from kvoffload.cli.main import main

    inv, camp, runner = _doctor_lab(tmp_path, monkeypatch)
    results = tmp_path / "results"
    argv = ["doctor", str(inv), "--campaign", str(camp), "--results", str(results), "--no-smoke", "--json"]
    assert main([*argv, *([flag] if flag else [])]) == 0
    record = json.loads((results / "doc" / "doctor.json").read_text())
    pair = {h["host"]: next(c for c in h["checks"] if c["name"] == "pair_cellfree") for h in record["hosts"]}
    asked = [c[1]["doctor_pair_args"] for c in runner.calls if c[0] == PLAYBOOK]
    if flag is None:
        assert asked == [
            {GPU1: pair_args(VENV, "cuda", 256, "/mnt/kvoffload-nvme/lmcache-l2")}
            | {GPU2: pair_args(VENV, "cuda", 256, "/mnt/kvoffload-nvme/lmcache-l2")}
        ]
        assert pair[GPU1]["status"] == pair[GPU2]["status"] == "ok"
        assert "not exercised on a CPU build" in pair[GPU1]["detail"]  # the recorded answer is a CPU build's
    else:
        assert asked == []
        assert pair[GPU1] == {"name": "pair_cellfree", "status": "skip", "detail": "not run: --no-pair-check"}
